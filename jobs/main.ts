// The Cloud Run job image's entry point: `node dist/jobs/main.js plan|convert-group|finalize`.
// It only reads its configuration from the environment (set per execution by the workflow through
// container overrides) and calls the same engine the CLI uses; logs are single-line JSON for Cloud Logging.

import { stopIfCancelled } from "../src/cloud/cancel.js";
import * as fromEnv from "../src/cloud/env.js";
import { type JobOptions, Progress } from "../src/cloud/job-progress.js";
import {
  type JobPhase,
  type PlanSummary,
  RUN_ARGUMENT_KEY,
  RUN_PLAN_KEY,
  type RunPlan,
  reportFailure,
  SUMMARY_KEY,
} from "../src/cloud/job-reports.js";
import { jsonLogger, type Logger } from "../src/cloud/log.js";
import { pruneAfterFinalize, retentionFromEnv } from "../src/cloud/retention.js";
import { jobEnvironment, parseWorkflowArgumentText, stepWorkPrefix, type WorkflowArgument } from "../src/cloud/workflow-argument.js";
import { finalizePhase, groupPhase, planPhase } from "../src/convert/convert.js";
import { MAX_CONCURRENCY, MAX_MEMORY_MIB, mibToBytes } from "../src/convert/defaults.js";
import { dataLength } from "../src/convert/plan-format.js";
import { Orbax2RegError, UsageError } from "../src/errors.js";
import { stepDirName } from "../src/orbax/step.js";
import { openStore } from "../src/store/open.js";
import { retryStats } from "../src/store/retry.js";
import { joinKey } from "../src/store/store.js";

export interface JobEnv {
  readonly [name: string]: string | undefined;
}

const PROGRESS_EVERY_MS = 5000;

/** Steps, groups: any whole number Number() holds exactly (the engine says which exist). */
const WHOLE = { min: 0, max: Number.MAX_SAFE_INTEGER } as const;

const PHASES: readonly JobPhase[] = ["plan", "convert-group", "finalize"];
const isPhase = (p: string | undefined): p is JobPhase => PHASES.includes(p as JobPhase);

const encodeJson = (v: unknown) => new TextEncoder().encode(JSON.stringify(v));

/**
 * Runs one phase; returns the process exit code. On failure it leaves a report the workflow reads to decide
 * whether a retry can help (src/cloud/job-reports.ts, reportFailure).
 */
export async function runJob(
  phase: string | undefined,
  env: JobEnv,
  log: Logger = jsonLogger({ component: "orbax2reg-job" }),
  options: JobOptions = {},
): Promise<number> {
  const started = Date.now();
  const progress = isPhase(phase) ? new Progress(phase, env, started, log, options) : undefined;
  try {
    if (!isPhase(phase) || progress === undefined)
      throw new UsageError(`unknown phase ${JSON.stringify(phase)} (expected plan, convert-group or finalize)`);
    progress.write();
    await runPhase(phase, env, log, started, progress);
    await progress.finish("succeeded", null);
    return 0;
  } catch (e) {
    // Bad input is permanent (exit 2: retrying cannot help); anything else may be transient (exit 1).
    const err = e as Error;
    const permanent = e instanceof Orbax2RegError;
    log.error(err.message, { phase, permanent, errorType: err.name, seconds: (Date.now() - started) / 1000, storageRetries: retryStats() });
    if (isPhase(phase)) await reportFailure(env, phase, err, permanent, log);
    await progress?.finish("failed", err);
    return permanent ? 2 : 1;
  }
}

async function runPhase(phase: JobPhase, env: JobEnv, log: Logger, started: number, progress: Progress): Promise<void> {
  const destination = fromEnv.requiredString(env, "ORBAX2REG_DESTINATION");
  // Optional for plan (then the source's latest committed step); the other phases require it below.
  const knownStep = fromEnv.optionalInteger(env, "ORBAX2REG_STEP", WHOLE);
  // A job the workflow started just before `orbax2reg cloud cancel` must not run (src/cloud/cancel.ts).
  const stopIfRunCancelled = async () => {
    if (knownStep !== undefined)
      await stopIfCancelled(await openStore(destination), stepDirName(knownStep), fromEnv.optionalString(env, "ORBAX2REG_EXECUTION", ""));
  };
  await stopIfRunCancelled();
  if (phase === "plan") {
    // Started by the workflow: the execution's argument as given, read here (src/cloud/workflow-argument.ts);
    // the answer goes to the run directory, where the workflow looks before it knows the step. Run by hand:
    // ORBAX2REG_SOURCE and the rest, as the later phases read them.
    const argumentText = fromEnv.optionalString(env, "ORBAX2REG_ARGUMENT", "");
    const run = fromEnv.optionalString(env, "ORBAX2REG_RUN", "");
    const execution = fromEnv.optionalString(env, "ORBAX2REG_EXECUTION", "");
    let argument: WorkflowArgument | undefined;
    if (argumentText !== "") {
      // The deployment's default (the workflow passes its ORBAX2REG_GROUPS setting).
      argument = parseWorkflowArgumentText(argumentText, fromEnv.integer(env, "ORBAX2REG_GROUPS", { min: 1, max: WHOLE.max, fallback: 8 }));
      if (argument.destination !== destination)
        throw new UsageError(`ORBAX2REG_DESTINATION ${destination} is not the argument's destination ${argument.destination}`);
      progress.at(argument.stepDir);
      progress.write();
      // The check at the top of runPhase needs ORBAX2REG_STEP, which the workflow no longer knows to pass.
      await stopIfCancelled(await openStore(destination), argument.stepDir, execution);
      if (run !== "") await (await openStore(run)).write(RUN_ARGUMENT_KEY, encodeJson(argument));
    }
    const step = argument?.step ?? knownStep;
    const { plan, reused, committed } = await planPhase(argument?.source ?? fromEnv.requiredString(env, "ORBAX2REG_SOURCE"), destination, {
      groups: argument?.groups ?? fromEnv.integer(env, "ORBAX2REG_GROUPS", { ...WHOLE, fallback: 1 }),
      paramsOnly: argument?.paramsOnly ?? fromEnv.flag(env, "ORBAX2REG_PARAMS_ONLY"),
      force: argument?.force ?? fromEnv.flag(env, "ORBAX2REG_FORCE"),
      allowUncommitted: fromEnv.flag(env, "ORBAX2REG_ALLOW_UNCOMMITTED"),
      dryRun: false,
      acceptCommitted: true,
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
    await (await openStore(destination)).write(joinKey(plan.destination.stepDir, SUMMARY_KEY), encodeJson(summary));
    if (argument !== undefined && run !== "") {
      const answer: RunPlan = {
        ...summary,
        source: argument.source,
        destination: argument.destination,
        work: stepWorkPrefix(argument),
        tasksPerGroup: argument.tasksPerGroup,
        jobTimeout: argument.jobTimeout,
        jobEnv: jobEnvironment(argument, execution || undefined),
      };
      await (await openStore(run)).write(RUN_PLAN_KEY, encodeJson(answer));
    }
    log.info(committed ? "already converted; nothing to do" : reused ? "reusing existing plan" : "plan written", {
      phase,
      ...summary,
      seconds: (Date.now() - started) / 1000,
      storageRetries: retryStats(),
    });
    return;
  }
  const step = fromEnv.integer(env, "ORBAX2REG_STEP", WHOLE);
  if (phase === "convert-group") {
    const group = fromEnv.integer(env, "ORBAX2REG_GROUP", WHOLE);
    const { index: taskIndex, count: taskCount } = fromEnv.cloudRunTask(env);
    const glog = log.with({ phase, step, group, task: taskIndex });
    let bytes = 0;
    let last = Date.now();
    const report = await groupPhase(destination, step, group, {
      concurrency: fromEnv.integer(env, "ORBAX2REG_CONCURRENCY", { min: 1, max: MAX_CONCURRENCY, fallback: 32 }),
      memoryBytes: mibToBytes(fromEnv.integer(env, "ORBAX2REG_MEMORY_MIB", { min: 1, max: MAX_MEMORY_MIB, fallback: 1024 })),
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
    const report = await finalizePhase(destination, step, stopIfRunCancelled);
    await pruneAfterFinalize(retention, destination, step, log); // older converted steps; never fails the job
    progress.set({ objects: report.objects, objectsDone: report.objects });
    log.info("checkpoint committed", {
      phase,
      step,
      objects: report.objects,
      files: report.files,
      indexWritten: report.indexWritten,
      bytes: report.plan.objects.reduce((s, o) => s + dataLength(o.data), 0),
      seconds: (Date.now() - started) / 1000,
      storageRetries: retryStats(),
    });
  }
}

// Run when executed directly (not when imported by tests).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  // The workflow passes its execution name so every log line of a conversion can be found from it, and the
  // id of this job execution (the failure reports' key) so its lines can be told from a retry's.
  const execution = fromEnv.optionalString(process.env, "ORBAX2REG_EXECUTION", "");
  const attempt = fromEnv.optionalString(process.env, "ORBAX2REG_ATTEMPT", "");
  const log = jsonLogger({ component: "orbax2reg-job", ...(execution ? { execution } : {}), ...(attempt ? { attempt } : {}) });
  // Last resorts, so that no task ends without a log line: an error nobody awaited, or an event loop that
  // empties while the phase still waits (Node would exit 13 silently). Both exit 1, which the workflow retries.
  let settled = false;
  process.on("unhandledRejection", (e) => {
    log.error(`unexpected error: ${e instanceof Error ? e.message : String(e)}`, {
      phase: process.argv[2],
      permanent: false,
      storageRetries: retryStats(),
    });
    process.exit(1);
  });
  process.on("exit", () => {
    if (settled) return;
    log.error("the phase stopped while still waiting for an operation to finish", { phase: process.argv[2], permanent: false });
    process.exitCode = 1;
  });
  process.exitCode = await runJob(process.argv[2], process.env, log);
  settled = true;
}
