import { ConflictError, MetadataError, UncommittedError, UsageError } from "../errors.js";
import { isStepNumber, openStep, type RootStep, requireCommitted, stepDirName } from "../orbax/step.js";
import { INPUT, openStore, overlaps, resolveLocation } from "../store/open.js";
import { describe, joinKey, readIfPresent, type Store } from "../store/store.js";
import { allInOrder } from "../util/budget.js";
import type { CastDtype } from "../zarr/cast.js";
import { listTargets } from "./done.js";
import { DEFAULT_EXECUTE, type ExecuteOptions, type ExecuteReport, executeObjects } from "./execute.js";
import { checkPart, type FinalizeReport, finalize, partsOf, Shortfall } from "./finalize.js";
import { claimStep, confirmOwner, lookAtIndex, readPart, readPlan, retreat } from "./ownership.js";
import { buildPlan } from "./plan.js";
import { type Plan, type PlanHead, type PlannedObject, type PlanPart, parsePlan, partRanges } from "./plan-format.js";
import type { Recorded } from "./records.js";
import { groupReportKey, PLAN_KEY } from "./work-dir.js";

export interface PlanPhaseOptions {
  readonly step?: number;
  readonly groups: number;
  /** Objects per part of the plan (plan.ts's default by the number of groups when not given). */
  readonly partObjects?: number;
  readonly paramsOnly: boolean;
  /** Write floating-point leaves of 32 or 64 bits as this dtype (plan.ts). */
  readonly dtype?: CastDtype;
  readonly allowUncommitted: boolean;
  /** Take the destination step over from whatever conversion holds it (see ownership.ts). */
  readonly force: boolean;
  readonly dryRun: boolean;
}

export interface PlanPhaseResult {
  readonly plan: Plan;
  /** The same conversion was already on record (a resumed conversion): its plan, with its id. */
  readonly reused: boolean;
  /** That conversion was already committed. */
  readonly committed: boolean;
  /** How the step was chosen, when the source was a checkpoint root and no step was given. */
  readonly chosen?: RootStep;
  /** The plan's only part as this phase wrote it (a fresh plan of one part): convert runs it without reading it back. */
  readonly onlyPart?: PlanPart;
}

/**
 * Refuses a destination step that is, contains or lies inside the source step, wherever the spellings
 * point (symlinks, `..`, `//` in gs:// names, file:// URLs): see resolveLocation.
 */
export async function assertNoOverlap(sourceStep: string, destinationStep: string): Promise<void> {
  const [src, dest] = await Promise.all([resolveLocation(sourceStep), resolveLocation(destinationStep)]);
  if (overlaps(src, dest)) throw new UsageError(`the destination step ${dest} overlaps the source step ${src}`);
}

/**
 * Phase 1: opens the source step, refuses what must not be converted (uncommitted or unmerged sources,
 * a destination overlapping the source, a step another conversion holds without --force), and puts the
 * plan on record under `<dest>/step_X/.orbax2reg/`. The same conversion already on record is resumed.
 */
export async function planPhase(sourceLocation: string, destinationRoot: string, options: PlanPhaseOptions): Promise<PlanPhaseResult> {
  const source = await openStep(sourceLocation, options.step === undefined ? {} : { step: options.step });
  if (!options.allowUncommitted) {
    requireCommitted(source);
    if (source.source.kind === "ocdbt-unmerged") {
      throw new UncommittedError(
        "the step was never merged by Orbax's finalize (no root manifest.ocdbt); --allow-uncommitted reads the per-process databases",
        {
          path: describe(source.store, source.itemDir),
        },
      );
    }
  }
  // The canonical spelling (gs:// names without empty segments) is what the plan records and writers use.
  const destination = await openStore(destinationRoot);
  // A step given by number is not a choice to report.
  const chosen = source.chosen === undefined || source.chosen.chosenBy === "given" ? {} : { chosen: source.chosen };
  return settling(destination, async () => {
    // The destination's commit marker is looked at while the plan reads the source's tree.
    const step = source.step ?? options.step;
    const ahead = options.dryRun || options.force || !isStepNumber(step) ? undefined : lookAtIndex(destination, stepDirName(step));
    const [draft, looked] = await allInOrder([buildPlan(source, destination.url.replace(/\/+$/, ""), options), ahead]);
    const plan = draft.plan;
    await assertNoOverlap(describe(source.store, source.stepDir), describe(destination, plan.destination.stepDir));
    if (options.dryRun) return { plan, reused: false, committed: false, ...chosen };
    const claim = await claimStep(destination, draft, options.force, looked);
    return claim.kind === "new"
      ? { plan, reused: false, committed: false, ...chosen, ...(claim.onlyPart === undefined ? {} : { onlyPart: claim.onlyPart }) }
      : { plan: claim.plan, reused: true, committed: claim.committed, ...chosen };
  });
}

/**
 * Runs `work` against `destination`, then waits for the flushes its writes started (a local directory's):
 * a phase, failed or not, leaves nothing of itself running once it returns, and a write whose bytes did not
 * reach the disk fails the phase, as it would have failed the write itself. A failed `work` keeps its own
 * error.
 */
async function settling<T>(destination: Store, work: () => Promise<T>): Promise<T> {
  let result: T;
  try {
    result = await work();
  } catch (e) {
    await destination.flushed?.().catch(() => undefined);
    throw e;
  }
  await destination.flushed?.();
  return result;
}

/** Reads the head of the plan a `plan` phase wrote for `step` under `destinationRoot`. */
async function loadHead(destinationRoot: string | Store, step: number): Promise<{ head: PlanHead; destination: Store; source: Store }> {
  const destination = typeof destinationRoot === "string" ? await openStore(destinationRoot) : destinationRoot;
  const key = joinKey(stepDirName(step), PLAN_KEY);
  const bytes = await readIfPresent(destination, key);
  if (bytes === undefined) {
    throw new MetadataError("no plan for this step: run `orbax2reg plan` first", { path: describe(destination, key) });
  }
  const head = parsePlan(new TextDecoder().decode(bytes), describe(destination, key));
  const source = await openStore(head.source.root, INPUT);
  await assertNoOverlap(describe(source, head.source.stepDir), describe(destination, stepDirName(step)));
  return { head, destination, source };
}

/** Reads the plan a `plan` phase wrote for `step` under `destinationRoot`: its head and commit part, no objects. */
export async function loadPlan(destinationRoot: string, step: number): Promise<{ plan: Plan; destination: Store; source: Store }> {
  const { head, destination, source } = await loadHead(destinationRoot, step);
  return { plan: await readPlan(destination, head), destination, source };
}

/** Reads the head of the plan for `step` and checks that it has group `group`: what a convert-group starts from. */
export async function loadGroup(
  destinationRoot: string | Store,
  step: number,
  group: number,
): Promise<{ plan: PlanHead; destination: Store; source: Store }> {
  const loaded = await loadHead(destinationRoot, step);
  const groups = loaded.head.groups.length;
  if (!Number.isSafeInteger(group) || group < 0 || group >= groups) {
    throw new UsageError(`group ${group} does not exist (the plan has groups 0..${groups - 1})`);
  }
  return { plan: loaded.head, destination: loaded.destination, source: loaded.source };
}

export interface GroupPhaseOptions extends ExecuteOptions {
  /** Split the group across `taskCount` workers (Cloud Run job tasks); this is worker `taskIndex`. */
  readonly taskIndex?: number;
  readonly taskCount?: number;
}

/**
 * Phase 2: writes one group's objects (or one task's share of them). Any number run at once. Reads the
 * plan's head and the group's own parts, one at a time, lists only the directories it writes to and reads
 * only its parts' records: its cost does not grow with the other groups'.
 */
export async function groupPhase(
  destinationRoot: string | Store,
  step: number,
  group: number,
  options: GroupPhaseOptions = DEFAULT_EXECUTE,
): Promise<ExecuteReport & { group: number }> {
  const { plan, destination, source } = await loadGroup(destinationRoot, step, group);
  return settling(destination, () => writeGroup(plan, group, source, destination, options));
}

/** The parts of task `task` of `count` of group `group`, each with the slice of its objects the task writes. */
export function taskParts(plan: Pick<PlanHead, "groups" | "partObjects">, group: number, task: number, count: number) {
  if (task < 0 || task >= count) throw new UsageError(`task index ${task} is outside 0..${count - 1}`);
  const g = plan.groups[group] as { start: number; end: number };
  const size = g.end - g.start;
  const from = Math.floor((size * task) / count);
  const to = Math.floor((size * (task + 1)) / count);
  return partRanges(plan, group)
    .filter((r) => r.end > from && r.start < to)
    .map((r) => ({ ref: { group, part: r.part }, from: Math.max(from, r.start) - r.start, to: Math.min(to, r.end) - r.start }));
}

/** Objects of `part`'s task share, given taskParts' slice. */
export const taskObjects = (part: PlanPart, slice: { from: number; to: number }): readonly PlannedObject[] =>
  slice.from === 0 && slice.to === part.objects.length ? part.objects : part.objects.slice(slice.from, slice.to);

/** One group's objects (or one task's share), a part of the plan at a time. */
export async function writeGroup(
  plan: PlanHead,
  group: number,
  source: Store,
  destination: Store,
  options: GroupPhaseOptions,
): Promise<ExecuteReport & { group: number }> {
  const count = options.taskCount ?? 1;
  const task = options.taskIndex ?? 0;
  const started = Date.now();
  const report: ExecuteReport = { objects: 0, written: 0, skipped: 0, bytesWritten: 0, seconds: 0 };
  for (const slice of taskParts(plan, group, task, count)) {
    const part = await readPart(destination, plan, slice.ref);
    // After its objects, the plan must still be on record: if another conversion took the step over meanwhile, what
    // this part wrote is removed (earlier parts' objects were written before the last such check, so the takeover's
    // own clearing of the step removed them).
    const wrote = new Map<string, Recorded>();
    const objects = taskObjects(part, slice);
    add(report, await executeObjects(part, objects, source, destination, { ...options, trusted: wrote, part: slice.ref }));
    await stillOwner(destination, part, wrote);
  }
  report.seconds = (Date.now() - started) / 1000;
  await destination.write(
    joinKey(plan.destination.stepDir, groupReportKey(group, task, count)),
    new TextEncoder().encode(JSON.stringify({ group, task, ...report })),
  );
  return { group, ...report };
}

function add(total: ExecuteReport, r: ExecuteReport): void {
  total.objects += r.objects;
  total.written += r.written;
  total.skipped += r.skipped;
  total.bytesWritten += r.bytesWritten;
}

/** After writing a part: resolves if its plan is still on record, else removes what was written and rejects. */
function stillOwner(destination: Store, part: PlanPart, wrote: ReadonlyMap<string, Recorded>): Promise<void> {
  return confirmOwner(destination, part).catch(async (e) => {
    if (e instanceof ConflictError) await retreat(destination, part.destination.stepDir, [...wrote.keys()]);
    throw e;
  });
}

/** Phase 3: checks completeness, copies iterator files and writes the index last (see finalize for `beforeCommit`). */
export async function finalizePhase(
  destinationRoot: string,
  step: number,
  beforeCommit?: () => Promise<void>,
): Promise<FinalizeReport & { plan: Plan }> {
  const { plan, destination, source } = await loadPlan(destinationRoot, step);
  return settling(destination, async () => ({
    plan,
    ...(await finalize(plan, source, destination, beforeCommit === undefined ? {} : { beforeCommit })),
  }));
}

export interface ConvertResult {
  readonly plan: Plan;
  readonly reused: boolean;
  /** The step was already committed from this source, and every object checked out: nothing was written. */
  readonly alreadyConverted: boolean;
  readonly execute: ExecuteReport | undefined;
  readonly finalize: FinalizeReport | undefined;
  /** How the step was chosen, when the source was a checkpoint root and no step was given. */
  readonly chosen?: RootStep;
}

/**
 * All three phases in one process: what `orbax2reg convert` does. A part of the plan at a time is read,
 * written and checked (trusting what this process wrote: not read back), then dropped; finalize then
 * commits without checking the parts again.
 */
export async function convert(
  sourceLocation: string,
  destinationRoot: string,
  options: PlanPhaseOptions & ExecuteOptions & { readonly onPlan?: (plan: Plan) => void },
): Promise<ConvertResult> {
  const { plan, reused, committed, chosen, onlyPart } = await planPhase(sourceLocation, destinationRoot, options);
  const how = chosen === undefined ? {} : { chosen };
  options.onPlan?.(plan);
  if (options.dryRun) return { plan, reused, alreadyConverted: false, execute: undefined, finalize: undefined, ...how };
  const destination = await openStore(destinationRoot);
  const source = await openStore(plan.source.root, INPUT);
  return settling(destination, async () => {
    // Even a committed step is checked object by object (and a damaged object rewritten).
    const started = Date.now();
    const execute: ExecuteReport = { objects: 0, written: 0, skipped: 0, bytesWritten: 0, seconds: 0 };
    const shortfall = new Shortfall();
    for (const ref of partsOf(plan)) {
      const part =
        onlyPart !== undefined && onlyPart.group === ref.group && onlyPart.part === ref.part
          ? onlyPart
          : await readPart(destination, plan, ref);
      const trusted = new Map<string, Recorded>();
      add(execute, await executeObjects(part, part.objects, source, destination, { ...options, trusted, part: ref }));
      // The look at who holds the step and the check's listing go out together.
      const [, existing] = await allInOrder([
        stillOwner(destination, part, trusted),
        listTargets(destination, part.destination.stepDir, part.objects),
      ]);
      await checkPart(part, source, destination, trusted, shortfall, existing);
    }
    execute.seconds = (Date.now() - started) / 1000;
    const done = await finalize(plan, source, destination, { checked: shortfall });
    return { plan, reused, alreadyConverted: committed && execute.written === 0 && !done.indexWritten, execute, finalize: done, ...how };
  });
}
