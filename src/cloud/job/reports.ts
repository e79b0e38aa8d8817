import { ATTEMPT_PATTERN, type FailureReport, failureKey, type JobPhase, WORK_DIR } from "../../convert/work-dir.js";
import { stepDirName } from "../../orbax/step.js";
import type { GcsOptions } from "../../store/gcs.js";
import { defaultTimeouts } from "../../store/http.js";
import { openStore } from "../../store/open.js";
import { defaultRetryPolicy } from "../../store/retry.js";
import { joinKey } from "../../store/store.js";
import { cloudRunTask, type Env } from "../api/env.js";
import type { Logger } from "../api/log.js";

/**
 * The small JSON objects the Cloud Run jobs leave in the destination step's work directory for the workflow
 * (workflows/convert.yaml reads them with the storage connector). They are the only channel from a job
 * back to the workflow: a job execution's own result says no more than "a task failed". Their keys and
 * shapes are in src/convert/work-dir.ts; this module writes the failure reports.
 */

/**
 * Lenient reads for the records a task writes (progress, failure reports), which must never fail
 * themselves: the phase reads these variables strictly (src/cloud/api/env.ts), and a malformed one is the
 * failure such a record reports.
 */
const wholeOrUndefined = (v: string | undefined) => (v !== undefined && /^\d+$/.test(v) ? Number(v) : undefined);

/** The group a convert-group task converts (ORBAX2REG_GROUP), else null. */
export const recordedGroup = (phase: JobPhase, env: Env): number | null =>
  phase === "convert-group" ? (wholeOrUndefined(env.ORBAX2REG_GROUP) ?? null) : null;

/** The destination step directory, when ORBAX2REG_STEP names the step. */
export function recordedStepDir(env: Env): string | undefined {
  const step = wholeOrUndefined(env.ORBAX2REG_STEP);
  return step === undefined ? undefined : stepDirName(step);
}

/**
 * The full name of the Cloud Run job execution this process runs in, as the Run Admin API v2 names it
 * (projects/P/locations/R/jobs/J/executions/E), or null when the environment does not say. Cloud Run sets
 * CLOUD_RUN_JOB and CLOUD_RUN_EXECUTION in every job container
 * (https://cloud.google.com/run/docs/container-contract#jobs-env-vars); the project and region come from
 * terraform (ORBAX2REG_PROJECT, ORBAX2REG_REGION), as Cloud Run does not tell a job where it runs.
 */
export function cloudRunExecutionName(env: Readonly<Record<string, string | undefined>>): string | null {
  const parts = [env.ORBAX2REG_PROJECT, env.ORBAX2REG_REGION, env.CLOUD_RUN_JOB, env.CLOUD_RUN_EXECUTION];
  if (parts.some((p) => p === undefined || p === "" || p.includes("/"))) return null;
  const [project, region, job, execution] = parts;
  return `projects/${project}/locations/${region}/jobs/${job}/executions/${execution}`;
}

/**
 * Where a job reports a failure to the workflow, when the environment says enough to know: the destination
 * step's work directory (the run directory, for the plan job the workflow starts), and the id of this job
 * execution (ORBAX2REG_ATTEMPT from the workflow, else CLOUD_RUN_EXECUTION).
 */
function reportTarget(env: Env, phase: JobPhase): { location: string; under: string; attempt: string } | undefined {
  const attempt = env.ORBAX2REG_ATTEMPT || env.CLOUD_RUN_EXECUTION;
  if (!attempt || !ATTEMPT_PATTERN.test(attempt)) return undefined;
  // The plan job the workflow starts reports in the run directory: the workflow does not know the step yet.
  if (phase === "plan" && env.ORBAX2REG_RUN) return { location: env.ORBAX2REG_RUN, under: "", attempt };
  const destination = env.ORBAX2REG_DESTINATION;
  const stepDir = recordedStepDir(env);
  if (!destination || stepDir === undefined) return undefined;
  return { location: destination, under: joinKey(stepDir, WORK_DIR), attempt };
}

/**
 * How long a record write (a failure report, a progress record) keeps retrying, and how long one of its
 * requests may make no progress. Short, unlike the phase's own 2 minutes: these are small best-effort
 * objects, and they are written after a phase failed, often because storage itself is unreachable; with the
 * phase's deadline each would add 2 minutes more before the task exits (and Cloud Run and the workflow retry
 * it). A shorter ORBAX2REG_GCS_RETRY_DEADLINE_MS / ORBAX2REG_GCS_STALL_MS shortens them too.
 */
export const RECORD_RETRY_DEADLINE_MS = 10_000;
export const RECORD_STALL_MS = 5_000;

/** The storage options of record writes: the defaults, bounded by RECORD_RETRY_DEADLINE_MS and RECORD_STALL_MS. */
export function recordStoreOptions(): GcsOptions {
  const retry = defaultRetryPolicy();
  return {
    retry: { ...retry, deadlineMs: Math.min(retry.deadlineMs, RECORD_RETRY_DEADLINE_MS) },
    timeouts: { stallMs: Math.min(defaultTimeouts().stallMs, RECORD_STALL_MS) },
  };
}

/**
 * Leaves the failure report of a job task under a key of its own (this execution, this task, this task
 * attempt): reports are never shared, so none is deleted or overwritten by another task or a later run.
 * Best effort, within RECORD_RETRY_DEADLINE_MS: the destination itself may be what failed; the job's log
 * line still tells the story, and the workflow treats a failure without a report as transient (retried a
 * bounded number of times). Resolves to the report's key (under its location) once written, else undefined.
 */
export async function reportFailure(env: Env, phase: JobPhase, err: Error, permanent: boolean, log: Logger): Promise<string | undefined> {
  const target = reportTarget(env, phase);
  if (!target) {
    log.warn(
      "no failure report written: the report's place (ORBAX2REG_RUN, or ORBAX2REG_DESTINATION and ORBAX2REG_STEP) or the execution id is missing",
      { phase },
    );
    return undefined;
  }
  const task = cloudRunTask(env, { lenient: true }); // the failure may be a malformed CLOUD_RUN_TASK_* itself
  const report: FailureReport = {
    phase,
    group: recordedGroup(phase, env),
    task: task.index,
    taskAttempt: task.attempt,
    attempt: target.attempt,
    execution: env.CLOUD_RUN_EXECUTION || null,
    permanent,
    errorType: err.name,
    message: err.message,
    time: new Date().toISOString(),
  };
  const key = failureKey(target.attempt, report, target.under);
  try {
    await (await openStore(target.location, recordStoreOptions())).write(key, new TextEncoder().encode(JSON.stringify(report)));
    return `${target.location.replace(/\/+$/, "")}/${key}`;
  } catch (w) {
    log.warn("could not write the failure report", { key, error: (w as Error).message });
    return undefined;
  }
}
