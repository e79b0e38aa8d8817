import { ConflictError, MetadataError, Orbax2RegError } from "../errors.js";
import { deleteSeen, describe, joinKey, type ObjectInfo, readIfPresent, type Store } from "../store/store.js";
import type { PlanDraft } from "./plan.js";
import {
  MAX_PLAN_HEAD_BYTES,
  type PartRef,
  type Plan,
  type PlanHead,
  type PlanIdentity,
  type PlanPart,
  parseCommitPart,
  parsePart,
  parsePlan,
  planHead,
  planIdentity,
  plannedTargets,
} from "./plan-format.js";
import { CLAIM_KEY, commitPartKey, PLAN_KEY, planPartKey, planPartsDir } from "./work-dir.js";

/**
 * Who holds a destination step: the conversion whose plan is on record in `<step>/.orbax2reg/plan.json`.
 * A plan is put on record only where none is (create-if-absent, so of two conversions racing for one
 * step exactly one wins), or by `--force`, which replaces it and clears the step. Writers and finalize
 * carry their plan's id; finalize commits only while that plan is still the one on record.
 */

export type Claim =
  /** Our plan is now on record: a fresh conversion; `onlyPart`: its only part as written, when it has one. */
  | { readonly kind: "new"; readonly plan: Plan; readonly onlyPart?: PlanPart }
  /** The same conversion (same source and options) was already on record: resume it, under its id. */
  | { readonly kind: "resumed"; readonly plan: Plan; readonly committed: boolean };

const encoder = new TextEncoder();
const decoder = new TextDecoder();

/** The head of the plan on record for the step, or undefined; a plan this orbax2reg cannot read is another conversion's. */
export async function planOnRecord(destination: Store, stepDir: string): Promise<PlanHead | undefined> {
  const key = joinKey(stepDir, PLAN_KEY);
  const bytes = await readIfPresent(destination, key);
  if (bytes === undefined) return undefined;
  const text = decoder.decode(bytes);
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
  // One request, not a stat then a read: a writer looks every 500 ms, and object starts wait for the look.
  const head = await destination.readHead(joinKey(stepDir, PLAN_KEY), MAX_PLAN_HEAD_BYTES);
  if (head === undefined) return undefined;
  if (head.size > MAX_PLAN_HEAD_BYTES) return { id: undefined, source: undefined };
  return planIdentity(decoder.decode(head.bytes));
}

/** Part `ref` of the plan whose head is `head`: reads only that part. */
export async function readPart(destination: Store, head: PlanHead, ref: PartRef): Promise<PlanPart> {
  const key = joinKey(head.destination.stepDir, planPartKey(head.id, ref.group, ref.part));
  const bytes = await readIfPresent(destination, key);
  if (bytes === undefined) {
    throw new MetadataError(`plan ${head.id} has no part ${ref.part} of group ${ref.group}; run \`orbax2reg plan\` again`, {
      path: describe(destination, key),
    });
  }
  return parsePart(head, ref, decoder.decode(bytes), describe(destination, key));
}

/** The plan whose head is `head`, but its objects (those are read a part at a time: readPart). */
export async function readPlan(destination: Store, head: PlanHead): Promise<Plan> {
  const key = joinKey(head.destination.stepDir, commitPartKey(head.id));
  const bytes = await readIfPresent(destination, key);
  if (bytes === undefined) {
    throw new MetadataError(`plan ${head.id} has no commit part (its writer was stopped); run \`orbax2reg plan\` again`, {
      path: describe(destination, key),
    });
  }
  return parseCommitPart(head, decoder.decode(bytes), describe(destination, key));
}

/**
 * The plan on record `previous` for the same conversion as `draft`. A writer stopped between putting its head
 * on record and writing its commit part left the parts incomplete: they are written again from `draft`, under
 * the plan's id (the same fingerprint is the same layout: the same groups and parts).
 */
async function resumePlan(destination: Store, previous: PlanHead, draft: PlanDraft): Promise<Plan> {
  const stepDir = previous.destination.stepDir;
  if ((await destination.stat(joinKey(stepDir, commitPartKey(previous.id)))) === undefined)
    await draft.writeParts(destination, previous.id);
  return readPlan(destination, previous);
}

/**
 * Puts the plan of `draft` on record for its step (its head first, then its parts: a conversion that loses
 * the race writes nothing into the step), or joins the identical conversion already there. Refuses a step
 * held by another conversion (another source or other options), live or committed, and a committed step
 * with no plan (written by something else), unless `force`: then the step is taken over (takeOver).
 */
export async function claimStep(destination: Store, draft: PlanDraft, force: boolean, looked?: IndexLook): Promise<Claim> {
  const plan = draft.plan;
  const stepDir = plan.destination.stepDir;
  if (force) return { kind: "new", plan, ...onlyPart(destination, plan, await takeOver(destination, draft)) };
  const indexKey = joinKey(stepDir, "index");
  const committed = (await indexSeen(destination, indexKey, looked)) !== undefined;
  if (!committed && (await destination.createExclusive(joinKey(stepDir, PLAN_KEY), encoder.encode(JSON.stringify(planHead(plan)))))) {
    return { kind: "new", plan, ...onlyPart(destination, plan, await draft.writeParts(destination, plan.id)) };
  }
  const previous = await planOnRecord(destination, stepDir);
  if (previous !== undefined && previous.source.fingerprint === plan.source.fingerprint) {
    return { kind: "resumed", plan: await resumePlan(destination, previous, draft), committed };
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
 * A look at a destination step's `index` taken ahead, while the source's tree is read (one round trip less
 * before the first chunk): what it gave, or how it failed, which then fails the claim where its own look would.
 * Taken before the claim as it would have been a moment later: the claim's exclusive create, not the look,
 * decides between writers.
 */
export type IndexLook = { readonly key: string } & ({ readonly info: ObjectInfo | undefined } | { readonly error: unknown });

/** Looks at `stepDir`'s index now; never rejects (claimStep rethrows a failure). */
export function lookAtIndex(destination: Store, stepDir: string): Promise<IndexLook> {
  const key = joinKey(stepDir, "index");
  return destination.stat(key).then(
    (info) => ({ key, info }),
    (error: unknown) => ({ key, error }),
  );
}

async function indexSeen(destination: Store, key: string, looked: IndexLook | undefined): Promise<ObjectInfo | undefined> {
  if (looked?.key !== key) return destination.stat(key);
  if ("error" in looked) throw looked.error;
  return looked.info;
}

/**
 * `--force`: puts `plan` on record first (from then on the previous owner's finalize refuses), removes the
 * index (the step is uncommitted at once), then everything else of the step but our plan and the trigger's
 * claim (a forced re-conversion must not let a late duplicate event start yet another one). Temporary
 * files of writes still in flight are left to them; list never shows them.
 */
export async function takeOver(destination: Store, draft: PlanDraft): Promise<string | undefined> {
  const plan = draft.plan;
  const stepDir = plan.destination.stepDir;
  const planKey = joinKey(stepDir, PLAN_KEY);
  await destination.write(planKey, encoder.encode(JSON.stringify(planHead(plan))));
  // Every delete names the version it saw (deleteSeen: on GCS ifGenerationMatch), so that a retried delete never
  // removes what the previous owner, still writing, put there since: the previous owner stops at its next look at
  // the plan on record and retreats, and our finalize removes whatever of it remains unplanned.
  // The index must go whatever its version (the step is uncommitted at once): one the previous owner committed
  // after we looked is looked at again and deleted at its own version, never blindly.
  for (let index = await destination.stat(joinKey(stepDir, "index")); index !== undefined; ) {
    if (await deleteSeen(destination, index)) break;
    index = await destination.stat(joinKey(stepDir, "index"));
  }
  const only = await draft.writeParts(destination, plan.id);
  const keep = new Set([planKey, joinKey(stepDir, CLAIM_KEY)]);
  const ours = `${joinKey(stepDir, planPartsDir(plan.id))}/`;
  const listed: ObjectInfo[] = [];
  for await (const o of destination.list(`${stepDir}/`)) if (!keep.has(o.key) && !o.key.startsWith(ours)) listed.push(o);
  for (const o of listed) await deleteSeen(destination, o);
  await destination.removeAbandoned?.(`${stepDir}/`);
  return only;
}

/** The plan's only part from the text its writer kept, parsed as readPart would have read it back. */
function onlyPart(destination: Store, plan: Plan, text: string | undefined): { onlyPart?: PlanPart } {
  if (text === undefined) return {};
  const ref = { group: 0, part: 0 };
  const key = joinKey(plan.destination.stepDir, planPartKey(plan.id, ref.group, ref.part));
  return { onlyPart: parsePart(plan, ref, text, describe(destination, key)) };
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
    await confirmOwner(this.destination, this.plan);
    this.checked = Date.now();
  }
}

/** Rejects with a ConflictError unless `plan` is on record, reading only the start of the head (OwnerWatch). */
export async function confirmOwner(destination: Store, plan: Pick<PlanHead, "id" | "destination">): Promise<void> {
  const key = joinKey(plan.destination.stepDir, PLAN_KEY);
  const id = (await planIdentityOnRecord(destination, plan.destination.stepDir))?.id;
  if (id !== plan.id) {
    throw new ConflictError(
      `the destination step was taken over by ${id === undefined ? "another conversion" : `plan ${id}`} (--force); this conversion (plan ${plan.id}) stopped`,
      { path: describe(destination, key) },
    );
  }
}

/**
 * After a takeover: removes what this writer wrote that the plan now on record does not plan, so that
 * objects it had in flight when it noticed do not linger as extra arrays in the new owner's step.
 */
export async function retreat(destination: Store, stepDir: string, wrote: readonly string[]): Promise<void> {
  const head = await planOnRecord(destination, stepDir).catch(() => undefined);
  const current = head === undefined ? undefined : await readPlan(destination, head).catch(() => undefined);
  const theirs = plannedTargets(current?.arrays ?? []);
  for (const target of wrote) {
    if (theirs(target)) continue;
    // At the version seen now: a retried delete must not remove a newer conversion's object of that name.
    const seen = await destination.stat(joinKey(stepDir, target));
    if (seen !== undefined) await deleteSeen(destination, seen);
  }
}
