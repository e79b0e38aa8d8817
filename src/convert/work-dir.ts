import { joinKey } from "../store/store.js";

/**
 * The work directory, `.orbax2reg/` inside a destination step (and in the destination root, for a workflow
 * execution's run directory): every key this tool and its cloud shell keep there, and the small records they
 * write, spelled once. The convert core, the Cloud Run jobs, the trigger and the operator commands import them
 * from here; workflows/convert.yaml builds some of the same keys itself (test/workflows/convert-yaml.test.ts
 * checks its spellings against this module). Keys are relative to the step directory unless said otherwise.
 *
 * ```
 * step_XXXXXXXX/.orbax2reg/
 *   plan.json                          the plan's head (plan-format.ts): who owns the step
 *   plans/<plan id>/group-NNNNN/part-NNNNN.json   a part of a group's objects; commit.json: the rest, written last
 *   records/<plan id>/<group>/<part>/<seg>    what was written, with sizes and CRC-32Cs (records.ts)
 *   groups/<group>[-<task>].json       a convert-group task's report
 *   claim.json                         the trigger's once-per-step claim (ClaimRecord)
 *   summary.json                       the plan job's PlanSummary, for `cloud status`
 *   progress/<part>.json               each job task's ProgressRecord
 *   failures/<attempt>/<verdict>...    each failed job task's FailureReport
 *   cancelled/<execution id>.json      `cloud cancel`'s marker: that execution's jobs stop
 * <destination>/.orbax2reg/executions/<execution id>/
 *   argument.json, plan.json (RunPlan), failures/<attempt>/...   the plan job's answer to the workflow
 *   export.json (ExportBegun)          the export-begin job's answer: the export's tasks
 * ```
 */
export const WORK_DIR = ".orbax2reg";

// ---- The plan (plan-format.ts, ownership.ts) ----------------------------------------------------------------

/** The plan's head: whoever's plan is on record here owns the step. */
export const PLAN_KEY = `${WORK_DIR}/plan.json`;
/** The parts of plan `id`. */
export const planPartsDir = (id: string) => `${WORK_DIR}/plans/${id}`;
/** Part `part` of group `group` of plan `id`: at most the plan's `partObjects` objects. */
export const planPartKey = (id: string, group: number, part: number) =>
  `${planPartsDir(id)}/group-${String(group).padStart(5, "0")}/part-${String(part).padStart(5, "0")}.json`;
export const commitPartKey = (id: string) => `${planPartsDir(id)}/commit.json`;

// ---- Records and reports of the writers (records.ts, convert.ts) ---------------------------------------------

export const RECORDS_DIR = `${WORK_DIR}/records`;
/** The records of plan `planId`, or of one part of one of its groups. */
export const recordsDir = (planId: string, part?: { readonly group: number; readonly part: number }) =>
  part === undefined ? joinKey(RECORDS_DIR, planId) : joinKey(RECORDS_DIR, planId, String(part.group), String(part.part));

/** The report of task `task` of `count` converting group `group` (one task: no task in the name). */
export const groupReportKey = (group: number, task: number, count: number) =>
  joinKey(WORK_DIR, "groups", count > 1 ? `${group}-${task}.json` : `${group}.json`);

// ---- The trigger's claim (src/cloud/trigger/claim.ts) --------------------------------------------------------

/** The trigger function's once-per-step claim; deleting it allows a re-run. */
export const CLAIM_KEY = `${WORK_DIR}/claim.json`;

/** What `claim.json` holds. */
export interface ClaimRecord {
  /** The Orbax step (gs:// URL). */
  readonly source: string;
  readonly step: number;
  /** The CloudEvent id of the delivery that claimed it. */
  readonly eventId: string | null;
  /** RFC 3339, by the claiming function's clock. */
  readonly claimedAt: string;
  /** The Workflows execution converting the step, once started. */
  readonly execution: string | null;
}

// ---- What the Cloud Run jobs leave for the workflow and `cloud status` (src/cloud/job) -----------------------

export type JobPhase = "plan" | "convert-group" | "finalize" | "export-begin" | "export-shards" | "export-finalize";

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
 * A workflow execution's own directory, `<destination>/.orbax2reg/executions/<execution id>/`, relative to the
 * destination root (the id is GOOGLE_CLOUD_WORKFLOW_EXECUTION_ID; workflows/convert.yaml builds the same and passes
 * it to the plan job as ORBAX2REG_RUN). The plan job answers there, because before it has read the argument the
 * workflow cannot know the step: `argument.json` (the argument as read, written first), `plan.json` (everything
 * the workflow needs afterwards), and the plan job's failure reports under `failures/<attempt>/`.
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
  /** False for an export alone: nothing is converted (the plan's counts are then 0). */
  readonly convert: boolean;
  /** The export the argument asks for, as the workflow runs it; null when none. */
  readonly export: RunExport | null;
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

/** What the workflow needs to run an export's three phases. */
export interface RunExport {
  /** The export's folder (gs://). */
  readonly destination: string;
  /** Where the export jobs report failures: the step's work directory, as `work`. */
  readonly work: string;
  readonly jobTimeout: number;
  /** The container override environment of every export job execution. */
  readonly jobEnv: readonly { readonly name: string; readonly value: string }[];
}

/** In the run directory: the export-begin job's answer (ExportBegun). */
export const RUN_EXPORT_KEY = "export.json";

/** What export-begin answers: the shard plan split into tasks; task I of export-shards writes assignments[I]. */
export interface ExportBegun {
  /** How many export-shards tasks to run (assignments.length; 0 when already exported). */
  readonly tasks: number;
  readonly shards: number;
  readonly totalSize: number;
  readonly alreadyExported: boolean;
  readonly assignments: readonly { readonly index: number; readonly shards: readonly string[]; readonly bytes: number }[];
}

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
  if (phase === "export-shards") return `${PROGRESS_PREFIX}export-shards.task-${task}.json`;
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

// ---- `orbax2reg cloud cancel` (src/cloud/ops/cancel.ts, src/cloud/job/cancelled.ts) ------------------------------

/** The jobs of workflow execution `workflowExecution` (a full name or its last part) stop when this is present. */
export function cancelMarkerKey(workflowExecution: string): string {
  return `${WORK_DIR}/cancelled/${workflowExecution.split("/").at(-1)}.json`;
}
