import { ConflictError, MetadataError, Orbax2RegError } from "../errors.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { mapLimited } from "../util/budget.js";
import {
  assemblePlan,
  type GroupPlan,
  MAX_PLAN_HEAD_BYTES,
  type Plan,
  type PlanHead,
  type PlanIdentity,
  parseGroupPart,
  parsePlan,
  planHead,
  planIdentity,
  planParts,
} from "./plan-format.js";
import { CLAIM_KEY, commitPartKey, groupPartKey, PLAN_KEY, planPartsDir } from "./work-dir.js";

/**
 * Who holds a destination step: the conversion whose plan is on record in `<step>/.orbax2reg/plan.json`.
 * A plan is put on record only where none is (create-if-absent, so of two conversions racing for one
 * step exactly one wins), or by `--force`, which replaces it and clears the step. Writers and finalize
 * carry their plan's id; finalize commits only while that plan is still the one on record.
 */

export type Claim =
  /** Our plan is now on record: a fresh conversion. */
  | { readonly kind: "new"; readonly plan: Plan }
  /** The same conversion (same source and options) was already on record: resume it, under its id. */
  | { readonly kind: "resumed"; readonly plan: Plan; readonly committed: boolean };

const encoder = new TextEncoder();
const decoder = new TextDecoder();
/** Plan parts written or read at once. */
const PART_CONCURRENCY = 8;

/** The head of the plan on record for the step, or undefined; a plan this orbax2reg cannot read is another conversion's. */
export async function planOnRecord(destination: Store, stepDir: string): Promise<PlanHead | undefined> {
  const key = joinKey(stepDir, PLAN_KEY);
  if ((await destination.stat(key)) === undefined) return undefined;
  const text = decoder.decode(await destination.read(key));
  try {
    return parsePlan(text, describe(destination, key));
  } catch (e) {
    if (!(e instanceof Orbax2RegError)) throw e;
    throw new ConflictError(`the destination step holds a plan this orbax2reg cannot use (${e.detail}); --force starts over`, {
      path: describe(destination, key),
    });
  }
}

/**
 * The id and source of the plan on record for the step (any version), or undefined when there is none: what
 * ownership checks and retention compare. Reads the head only up to MAX_PLAN_HEAD_BYTES; a larger or
 * unreadable one says nothing (both undefined).
 */
export async function planIdentityOnRecord(destination: Store, stepDir: string): Promise<PlanIdentity | undefined> {
  const key = joinKey(stepDir, PLAN_KEY);
  const info = await destination.stat(key);
  if (info === undefined) return undefined;
  if (info.size > MAX_PLAN_HEAD_BYTES) return { id: undefined, source: undefined };
  // Ranged to the size seen, so a head replaced meanwhile by a larger object is still read bounded (and fails to parse).
  return planIdentity(decoder.decode(await destination.readRange(key, 0, info.size)));
}

/** Group `group` of the plan whose head is `head`: reads only that group's part. */
export async function readGroupPlan(destination: Store, head: PlanHead, group: number): Promise<GroupPlan> {
  const key = joinKey(head.destination.stepDir, groupPartKey(head.id, group));
  if ((await destination.stat(key)) === undefined) {
    throw new MetadataError(`plan ${head.id} has no part for group ${group}; run \`orbax2reg plan\` again`, {
      path: describe(destination, key),
    });
  }
  return parseGroupPart(head, group, decoder.decode(await destination.read(key)), describe(destination, key));
}

/** The whole plan whose head is `head` (finalize, retreat): every part, read a few at a time. */
export async function readPlan(destination: Store, head: PlanHead): Promise<Plan> {
  const stepDir = head.destination.stepDir;
  const groups = await mapLimited(
    head.groups.map((_, g) => g),
    PART_CONCURRENCY,
    (g) => readGroupPlan(destination, head, g),
  );
  const key = joinKey(stepDir, commitPartKey(head.id));
  return assemblePlan(head, decoder.decode(await destination.read(key)), describe(destination, key), groups);
}

/**
 * Writes the parts of `plan` under plan id `id` (its own, or the identical plan on record's), the commit
 * part last: a plan whose commit part is there has all its parts. Only the plan's owner writes them, after
 * its head is on record (a conversion that lost the race writes nothing into the step).
 */
async function writeParts(destination: Store, plan: Plan, id = plan.id): Promise<void> {
  const stepDir = plan.destination.stepDir;
  const parts: { key: string; pieces: Iterable<string> }[] = [];
  const write = async (p: { key: string; pieces: Iterable<string> }) => destination.write(joinKey(stepDir, p.key), await body(p.pieces));
  const flush = () => mapLimited(parts.splice(0), PART_CONCURRENCY, write);
  let commit: { key: string; pieces: Iterable<string> } | undefined;
  for (const p of planParts(id === plan.id ? plan : { ...plan, id })) {
    if (commit !== undefined) parts.push(commit);
    commit = p;
    if (parts.length >= PART_CONCURRENCY) await flush();
  }
  await flush();
  if (commit !== undefined) await write(commit);
}

/** A part's text this large or more is streamed to the store, not encoded into one buffer. */
const STREAM_PART_BYTES = 8 << 20;

/**
 * The body of a part from its text's pieces: one buffer when small (one simple upload to GCS), else a stream
 * of its encoded pieces (a part of 520k objects is 105 MB).
 */
async function body(pieces: Iterable<string>): Promise<Uint8Array | AsyncIterable<Uint8Array>> {
  const it = pieces[Symbol.iterator]();
  const head: Uint8Array[] = [];
  let size = 0;
  for (let r = it.next(); !r.done; r = it.next()) {
    const bytes = encoder.encode(r.value);
    head.push(bytes);
    size += bytes.length;
    if (size >= STREAM_PART_BYTES) {
      return (async function* () {
        yield* head.splice(0);
        for (let n = it.next(); !n.done; n = it.next()) yield encoder.encode(n.value);
      })();
    }
  }
  return head.length === 1 ? (head[0] as Uint8Array) : Buffer.concat(head);
}

/**
 * The plan on record `previous` for the same conversion as `plan`, whole. A writer stopped between putting
 * its head on record and writing its parts left them incomplete: they are written again from `plan` when it
 * lays the objects out in the same groups (as the same command does), else the step is refused.
 */
async function resumePlan(destination: Store, previous: PlanHead, plan: Plan): Promise<Plan> {
  const stepDir = previous.destination.stepDir;
  if ((await destination.stat(joinKey(stepDir, commitPartKey(previous.id)))) === undefined) {
    if (JSON.stringify(previous.groups) !== JSON.stringify(plan.groups)) {
      throw new ConflictError(
        `the plan on record (${previous.id}) lacks its parts (its writer was stopped) and has other groups; --force starts over`,
        { path: describe(destination, joinKey(stepDir, PLAN_KEY)) },
      );
    }
    await writeParts(destination, plan, previous.id);
  }
  return readPlan(destination, previous);
}

/**
 * Puts `plan` on record for its step, or joins the identical conversion already there. Refuses a step held
 * by another conversion (another source or other options), live or committed, and a committed step with no
 * plan (written by something else), unless `force`: then the step is taken over (takeOver).
 */
export async function claimStep(destination: Store, plan: Plan, force: boolean): Promise<Claim> {
  const stepDir = plan.destination.stepDir;
  if (force) {
    await takeOver(destination, plan);
    return { kind: "new", plan };
  }
  const indexKey = joinKey(stepDir, "index");
  const committed = (await destination.stat(indexKey)) !== undefined;
  if (!committed && (await destination.createExclusive(joinKey(stepDir, PLAN_KEY), encoder.encode(JSON.stringify(planHead(plan)))))) {
    await writeParts(destination, plan);
    return { kind: "new", plan };
  }
  const previous = await planOnRecord(destination, stepDir);
  if (previous !== undefined && previous.source.fingerprint === plan.source.fingerprint) {
    return { kind: "resumed", plan: await resumePlan(destination, previous, plan), committed };
  }
  if (committed) {
    throw new ConflictError(
      "the destination step is already committed (it has an index) from another source or with other options; --force replaces it",
      {
        path: describe(destination, indexKey),
      },
    );
  }
  throw new ConflictError(
    `the destination step holds ${previous === undefined ? "another conversion" : `the conversion of plan ${previous.id} (another source or other options)`}, finished or still running; --force takes it over`,
    { path: describe(destination, joinKey(stepDir, PLAN_KEY)) },
  );
}

/**
 * `--force`: puts `plan` on record first (from then on the previous owner's finalize refuses), removes the
 * index (the step is uncommitted at once), then everything else of the step but our plan and the trigger's
 * claim (a forced re-conversion must not let a late duplicate event start yet another one). Temporary
 * files of writes still in flight are left to them; list never shows them.
 */
export async function takeOver(destination: Store, plan: Plan): Promise<void> {
  const stepDir = plan.destination.stepDir;
  const planKey = joinKey(stepDir, PLAN_KEY);
  await destination.write(planKey, encoder.encode(JSON.stringify(planHead(plan))));
  await destination.delete(joinKey(stepDir, "index"));
  await writeParts(destination, plan);
  const keep = new Set([planKey, joinKey(stepDir, CLAIM_KEY)]);
  const ours = `${joinKey(stepDir, planPartsDir(plan.id))}/`;
  const keys: string[] = [];
  for await (const o of destination.list(`${stepDir}/`)) if (!keep.has(o.key) && !o.key.startsWith(ours)) keys.push(o.key);
  for (const k of keys) await destination.delete(k);
  await destination.removeAbandoned?.(`${stepDir}/`);
}

/** Refuses unless `plan` is the plan on record for its step: someone took the destination over. */
export async function assertOwner(destination: Store, plan: Pick<PlanHead, "id" | "destination">): Promise<void> {
  const stepDir = plan.destination.stepDir;
  const current = await planOnRecord(destination, stepDir);
  if (current?.id !== plan.id) {
    throw new ConflictError(
      `the destination step is no longer this conversion's (plan ${plan.id}): ${current === undefined ? "its plan was removed" : `plan ${current.id} is on record`}; nothing was committed`,
      { path: describe(destination, joinKey(stepDir, PLAN_KEY)) },
    );
  }
}

/** How often a writer looks whether its plan is still the one on record. */
const OWNER_CHECK_MS = 500;

/**
 * A writer's view of who holds the step, refreshed at most every OWNER_CHECK_MS: reads only the start of
 * the plan on record (JSON.stringify puts `id` in its first fields), so even a plan of many MB costs a
 * stat and a small ranged read.
 */
export class OwnerWatch {
  private checked = 0;
  private pending: Promise<void> | undefined;

  constructor(
    private readonly destination: Store,
    private readonly plan: Pick<PlanHead, "id" | "destination">,
  ) {}

  /** Resolves while `plan` is on record; rejects with a ConflictError once another plan is. */
  check(): Promise<void> {
    if (Date.now() - this.checked < OWNER_CHECK_MS) return Promise.resolve();
    this.pending ??= this.look().finally(() => {
      this.pending = undefined;
    });
    return this.pending;
  }

  private async look(): Promise<void> {
    const key = joinKey(this.plan.destination.stepDir, PLAN_KEY);
    const id = (await planIdentityOnRecord(this.destination, this.plan.destination.stepDir))?.id;
    if (id !== this.plan.id) {
      throw new ConflictError(
        `the destination step was taken over by ${id === undefined ? "another conversion" : `plan ${id}`} (--force); this conversion (plan ${this.plan.id}) stopped`,
        { path: describe(this.destination, key) },
      );
    }
    this.checked = Date.now();
  }
}

/**
 * After a takeover: removes what this writer wrote that the plan now on record does not plan, so that
 * objects it had in flight when it noticed do not linger as extra arrays in the new owner's step.
 */
export async function retreat(destination: Store, stepDir: string, wrote: readonly string[]): Promise<void> {
  const head = await planOnRecord(destination, stepDir).catch(() => undefined);
  const current = head === undefined ? undefined : await readPlan(destination, head).catch(() => undefined);
  const theirs = new Set(current?.objects.map((o) => o.target) ?? []);
  for (const target of wrote) if (!theirs.has(target)) await destination.delete(joinKey(stepDir, target));
}
