import { finalizePhase, groupPhase, planPhase } from "../../convert/convert.js";
import { type JobPhase, type PlanSummary, RUN_ARGUMENT_KEY, RUN_PLAN_KEY, type RunPlan, SUMMARY_KEY } from "../../convert/work-dir.js";
import {
  DEFAULT_GROUPS,
  DEFAULT_PLAN_GROUPS,
  JOB_CONCURRENCY,
  JOB_MEMORY_MIB,
  MAX_CONCURRENCY,
  MAX_MEMORY_MIB,
  mibToBytes,
} from "../../defaults.js";
import { UsageError } from "../../errors.js";
import { stepDirName } from "../../orbax/step.js";
import { openStore } from "../../store/open.js";
import { retryStats } from "../../store/retry.js";
import { joinKey } from "../../store/store.js";
import type { Env } from "../api/env.js";
import * as fromEnv from "../api/env.js";
import type { Logger } from "../api/log.js";
import { stopIfCancelled } from "./cancelled.js";
import { runExportPhase } from "./export-phases.js";
import type { Progress } from "./progress.js";
import { pruneAfterFinalize, retentionFromEnv } from "./retention.js";
import { type CheckedArgument, exportEnvironment, jobEnvironment, parseWorkflowArgumentText, stepWorkPrefix } from "./workflow-argument.js";

/**
 * What each Cloud Run job phase does (src/cloud/job/run.ts runs one and reports how it ended): read its settings from
 * the environment (src/cloud/api/env.ts), call the engine the CLI uses, and log single-line JSON for Cloud Logging.
 */

const PROGRESS_EVERY_MS = 5000;

/**
 * What every log line of a job carries: the workflow passes its execution name so every line of a conversion
 * can be found from it, and the id of this job execution (the failure reports' key) so its lines can be told
 * from a retry's.
 */
export function jobLogFields(env: Env): Record<string, string> {
  const execution = fromEnv.optionalString(env, "ORBAX2REG_EXECUTION", "");
  const attempt = fromEnv.optionalString(env, "ORBAX2REG_ATTEMPT", "");
  return { ...(execution ? { execution } : {}), ...(attempt ? { attempt } : {}) };
}

/** Steps, groups: any whole number Number() holds exactly (the engine says which exist). */
const WHOLE = { min: 0, max: Number.MAX_SAFE_INTEGER } as const;

const encodeJson = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));

/**
 * Runs `phase` with the settings in `env`; throws what failed (an Orbax2RegError when retrying cannot help).
 * Once `stop` is aborted, finalize no longer commits (the index is not written).
 */
export async function runPhase(
  phase: JobPhase,
  env: Env,
  log: Logger,
  started: number,
  progress: Progress,
  stop?: AbortSignal,
): Promise<void> {
  const destination = fromEnv.requiredString(env, "ORBAX2REG_DESTINATION");
  // Optional for plan (then the source's latest committed step); the other phases require it below.
  const knownStep = fromEnv.optionalInteger(env, "ORBAX2REG_STEP", WHOLE);
  // A job the workflow started just before `orbax2reg cloud cancel` must not run (src/cloud/ops/cancel.ts).
  const stopIfRunCancelled = async () => {
    if (knownStep !== undefined)
      await stopIfCancelled(await openStore(destination), stepDirName(knownStep), fromEnv.optionalString(env, "ORBAX2REG_EXECUTION", ""));
  };
  await stopIfRunCancelled();
  if (phase === "plan") return planJob(env, destination, knownStep, log, started, progress);
  if (phase === "export-begin" || phase === "export-shards" || phase === "export-finalize")
    return runExportPhase(
      phase,
      env,
      log,
      started,
      progress,
      async () => {
        stop?.throwIfAborted();
        await stopIfRunCancelled();
        stop?.throwIfAborted();
      },
      stop,
    );
  const step = fromEnv.integer(env, "ORBAX2REG_STEP", WHOLE);
  if (phase === "convert-group") {
    const group = fromEnv.integer(env, "ORBAX2REG_GROUP", WHOLE);
    const { index: taskIndex, count: taskCount } = fromEnv.cloudRunTask(env);
    const glog = log.with({ phase, step, group, task: taskIndex });
    let bytes = 0;
    let last = Date.now();
    const report = await groupPhase(destination, step, group, {
      concurrency: fromEnv.integer(env, "ORBAX2REG_CONCURRENCY", { min: 1, max: MAX_CONCURRENCY, fallback: JOB_CONCURRENCY }),
      memoryBytes: mibToBytes(fromEnv.integer(env, "ORBAX2REG_MEMORY_MIB", { min: 1, max: MAX_MEMORY_MIB, fallback: JOB_MEMORY_MIB })),
      taskIndex,
      taskCount,
      onObject: (e) => {
        progress.advance(1, e.bytes);
        bytes += e.bytes;
        const now = Date.now();
        if (now - last >= PROGRESS_EVERY_MS) {
          last = now;
          const seconds = (now - started) / 1000;
          glog.info("copying", { bytes, mbPerSecond: Number((bytes / 1e6 / seconds).toFixed(1)) });
        }
      },
    });
    progress.set({ objects: report.objects, objectsDone: report.objects, bytes });
    glog.info("group done", {
      objects: report.objects,
      written: report.written,
      skipped: report.skipped,
      bytes: report.bytesWritten,
      seconds: report.seconds,
      mbPerSecond: Number((report.bytesWritten / 1e6 / Math.max(report.seconds, 1e-3)).toFixed(1)),
      storageRetries: retryStats(),
    });
    return;
  }
  if (phase === "finalize") {
    const retention = retentionFromEnv(env); // checked before committing: a bad setting fails with nothing committed
    const report = await finalizePhase(destination, step, async () => {
      stop?.throwIfAborted();
      await stopIfRunCancelled();
      stop?.throwIfAborted(); // checked again after the round trip: the index comes next
    });
    await pruneAfterFinalize(retention, destination, step, log); // older converted steps; never fails the job
    progress.set({ objects: report.objects, objectsDone: report.objects });
    log.info("checkpoint committed", {
      phase,
      step,
      objects: report.objects,
      files: report.files,
      indexWritten: report.indexWritten,
      bytes: report.plan.totals.bytes,
      seconds: (Date.now() - started) / 1000,
      // From the plan to the commit: the conversion's duration, which the dashboard charts (terraform/modules/orbax2reg/
      // dashboard.tf). A resumed conversion reuses its plan, so it counts from the first attempt's plan.
      conversionSeconds: (Date.now() - Date.parse(report.plan.createdAt)) / 1000,
      storageRetries: retryStats(),
    });
  }
}

/** The plan job's answer to the workflow (RunPlan): the conversion's summary, or none for an export alone. */
function runPlan(argument: CheckedArgument, execution: string, run: string, summary: PlanSummary | { convert: false }): RunPlan {
  const converted: PlanSummary =
    "convert" in summary
      ? { step: argument.step, stepDir: argument.stepDir, groups: 0, arrays: 0, objects: 0, bytes: 0, reused: false, committed: false }
      : summary;
  const work = stepWorkPrefix(argument);
  return {
    ...converted,
    convert: argument.convert,
    source: argument.source,
    destination: argument.destination,
    work,
    tasksPerGroup: argument.tasksPerGroup,
    jobTimeout: argument.jobTimeout,
    jobEnv: jobEnvironment(argument, execution || undefined),
    export:
      argument.export === undefined
        ? null
        : {
            destination: argument.export.destination,
            work,
            jobTimeout: argument.jobTimeout,
            jobEnv: exportEnvironment(argument, execution || undefined, run),
          },
  };
}

/**
 * The plan phase. Started by the workflow, it gets the execution's argument as given (ORBAX2REG_ARGUMENT),
 * reads it (src/cloud/job/workflow-argument.ts) and answers in the run directory (ORBAX2REG_RUN), where the
 * workflow looks before it knows the step. Run by hand, it reads ORBAX2REG_SOURCE and the rest, as the later
 * phases do.
 */
async function planJob(
  env: Env,
  destination: string,
  knownStep: number | undefined,
  log: Logger,
  started: number,
  progress: Progress,
): Promise<void> {
  const argumentText = fromEnv.optionalString(env, "ORBAX2REG_ARGUMENT", "");
  const run = fromEnv.optionalString(env, "ORBAX2REG_RUN", "");
  const execution = fromEnv.optionalString(env, "ORBAX2REG_EXECUTION", "");
  const destinationStore = await openStore(destination);
  const runStore = run === "" ? undefined : await openStore(run);
  let argument: CheckedArgument | undefined;
  if (argumentText !== "") {
    // The deployment's default (the workflow passes its ORBAX2REG_GROUPS setting).
    argument = parseWorkflowArgumentText(
      argumentText,
      fromEnv.integer(env, "ORBAX2REG_GROUPS", { min: 1, max: WHOLE.max, fallback: DEFAULT_GROUPS }),
    );
    if (argument.destination !== destination)
      throw new UsageError(`ORBAX2REG_DESTINATION ${destination} is not the argument's destination ${argument.destination}`);
    progress.at(argument.stepDir);
    progress.write();
    // The check at the top of runPhase needs ORBAX2REG_STEP, which the workflow no longer knows to pass.
    await stopIfCancelled(destinationStore, argument.stepDir, execution);
    await runStore?.write(RUN_ARGUMENT_KEY, encodeJson(argument));
  }
  if (argument !== undefined && runStore !== undefined && !argument.convert) {
    // An export alone: nothing to plan here (export-begin plans the export), and no summary.json, which says a
    // conversion's state to `cloud status`.
    progress.at(argument.stepDir);
    await runStore.write(RUN_PLAN_KEY, encodeJson(runPlan(argument, execution, run, { convert: false })));
    log.info("export only; nothing to convert", { phase: "plan", step: argument.step, seconds: (Date.now() - started) / 1000 });
    return;
  }
  const step = argument?.step ?? knownStep;
  const { plan, reused, committed } = await planPhase(argument?.source ?? fromEnv.requiredString(env, "ORBAX2REG_SOURCE"), destination, {
    groups: argument?.groups ?? fromEnv.integer(env, "ORBAX2REG_GROUPS", { min: 1, max: WHOLE.max, fallback: DEFAULT_PLAN_GROUPS }),
    paramsOnly: argument?.paramsOnly ?? fromEnv.flag(env, "ORBAX2REG_PARAMS_ONLY"),
    force: argument?.force ?? fromEnv.flag(env, "ORBAX2REG_FORCE"),
    allowUncommitted: fromEnv.flag(env, "ORBAX2REG_ALLOW_UNCOMMITTED"),
    dryRun: false,
    ...(step !== undefined ? { step } : {}),
  });
  const summary: PlanSummary = {
    step: plan.step,
    stepDir: plan.destination.stepDir,
    groups: plan.groups.length,
    arrays: plan.totals.arrays,
    objects: plan.totals.objects,
    bytes: plan.totals.bytes,
    reused,
    committed,
  };
  progress.at(plan.destination.stepDir);
  await destinationStore.write(joinKey(plan.destination.stepDir, SUMMARY_KEY), encodeJson(summary));
  if (argument !== undefined && runStore !== undefined) {
    await runStore.write(RUN_PLAN_KEY, encodeJson(runPlan(argument, execution, run, summary)));
  }
  log.info(committed ? "already converted; nothing to do" : reused ? "reusing existing plan" : "plan written", {
    phase: "plan",
    ...summary,
    seconds: (Date.now() - started) / 1000,
    storageRetries: retryStats(),
  });
}
