import { resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { MetadataError, UncommittedError, UsageError } from "../errors.js";
import { openStep, requireCommitted } from "../orbax/step.js";
import { openStore } from "../store/open.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { DEFAULT_EXECUTE, type ExecuteOptions, type ExecuteReport, executeObjects } from "./execute.js";
import { type FinalizeReport, finalize } from "./finalize.js";
import { buildPlan, stepDirName } from "./plan.js";
import { CLAIM_KEY, PLAN_KEY, type Plan, parsePlan, WORK_DIR } from "./plan-format.js";

export interface PlanPhaseOptions {
  readonly step?: number;
  readonly groups: number;
  readonly paramsOnly: boolean;
  readonly allowUncommitted: boolean;
  readonly force: boolean;
  readonly dryRun: boolean;
  /**
   * A destination step already committed from this same source and options is a success with nothing to
   * do (a re-run pipeline), instead of an error. The CLI keeps the error: there, a second run is a mistake.
   */
  readonly acceptCommitted?: boolean;
}

export interface PlanPhaseResult {
  readonly plan: Plan;
  /** An identical plan was already in the destination (a resumed conversion). */
  readonly reused: boolean;
  /** That conversion was already committed (only with `acceptCommitted`). */
  readonly committed: boolean;
}

/** A location as a comparable prefix: an absolute local path or gs://bucket/prefix, ending in "/". */
export function normalizeLocation(location: string): string {
  if (location.startsWith("gs://")) return `${location.replace(/\/+$/, "")}/`;
  const path = location.startsWith("file://") ? fileURLToPath(location) : location;
  return `${resolve(path).replace(/\/+$/, "")}/`;
}

/**
 * Phase 1: opens the source step, refuses what must not be converted (uncommitted or unmerged sources,
 * a destination inside the source, a committed destination without --force), and writes the plan under
 * `<dest>/step_X/.orbax2reg/`. An identical existing plan is reused, so re-running resumes.
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
  const plan = await buildPlan(source, destinationRoot.replace(/\/+$/, ""), options);
  const sourceStep = normalizeLocation(describe(source.store, source.stepDir));
  const destStep = normalizeLocation(`${destinationRoot.replace(/\/+$/, "")}/${plan.destination.stepDir}`);
  if (destStep.startsWith(sourceStep) || sourceStep.startsWith(destStep)) {
    throw new UsageError(`the destination step ${destStep} overlaps the source step ${sourceStep}`);
  }
  if (options.dryRun) return { plan, reused: false, committed: false };

  const destination = await openStore(destinationRoot);
  const stepDir = plan.destination.stepDir;
  const committed = await destination.stat(joinKey(stepDir, "index"));
  const previous = await readPlanIfAny(destination, stepDir);
  if (committed !== undefined || previous !== undefined) {
    const same = previous?.source.fingerprint === plan.source.fingerprint;
    if (options.force) {
      await wipe(destination, stepDir);
    } else if (committed !== undefined && same && options.acceptCommitted) {
      return { plan: previous, reused: true, committed: true };
    } else if (committed !== undefined) {
      throw new UsageError("the destination step is already committed (it has an index); --force replaces it", {
        path: describe(destination, joinKey(stepDir, "index")),
      });
    } else if (same && previous !== undefined) {
      return { plan: previous, reused: true, committed: false };
    } else {
      throw new UsageError(
        "the destination step holds an unfinished conversion of another source or with other options; --force starts over",
        {
          path: describe(destination, joinKey(stepDir, PLAN_KEY)),
        },
      );
    }
  }
  await destination.write(joinKey(stepDir, PLAN_KEY), new TextEncoder().encode(JSON.stringify(plan)));
  return { plan, reused: false, committed: false };
}

async function readPlanIfAny(destination: Store, stepDir: string): Promise<Plan | undefined> {
  const key = joinKey(stepDir, PLAN_KEY);
  if ((await destination.stat(key)) === undefined) return undefined;
  return parsePlan(new TextDecoder().decode(await destination.read(key)), describe(destination, key));
}

/**
 * Removes the index first (so the step is uncommitted at once), then everything else of the step except
 * the trigger's claim: a forced re-conversion must not let a late duplicate event start yet another one.
 */
async function wipe(destination: Store, stepDir: string): Promise<void> {
  await destination.delete(joinKey(stepDir, "index"));
  const keys: string[] = [];
  const claim = joinKey(stepDir, CLAIM_KEY);
  for await (const o of destination.list(`${stepDir}/`)) if (o.key !== claim) keys.push(o.key);
  for (const k of keys) await destination.delete(k);
}

/** Reads the plan a `plan` phase wrote for `step` under `destinationRoot`. */
export async function loadPlan(destinationRoot: string, step: number): Promise<{ plan: Plan; destination: Store; source: Store }> {
  const destination = await openStore(destinationRoot);
  const key = joinKey(stepDirName(step), PLAN_KEY);
  if ((await destination.stat(key)) === undefined) {
    throw new MetadataError("no plan for this step: run `orbax2reg plan` first", { path: describe(destination, key) });
  }
  const plan = parsePlan(new TextDecoder().decode(await destination.read(key)), describe(destination, key));
  return { plan, destination, source: await openStore(plan.source.root) };
}

export interface GroupPhaseOptions extends ExecuteOptions {
  /** Split the group across `taskCount` workers (Cloud Run job tasks); this is worker `taskIndex`. */
  readonly taskIndex?: number;
  readonly taskCount?: number;
}

/** Phase 2: writes one group's objects (or one task's share of them). Any number run at once. */
export async function groupPhase(
  destinationRoot: string,
  step: number,
  group: number,
  options: GroupPhaseOptions = DEFAULT_EXECUTE,
): Promise<ExecuteReport & { group: number }> {
  const { plan, destination, source } = await loadPlan(destinationRoot, step);
  const g = plan.groups[group];
  if (g === undefined) throw new UsageError(`group ${group} does not exist (the plan has groups 0..${plan.groups.length - 1})`);
  const count = options.taskCount ?? 1;
  const task = options.taskIndex ?? 0;
  if (task < 0 || task >= count) throw new UsageError(`task index ${task} is outside 0..${count - 1}`);
  const size = g.end - g.start;
  const objects = plan.objects.slice(g.start + Math.floor((size * task) / count), g.start + Math.floor((size * (task + 1)) / count));
  const report = await executeObjects(plan, objects, source, destination, options);
  await destination.write(
    joinKey(plan.destination.stepDir, WORK_DIR, "groups", count > 1 ? `${group}-${task}.json` : `${group}.json`),
    new TextEncoder().encode(JSON.stringify({ group, task, ...report })),
  );
  return { group, ...report };
}

/** Phase 3: checks completeness, copies iterator files and writes the index last. */
export async function finalizePhase(destinationRoot: string, step: number): Promise<FinalizeReport & { plan: Plan }> {
  const { plan, destination, source } = await loadPlan(destinationRoot, step);
  return { plan, ...(await finalize(plan, source, destination)) };
}

export interface ConvertResult {
  readonly plan: Plan;
  readonly reused: boolean;
  readonly execute: ExecuteReport | undefined;
  readonly finalize: FinalizeReport | undefined;
}

/** All three phases in one process: what `orbax2reg convert` does. */
export async function convert(
  sourceLocation: string,
  destinationRoot: string,
  options: PlanPhaseOptions & ExecuteOptions & { readonly onPlan?: (plan: Plan) => void },
): Promise<ConvertResult> {
  const { plan, reused } = await planPhase(sourceLocation, destinationRoot, options);
  options.onPlan?.(plan);
  if (options.dryRun) return { plan, reused, execute: undefined, finalize: undefined };
  const destination = await openStore(destinationRoot);
  const source = await openStore(plan.source.root);
  const execute = await executeObjects(plan, plan.objects, source, destination, options);
  return { plan, reused, execute, finalize: await finalize(plan, source, destination) };
}
