import { ConflictError, MetadataError, UncommittedError, UsageError } from "../errors.js";
import { openStep, requireCommitted, stepDirName } from "../orbax/step.js";
import { openStore, overlaps, resolveLocation } from "../store/open.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { DEFAULT_EXECUTE, type ExecuteOptions, type ExecuteReport, executeObjects } from "./execute.js";
import { type FinalizeReport, finalize } from "./finalize.js";
import { claimStep, readGroupPlan, readPlan, retreat } from "./ownership.js";
import { buildPlan } from "./plan.js";
import { type GroupPlan, type Plan, type PlanHead, type PlannedObject, parsePlan } from "./plan-format.js";
import type { Recorded } from "./records.js";
import { groupReportKey, PLAN_KEY } from "./work-dir.js";

export interface PlanPhaseOptions {
  readonly step?: number;
  readonly groups: number;
  readonly paramsOnly: boolean;
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
  return settling(destination, async () => {
    const plan = await buildPlan(source, destination.url.replace(/\/+$/, ""), options);
    await assertNoOverlap(describe(source.store, source.stepDir), describe(destination, plan.destination.stepDir));
    if (options.dryRun) return { plan, reused: false, committed: false };
    const claim = await claimStep(destination, plan, options.force);
    return claim.kind === "new"
      ? { plan, reused: false, committed: false }
      : { plan: claim.plan, reused: true, committed: claim.committed };
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
  if ((await destination.stat(key)) === undefined) {
    throw new MetadataError("no plan for this step: run `orbax2reg plan` first", { path: describe(destination, key) });
  }
  const head = parsePlan(new TextDecoder().decode(await destination.read(key)), describe(destination, key));
  const source = await openStore(head.source.root);
  await assertNoOverlap(describe(source, head.source.stepDir), describe(destination, stepDirName(step)));
  return { head, destination, source };
}

/** Reads the whole plan a `plan` phase wrote for `step` under `destinationRoot` (every group's part). */
export async function loadPlan(destinationRoot: string, step: number): Promise<{ plan: Plan; destination: Store; source: Store }> {
  const { head, destination, source } = await loadHead(destinationRoot, step);
  return { plan: await readPlan(destination, head), destination, source };
}

/** Reads the head of the plan for `step` and group `group`'s part of it: what a convert-group needs. */
export async function loadGroup(
  destinationRoot: string | Store,
  step: number,
  group: number,
): Promise<{ plan: GroupPlan; destination: Store; source: Store }> {
  const { head, destination, source } = await loadHead(destinationRoot, step);
  if (!Number.isSafeInteger(group) || group < 0 || group >= head.groups.length) {
    throw new UsageError(`group ${group} does not exist (the plan has groups 0..${head.groups.length - 1})`);
  }
  return { plan: await readGroupPlan(destination, head, group), destination, source };
}

export interface GroupPhaseOptions extends ExecuteOptions {
  /** Split the group across `taskCount` workers (Cloud Run job tasks); this is worker `taskIndex`. */
  readonly taskIndex?: number;
  readonly taskCount?: number;
}

/**
 * Phase 2: writes one group's objects (or one task's share of them). Any number run at once. Reads the
 * plan's head and the group's own part, lists only the directories it writes to and reads only its
 * group's records: its cost does not grow with the other groups'.
 */
export async function groupPhase(
  destinationRoot: string | Store,
  step: number,
  group: number,
  options: GroupPhaseOptions = DEFAULT_EXECUTE,
): Promise<ExecuteReport & { group: number }> {
  const { plan, destination, source } = await loadGroup(destinationRoot, step, group);
  return settling(destination, () => writeGroup(plan, source, destination, options));
}

/** One group's objects (or one task's share), read from the group's own part of the plan. */
export async function writeGroup(
  plan: GroupPlan,
  source: Store,
  destination: Store,
  options: GroupPhaseOptions,
): Promise<ExecuteReport & { group: number }> {
  const group = plan.group;
  const count = options.taskCount ?? 1;
  const task = options.taskIndex ?? 0;
  if (task < 0 || task >= count) throw new UsageError(`task index ${task} is outside 0..${count - 1}`);
  const size = plan.objects.length;
  const objects = plan.objects.slice(Math.floor((size * task) / count), Math.floor((size * (task + 1)) / count));
  const report = await executeObjects(plan, objects, source, destination, { ...options, groupOf: () => group });
  await destination.write(
    joinKey(plan.destination.stepDir, groupReportKey(group, task, count)),
    new TextEncoder().encode(JSON.stringify({ group, task, ...report })),
  );
  return { group, ...report };
}

/** Which group of `plan` each of its objects is in (by identity: the plan's own object records). */
export function groupsOf(plan: Plan): (o: PlannedObject) => number {
  if (plan.groups.length <= 1) return () => 0;
  const group = new Map<PlannedObject, number>();
  plan.groups.forEach((g, i) => {
    for (let j = g.start; j < g.end; j++) group.set(plan.objects[j] as PlannedObject, i);
  });
  return (o) => group.get(o) ?? 0;
}

/** Phase 3: checks completeness, copies iterator files and writes the index last (see finalize for `beforeCommit`). */
export async function finalizePhase(
  destinationRoot: string,
  step: number,
  beforeCommit?: () => Promise<void>,
): Promise<FinalizeReport & { plan: Plan }> {
  const { plan, destination, source } = await loadPlan(destinationRoot, step);
  return settling(destination, async () => ({ plan, ...(await finalize(plan, source, destination, new Map(), beforeCommit)) }));
}

export interface ConvertResult {
  readonly plan: Plan;
  readonly reused: boolean;
  /** The step was already committed from this source, and every object checked out: nothing was written. */
  readonly alreadyConverted: boolean;
  readonly execute: ExecuteReport | undefined;
  readonly finalize: FinalizeReport | undefined;
}

/** All three phases in one process: what `orbax2reg convert` does. */
export async function convert(
  sourceLocation: string,
  destinationRoot: string,
  options: PlanPhaseOptions & ExecuteOptions & { readonly onPlan?: (plan: Plan) => void },
): Promise<ConvertResult> {
  const { plan, reused, committed } = await planPhase(sourceLocation, destinationRoot, options);
  options.onPlan?.(plan);
  if (options.dryRun) return { plan, reused, alreadyConverted: false, execute: undefined, finalize: undefined };
  const destination = await openStore(destinationRoot);
  const source = await openStore(plan.source.root);
  return settling(destination, async () => {
    // Even a committed step is checked object by object (and a damaged object rewritten): the objects this
    // run wrote or checked are handed to finalize, which does not read them back.
    const trusted = new Map<string, Recorded>();
    const execute = await executeObjects(plan, plan.objects, source, destination, { ...options, trusted, groupOf: groupsOf(plan) });
    const done = await finalize(plan, source, destination, trusted).catch(async (e) => {
      // Taken over (--force) after our last object: what we wrote must not linger in the new owner's step.
      if (e instanceof ConflictError) await retreat(destination, plan.destination.stepDir, [...trusted.keys()]);
      throw e;
    });
    return { plan, reused, alreadyConverted: committed && execute.written === 0 && !done.indexWritten, execute, finalize: done };
  });
}
