import { cancelMarkerKey } from "../../convert/work-dir.js";
import { stepDirName } from "../../orbax/step.js";
import { joinKey } from "../../store/store.js";
import { executionLabels, isLive } from "../api/executions.js";
import { type FleetDeps, locate, parseRoot, progressRecords } from "./status.js";

/**
 * Cancelling a step's conversion: the Workflows execution (Google stops it at once; it starts no further job)
 * and the Cloud Run job executions it already started (they would otherwise run to their end: cancelling a
 * workflow does not cancel what it started). A job that started just before the cancel may not have
 * written its progress record yet, so a marker is left first: every job checks it as it starts, finalize
 * checks it again right before writing `index`, and the cancel keeps looking for new records for a while.
 * Nothing is deleted: a later `orbax2reg cloud start` resumes from what was written.
 */
export interface CancelReport {
  readonly step: number;
  /** The executions cancelled (none: nothing was running). */
  readonly executions: readonly string[];
  /** Cloud Run job executions cancelled. */
  readonly jobs: readonly string[];
  /** The step has an `index` after all: its finalize had committed it before the cancel arrived. */
  readonly committed: boolean;
}

export interface CancelOptions {
  /** How long to keep cancelling job executions that show up after the workflow was cancelled. */
  readonly graceMs?: number;
  readonly sleep?: (ms: number) => Promise<void>;
}

export async function cancelStep(rootLocation: string, step: number, deps: FleetDeps, options: CancelOptions = {}): Promise<CancelReport> {
  const sleep = options.sleep ?? ((ms: number) => new Promise<void>((r) => setTimeout(r, ms)));
  const now = deps.now ?? Date.now;
  const where = locate(parseRoot(rootLocation), step, deps.destinationTemplate);
  const destination = await deps.openStore(where.destination);
  const stepDir = stepDirName(step);
  const live = (await deps.executions.find(deps.workflow, executionLabels(where.source, step))).filter(isLive);
  const cancelledJobs = new Set<string>();
  for (const execution of live) {
    await destination.write(
      joinKey(stepDir, cancelMarkerKey(execution.name)),
      new TextEncoder().encode(JSON.stringify({ execution: execution.name, time: new Date(now()).toISOString() })),
    );
    await deps.executions.cancel(execution.name);
  }
  if (live.length > 0 && deps.jobs) {
    const names = new Set(live.map((e) => e.name));
    const until = now() + (options.graceMs ?? 20_000);
    for (;;) {
      for (const r of await progressRecords(destination, stepDir)) {
        if (r.state !== "running" || !r.execution || cancelledJobs.has(r.execution)) continue;
        if (r.workflowExecution !== null && !names.has(r.workflowExecution)) continue;
        await deps.jobs.cancel(r.execution);
        cancelledJobs.add(r.execution);
      }
      if (now() >= until) break;
      await sleep(2000);
    }
  }
  const committed = (await destination.stat(joinKey(stepDir, "index"))) !== undefined;
  return { step, executions: live.map((e) => e.name), jobs: [...cancelledJobs], committed };
}
