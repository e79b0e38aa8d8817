import { WORK_DIR } from "../convert/plan-format.js";

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

export type JobPhase = "plan" | "convert-group" | "finalize";

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

/** Every report of one job execution: the prefix the workflow lists. */
export function failuresPrefix(attempt: string): string {
  if (!ATTEMPT_PATTERN.test(attempt)) throw new Error(`invalid attempt id ${JSON.stringify(attempt)}`);
  return `${WORK_DIR}/failures/${attempt}/`;
}

/** Where one task attempt of one job execution explains its failure. */
export function failureKey(
  attempt: string,
  r: { readonly permanent: boolean; readonly task: number; readonly taskAttempt: number },
): string {
  return `${failuresPrefix(attempt)}${r.permanent ? "permanent" : "transient"}.task-${r.task}.attempt-${r.taskAttempt}.json`;
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
