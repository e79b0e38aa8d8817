import { WORK_DIR } from "../../convert/plan-format.js";
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
 * back to the workflow: a job execution's own result says no more than "a task failed".
 */

/** Written by the plan job: what the workflow fans out over. Small on purpose (Workflows holds it in memory). */
export const SUMMARY_KEY = `${WORK_DIR}/summary.json`;

export interface PlanSummary {
  readonly step: number;
  /** The destination step directory name, e.g. `step_00001000`. */
  readonly stepDir: string;
  readonly groups: number;
  readonly arrays: number;
  readonly objects: number;
  readonly bytes: number;
  /** An identical plan already existed: this run resumes an earlier one. */
  readonly reused: boolean;
  /** The destination step already holds this exact conversion (index written): nothing is left to do. */
  readonly committed: boolean;
}

/**
 * A workflow execution's own directory, `<destination>/.orbax2reg/executions/<execution id>/` (the id is
 * GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID; workflows/convert.yaml builds the same and passes it to the plan job as
 * ORBAX2REG_RUN). The plan job answers there, because before it has read the argument the workflow cannot
 * know the step: `argument.json` (the argument as read, written first), `plan.json` (everything the workflow
 * needs afterwards), and the plan job's failure reports under `failures/<attempt>/`.
 */
export function runDirKey(workflowExecutionId: string): string {
  if (!ATTEMPT_PATTERN.test(workflowExecutionId)) throw new Error(`invalid execution id ${JSON.stringify(workflowExecutionId)}`);
  return `${WORK_DIR}/executions/${workflowExecutionId}/`;
}

/** In the run directory: the argument as the plan job read it (before planning; the step, for a failure event). */
export const RUN_ARGUMENT_KEY = "argument.json";
/** In the run directory: the plan job's answer (RunPlan). */
export const RUN_PLAN_KEY = "plan.json";

/** What the workflow reads from `<run>/plan.json` once the plan job succeeded. */
export interface RunPlan extends PlanSummary {
  /** The argument's source and destination, trailing slashes removed. */
  readonly source: string;
  readonly destination: string;
  /** The step's work directory, an object name prefix in the destination bucket ending in "/". */
  readonly work: string;
  readonly tasksPerGroup: number;
  readonly jobTimeout: number;
  /** The container override environment of every convert-group and finalize job execution. */
  readonly jobEnv: readonly { readonly name: string; readonly value: string }[];
}

export type JobPhase = "plan" | "convert-group" | "finalize";

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
 * Failure reports are keyed by the job execution that wrote them, never shared: every task of every execution
 * writes its own object under `failures/<attempt>/`, where `<attempt>` is the id the workflow passed for this one
 * job execution (ORBAX2REG_ATTEMPT, a fresh UUID per start) or, when a job is run by hand, Cloud Run's own
 * execution name (CLOUD_RUN_EXECUTION). So the workflow lists exactly the reports of the execution it just ran:
 * no later task can delete an earlier one's report, and no report of an older run can be mistaken for a new one.
 * The verdict is the first part of the object name (`permanent.` / `transient.`), so the workflow can decide
 * by listing a prefix, without parsing anything.
 */
export const ATTEMPT_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$/;

/**
 * Every report of one job execution: the prefix the workflow lists. `under` is the directory the reports go
 * in: the step's work directory (`.orbax2reg`, relative to the step) by default, "" for the plan job's
 * reports in a run directory (runDirKey).
 */
export function failuresPrefix(attempt: string, under: string = WORK_DIR): string {
  if (!ATTEMPT_PATTERN.test(attempt)) throw new Error(`invalid attempt id ${JSON.stringify(attempt)}`);
  return `${joinKey(under, "failures", attempt)}/`;
}

/** Where one task attempt of one job execution explains its failure. */
export function failureKey(
  attempt: string,
  r: { readonly permanent: boolean; readonly task: number; readonly taskAttempt: number },
  under: string = WORK_DIR,
): string {
  return `${failuresPrefix(attempt, under)}${r.permanent ? "permanent" : "transient"}.task-${r.task}.attempt-${r.taskAttempt}.json`;
}

export interface FailureReport {
  readonly phase: JobPhase;
  readonly group: number | null;
  /** CLOUD_RUN_TASK_INDEX and CLOUD_RUN_TASK_ATTEMPT of the task that failed. */
  readonly task: number;
  readonly taskAttempt: number;
  /** The workflow's id for this job execution (or Cloud Run's execution name when run by hand). */
  readonly attempt: string;
  /** CLOUD_RUN_EXECUTION, for finding the execution's logs. */
  readonly execution: string | null;
  /** True when the input or configuration is wrong: retrying cannot help, so the workflow does not. */
  readonly permanent: boolean;
  /** The error class, e.g. FormatError. */
  readonly errorType: string;
  /** One line naming the file, key or field. */
  readonly message: string;
  readonly time: string;
}

/**
 * Progress records: every task of every job keeps one small object up to date while it runs, so that
 * `orbax2reg cloud status` can tell converted / running (groups done, bytes so far) / failed without asking
 * Cloud Run. One object per phase part, overwritten in place: `plan.json`, `group-<g>.task-<t>.json`,
 * `finalize.json`. A later run of the same part overwrites the earlier one's record.
 */
export const PROGRESS_PREFIX = `${WORK_DIR}/progress/`;

const isIndex = (n: number) => Number.isSafeInteger(n) && n >= 0;

/** Where one task of one phase (and group, for convert-group) keeps its progress record. */
export function progressKey(phase: JobPhase, group: number | null, task: number): string {
  if (!isIndex(task)) throw new Error(`invalid task index ${task}`);
  if (phase === "convert-group") {
    if (group === null || !isIndex(group)) throw new Error(`convert-group progress needs a group, got ${group}`);
    return `${PROGRESS_PREFIX}group-${group}.task-${task}.json`;
  }
  return `${PROGRESS_PREFIX}${phase}.json`;
}

export interface ProgressRecord {
  readonly phase: JobPhase;
  readonly group: number | null;
  /** CLOUD_RUN_TASK_INDEX (0 outside Cloud Run). */
  readonly task: number;
  /** CLOUD_RUN_TASK_COUNT (1 outside Cloud Run). */
  readonly taskCount: number;
  /** ORBAX2REG_ATTEMPT: the workflow's id for this job execution. */
  readonly attempt: string | null;
  /** ORBAX2REG_EXECUTION: the Workflows execution that started this job execution. */
  readonly workflowExecution: string | null;
  /** Full Cloud Run execution name projects/P/locations/R/jobs/J/executions/E when known, else null. */
  readonly execution: string | null;
  /** "stopped": told to stop (SIGTERM: its execution was cancelled, or the task ran past its timeout). */
  readonly state: "running" | "succeeded" | "failed" | "stopped";
  /**
   * Objects and bytes of this task's work, and how many are done (skipped as already present counts as
   * done). Totals are null when unknown: always for plan, and for convert-group until its share is done
   * (the step's totals are in summary.json).
   */
  readonly objects: number | null;
  readonly objectsDone: number;
  readonly bytes: number | null;
  readonly bytesDone: number;
  /** RFC 3339. */
  readonly startedAt: string;
  /** RFC 3339; a running record much older than the write interval belongs to a task that died. */
  readonly updatedAt: string;
  /** The failure's one line. */
  readonly error: string | null;
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
 * bounded number of times).
 */
export async function reportFailure(env: Env, phase: JobPhase, err: Error, permanent: boolean, log: Logger): Promise<void> {
  const target = reportTarget(env, phase);
  if (!target) {
    log.warn(
      "no failure report written: the report's place (ORBAX2REG_RUN, or ORBAX2REG_DESTINATION and ORBAX2REG_STEP) or the execution id is missing",
      { phase },
    );
    return;
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
  } catch (w) {
    log.warn("could not write the failure report", { key, error: (w as Error).message });
  }
}
