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

/** Where a failed job explains itself; the workflow reads it to decide whether a retry can help. */
export function failureKey(phase: JobPhase, group?: number): string {
  return `${WORK_DIR}/failures/${phase === "convert-group" ? `group-${group}` : phase}.json`;
}

export interface FailureReport {
  readonly phase: JobPhase;
  readonly group: number | null;
  readonly task: number | null;
  /** True when the input or configuration is wrong: retrying cannot help, so the workflow does not. */
  readonly permanent: boolean;
  /** The error class, e.g. FormatError. */
  readonly errorType: string;
  /** One line naming the file, key or field. */
  readonly message: string;
  readonly time: string;
}
