import { type PlanSummary, PROGRESS_PREFIX, type ProgressRecord, SUMMARY_KEY } from "../../convert/work-dir.js";
import { UsageError } from "../../errors.js";
import { INDEX_NAME } from "../../hf/shards.js";
import { listSteps, parseStepName, stepDirName } from "../../orbax/step.js";
import type { GcsOptions } from "../../store/gcs.js";
import { INPUT } from "../../store/open.js";
import { transientStatus } from "../../store/retry.js";
import { joinKey, readIfPresent, type Store } from "../../store/store.js";
import { mapLimited } from "../../util/budget.js";
import { type ExecutionRef, type ExecutionSummary, type Executions, isLive, rootLabel } from "../api/executions.js";
import type { JobExecutionStatus, JobExecutions } from "../api/run-executions.js";
import { parseWorkflowArgument } from "../job/workflow-argument.js";
import { StepClaim } from "../trigger/claim.js";
import { expand } from "../trigger/classify.js";

/**
 * Where each step of a checkpoint root stands in the pipeline, from what is on GCS (the step's claim, plan
 * summary, progress records and `index`) and the Workflows executions labelled with the step, and, for a
 * running step, its Cloud Run job executions.
 */
export type StepStatus =
  | {
      readonly state: "converted";
      readonly bytes: number | null;
      readonly seconds: number | null;
      readonly finishedAt: string | null;
      readonly execution: string | null;
    }
  | {
      readonly state: "running";
      readonly execution: string;
      /** The workflow execution's state: ACTIVE, or QUEUED in the backlog (not begun: no startedAt). */
      readonly executionState: string;
      readonly startedAt: string | null;
      readonly elapsedSeconds: number;
      /** From the plan summary; null until the plan job has written it. */
      readonly groups: number | null;
      readonly groupsDone: number;
      readonly bytes: number | null;
      readonly bytesDone: number;
      /** The phase the newest progress record of this run is in. */
      readonly phase: string | null;
      /** Cloud Run job executions still running (task counts, log link). */
      readonly jobs: readonly JobExecutionStatus[];
    }
  | {
      readonly state: "failed";
      readonly execution: string;
      readonly finishedAt: string | null;
      readonly phase: string | null;
      readonly group: number | null;
      readonly error: string;
      /** False when the failure says the input or configuration is wrong: running it again cannot help. */
      readonly retryable: boolean;
      readonly logUri: string | null;
      /** The run that failed only exported the step ("convert": false): it says nothing of converting it. */
      readonly exportOnly?: true;
    }
  | { readonly state: "cancelled"; readonly execution: string; readonly finishedAt: string | null; readonly exportOnly?: true }
  | { readonly state: "claimed"; readonly claimedAt: string; readonly expired: boolean }
  /**
   * Not converted, and an export alone ("convert": false) is the step's newest run: running (exporting) or done
   * (exported; the row's `export` says where and whether its folder is still there).
   */
  | {
      readonly state: "exporting";
      readonly execution: string;
      readonly executionState: string;
      readonly startedAt: string | null;
      readonly elapsedSeconds: number;
    }
  | { readonly state: "exported"; readonly execution: string; readonly finishedAt: string | null }
  | { readonly state: "not-converted"; readonly committed: boolean; readonly reason: string };

export interface StepRow {
  readonly step: number;
  /** The Orbax step (gs:// URL). */
  readonly source: string;
  /** The regular checkpoint root the step converts into. */
  readonly destination: string;
  readonly status: StepStatus;
  /** Whether the Orbax step is there and committed (an export is made from it). */
  readonly committed: boolean;
  /** The step's Hugging Face export, from the newest execution that asked for one; null when none did. */
  readonly export: ExportStatus | null;
}

/**
 * Where a step's Hugging Face export stands: `committed` once its folder has `model.safetensors.index.json` (the
 * export's finalize writes it last), else by the execution that asked for it and the export jobs' progress
 * records (in the step's work directory, as the conversion's).
 */
export type ExportStatus =
  | {
      readonly state: "committed";
      readonly destination: string;
      readonly shards: number | null;
      readonly bytes: number | null;
      /** From the export-begin job's start to the export-finalize job's end, when this run's records say. */
      readonly seconds: number | null;
      readonly finishedAt: string | null;
      readonly execution: string;
    }
  | {
      readonly state: "running";
      readonly destination: string;
      readonly execution: string;
      /** Planned shards and bytes, from export-begin's record; null until it has planned. */
      readonly shards: number | null;
      readonly shardsDone: number;
      readonly bytes: number | null;
      readonly bytesDone: number;
      readonly elapsedSeconds: number;
      /** The newest export phase of this run; null while the conversion (or the plan job) runs first. */
      readonly phase: string | null;
    }
  | {
      readonly state: "failed";
      readonly destination: string;
      readonly execution: string;
      readonly finishedAt: string | null;
      readonly phase: string | null;
      readonly error: string;
      readonly retryable: boolean;
    }
  | { readonly state: "cancelled"; readonly destination: string; readonly execution: string; readonly finishedAt: string | null }
  /** The run that asked for it succeeded, but the folder has no index now (the exports' retention pruned it). */
  | { readonly state: "pruned"; readonly destination: string; readonly execution: string };

export interface FleetDeps {
  /** `options`: INPUT for the checkpoint root, which is read (a missing bucket there is bad input, exit 2). */
  openStore(location: string, options?: GcsOptions): Promise<Store>;
  readonly executions: Executions;
  /** Cloud Run job executions; undefined: no job details. */
  readonly jobs?: JobExecutions;
  readonly workflow: string;
  readonly destinationTemplate: string;
  readonly claimLeaseMs: number;
  readonly now?: () => number;
}

/** A checkpoint root as the pipeline names its parts. */
export interface CheckpointRoot {
  /** gs://bucket/path, without a trailing slash. */
  readonly url: string;
  readonly bucket: string;
  /** The path inside the bucket ("" for the bucket's top level). */
  readonly path: string;
}

export function parseRoot(location: string): CheckpointRoot {
  const m = /^gs:\/\/([^/]+)\/*(.*?)\/*$/.exec(location);
  if (!m) throw new UsageError(`a checkpoint root is gs://BUCKET[/PATH], got ${JSON.stringify(location)}`);
  const path = (m[2] as string).replace(/\/{2,}/g, "/");
  const bucket = m[1] as string;
  return { url: path === "" ? `gs://${bucket}` : `gs://${bucket}/${path}`, bucket, path };
}

/** The Orbax step and the destination root of step `step` under `root`, as the trigger function names them. */
export function locate(root: CheckpointRoot, step: number, template: string): { source: string; destination: string } {
  return {
    source: `${root.url}/${stepDirName(step)}`,
    destination: expand(template, { bucket: root.bucket, root: root.path, step: stepDirName(step) }),
  };
}

/** Steps looked at in parallel (each costs a few small GCS reads). */
const CONCURRENCY = 8;
/** Progress records read at once for one step. */
const RECORD_READS = 8;
/** Records written this long before an execution started still count as its own (clock skew). */
const SKEW_MS = 60_000;

/**
 * The status of every step under `rootLocation` (or only `onlyStep`): steps with an Orbax directory, and,
 * when the destination root does not depend on the step, steps converted earlier whose Orbax directory is
 * gone (Orbax keeps only the last few). Sorted by step.
 */
export async function stepStatuses(rootLocation: string, onlyStep: number | undefined, deps: FleetDeps): Promise<StepRow[]> {
  const root = parseRoot(rootLocation);
  const source = await deps.openStore(root.url, INPUT);
  const committed = new Map<number, boolean>();
  for (const s of await listSteps(source)) {
    if (onlyStep === undefined || s.step === onlyStep) committed.set(s.step, (committed.get(s.step) ?? false) || s.commit.committed);
  }
  const steps = new Set<number>(committed.keys());
  if (!deps.destinationTemplate.includes("{step}")) {
    const destination = await deps.openStore(locate(root, 0, deps.destinationTemplate).destination);
    for (const dir of (await destination.listDir("")).dirs) {
      const n = parseStepName(dir);
      if (n !== undefined && (onlyStep === undefined || n === onlyStep)) steps.add(n);
    }
  }
  if (onlyStep !== undefined) steps.add(onlyStep);
  // Every execution of the root in one paged listing (FULL view: the argument names the step, the result and
  // error are what the rows show), newest created first; then each step's newest by a map, not a scan per step.
  const executions = await deps.executions.findFull(deps.workflow, { source: rootLabel(root.url) });
  const newestOf = new Map<number, ExecutionRef>();
  const newestAloneOf = new Map<number, ExecutionRef>();
  const newestExportOf = new Map<number, { execution: ExecutionRef; destination: string }>();
  const byName = new Map<string, ExecutionRef>();
  for (const e of executions) {
    byName.set(e.name, e);
    const step = executionStep(e);
    // An export alone ("convert": false) says nothing of the step's conversion: only of its export.
    if (step !== undefined && !newestOf.has(step) && converts(e)) newestOf.set(step, e);
    if (step !== undefined && !newestAloneOf.has(step) && !converts(e)) newestAloneOf.set(step, e);
    const exported = step === undefined || newestExportOf.has(step) ? undefined : exportOf(e);
    if (step !== undefined && exported !== undefined) newestExportOf.set(step, { execution: e, destination: exported });
  }
  const rows = await mapLimited([...steps], CONCURRENCY, async (step) => {
    const where = locate(root, step, deps.destinationTemplate);
    const [status, exported] = await Promise.all([
      statusOf(step, where.destination, committed.get(step), newestOf.get(step), newestAloneOf.get(step), byName, deps),
      exportStatusOf(step, where.destination, newestExportOf.get(step), deps),
    ]);
    return { step, ...where, status, committed: committed.get(step) === true, export: exported };
  });
  return rows.sort((a, b) => a.step - b.step);
}

/**
 * The step an execution converts: from its argument as its plan job reads it (also one started by hand
 * without "step"), else from its `step` label.
 */
function executionStep(e: ExecutionRef): number | undefined {
  try {
    return parseWorkflowArgument(JSON.parse(e.argument), 1).step;
  } catch {
    const label = e.labels.step;
    return label !== undefined && /^\d+$/.test(label) ? Number(label) : undefined;
  }
}

/** Whether an execution converts its step (false: an export alone); one whose argument cannot be read counts. */
function converts(e: ExecutionRef): boolean {
  try {
    return parseWorkflowArgument(JSON.parse(e.argument), 1).convert;
  } catch {
    return true;
  }
}

/** The export folder an execution's argument asks for, if any. */
function exportOf(e: ExecutionRef): string | undefined {
  try {
    return parseWorkflowArgument(JSON.parse(e.argument), 1).export?.destination;
  } catch {
    return undefined;
  }
}

async function exportStatusOf(
  step: number,
  destinationRoot: string,
  asked: { execution: ExecutionRef; destination: string } | undefined,
  deps: FleetDeps,
): Promise<ExportStatus | null> {
  if (asked === undefined) return null;
  const { execution, destination } = asked;
  const now = (deps.now ?? Date.now)();
  const [index, work] = await Promise.all([
    deps
      .openStore(destination)
      .then((s) => readJson<{ metadata?: { total_size?: number }; weight_map?: Record<string, string> }>(s, INDEX_NAME)),
    deps.openStore(destinationRoot),
  ]);
  const records = (await progressOf(work, stepDirName(step), execution)).filter((r) => r.phase.startsWith("export-"));
  const of = (phase: string) => records.find((r) => r.phase === phase);
  if (index !== undefined) {
    const begun = of("export-begin");
    const done = of("export-finalize");
    return {
      state: "committed",
      destination,
      shards: index.weight_map ? new Set(Object.values(index.weight_map)).size : null,
      bytes: index.metadata?.total_size ?? null,
      seconds:
        begun && done?.state === "succeeded" ? Math.round((Date.parse(done.updatedAt) - Date.parse(begun.startedAt)) / 100) / 10 : null,
      finishedAt: done?.state === "succeeded" ? done.updatedAt : (execution.endTime ?? null),
      execution: execution.name,
    };
  }
  if (isLive(execution)) {
    const begun = of("export-begin");
    const shardTasks = records.filter((r) => r.phase === "export-shards");
    const newest = records.reduce<ProgressRecord | undefined>((a, r) => (a === undefined || r.updatedAt > a.updatedAt ? r : a), undefined);
    return {
      state: "running",
      destination,
      execution: execution.name,
      shards: begun?.objects ?? null,
      shardsDone: shardTasks.reduce((n, r) => n + r.objectsDone, 0),
      bytes: begun?.bytes ?? null,
      bytesDone: shardTasks.reduce((n, r) => n + r.bytesDone, 0),
      elapsedSeconds: execution.startTime ? Math.max(0, Math.round((now - Date.parse(execution.startTime)) / 1000)) : 0,
      phase: newest?.phase ?? null,
    };
  }
  if (execution.state === "CANCELLED")
    return { state: "cancelled", destination, execution: execution.name, finishedAt: execution.endTime ?? null };
  if (execution.state === "SUCCEEDED") return { state: "pruned", destination, execution: execution.name };
  const payload = parseJson<WorkflowError>(execution.error);
  const culprit = records.find((r) => r.state === "failed") ?? records.find((r) => r.state === "stopped");
  return {
    state: "failed",
    destination,
    execution: execution.name,
    finishedAt: execution.endTime ?? null,
    phase: culprit?.phase ?? null,
    error: firstLine(culprit?.error ?? payload?.message ?? execution.error ?? "unknown error"),
    retryable: retryCanHelp(payload),
  };
}

async function statusOf(
  step: number,
  destinationRoot: string,
  committed: boolean | undefined,
  listed: ExecutionRef | undefined,
  alone: ExecutionRef | undefined,
  listing: ReadonlyMap<string, ExecutionRef>,
  deps: FleetDeps,
): Promise<StepStatus> {
  const now = deps.now ?? Date.now;
  const destination = await deps.openStore(destinationRoot);
  const stepDir = stepDirName(step);
  const [index, claimState] = await Promise.all([
    destination.stat(joinKey(stepDir, "index")),
    destination.versioned
      ? new StepClaim(destination, stepDir, deps.claimLeaseMs, now).read()
      : Promise.resolve({ kind: "absent" as const }),
  ]);
  // The claim names the execution the pipeline started; a newer one (started from the console) may be listed.
  // Listed, it is no newer than `listed` (the listing is newest created first); only one the listing does not
  // hold (no labels) costs a request.
  let execution = listed;
  const claimedName = claimState.kind === "started" ? (claimState.record.execution as string) : undefined;
  if (claimedName !== undefined && claimedName !== listed?.name && !listing.has(claimedName)) {
    const claimed = await deps.executions.get(claimedName).catch(() => undefined);
    if (claimed && converts(claimed) && (!execution || newer(claimed, execution))) execution = claimed;
  }

  if (execution && isLive(execution)) return running(destination, stepDir, execution, deps, now());
  if (index) {
    const summary = await readJson<PlanSummary>(destination, joinKey(stepDir, SUMMARY_KEY));
    const result =
      execution?.state === "SUCCEEDED" ? parseJson<{ bytes?: number; seconds?: { total?: number } }>(execution.result) : undefined;
    return {
      state: "converted",
      bytes: result?.bytes ?? summary?.bytes ?? null,
      seconds: result?.seconds?.total ?? null,
      finishedAt: execution?.endTime ?? null,
      execution: execution?.name ?? null,
    };
  }
  if (execution?.state === "FAILED") return failed(destination, stepDir, execution, deps);
  if (execution?.state === "CANCELLED") return { state: "cancelled", execution: execution.name, finishedAt: execution.endTime ?? null };
  if (claimState.kind === "pending") return { state: "claimed", claimedAt: claimState.record.claimedAt, expired: claimState.expired };
  // Not converted: an export alone newer than any conversion is what the step's last run did.
  if (alone !== undefined && (execution === undefined || newer(alone, execution))) {
    const shown = await exportAlone(destination, stepDir, alone, deps, now());
    if (shown !== undefined) return shown;
  }
  const reason =
    committed === undefined
      ? "no Orbax step directory"
      : !committed
        ? "the Orbax step is not committed"
        : execution?.state === "SUCCEEDED"
          ? "converted once, since deleted"
          : "never started";
  return { state: "not-converted", committed: committed === true, reason };
}

/** A step's newest run when it only exported the step, as the step's status; undefined for a state that says nothing. */
async function exportAlone(
  destination: Store,
  stepDir: string,
  execution: ExecutionRef,
  deps: FleetDeps,
  now: number,
): Promise<StepStatus | undefined> {
  if (isLive(execution))
    return {
      state: "exporting",
      execution: execution.name,
      executionState: execution.state,
      startedAt: execution.startTime ?? null,
      elapsedSeconds: execution.startTime ? Math.max(0, Math.round((now - Date.parse(execution.startTime)) / 1000)) : 0,
    };
  if (execution.state === "SUCCEEDED") return { state: "exported", execution: execution.name, finishedAt: execution.endTime ?? null };
  if (execution.state === "FAILED") return { ...(await failed(destination, stepDir, execution, deps)), exportOnly: true };
  if (execution.state === "CANCELLED")
    return { state: "cancelled", execution: execution.name, finishedAt: execution.endTime ?? null, exportOnly: true };
  return undefined;
}

async function running(destination: Store, stepDir: string, execution: ExecutionRef, deps: FleetDeps, now: number): Promise<StepStatus> {
  const summary = await readJson<PlanSummary>(destination, joinKey(stepDir, SUMMARY_KEY));
  const records = await progressOf(destination, stepDir, execution);
  const groups = summary?.groups ?? null;
  const perGroup = new Map<number, ProgressRecord[]>();
  for (const r of records)
    if (r.phase === "convert-group" && r.group !== null) perGroup.set(r.group, [...(perGroup.get(r.group) ?? []), r]);
  const groupsDone = [...perGroup.values()].filter(
    (rs) => rs.length >= (rs[0]?.taskCount ?? 1) && rs.every((r) => r.state === "succeeded"),
  ).length;
  const newest = records.reduce<ProgressRecord | undefined>((a, r) => (a === undefined || r.updatedAt > a.updatedAt ? r : a), undefined);
  const jobNames = [...new Set(records.filter((r) => r.state === "running" && r.execution).map((r) => r.execution as string))];
  const jobs = deps.jobs ? (await Promise.all(jobNames.map((n) => deps.jobs?.get(n).catch(() => undefined)))).filter(isDefined) : [];
  return {
    state: "running",
    execution: execution.name,
    executionState: execution.state,
    // A QUEUED execution has not begun: no startTime, nothing elapsed.
    startedAt: execution.startTime ?? null,
    elapsedSeconds: execution.startTime ? Math.max(0, Math.round((now - Date.parse(execution.startTime)) / 1000)) : 0,
    groups,
    groupsDone,
    bytes: summary?.bytes ?? null,
    bytesDone: records.filter((r) => r.phase === "convert-group").reduce((s, r) => s + r.bytesDone, 0),
    phase: newest?.phase ?? null,
    jobs: jobs.filter((j) => !j.done),
  };
}

async function failed(
  destination: Store,
  stepDir: string,
  execution: ExecutionRef,
  deps: FleetDeps,
): Promise<Extract<StepStatus, { state: "failed" }>> {
  const payload = parseJson<WorkflowError>(execution.error);
  const records = await progressOf(destination, stepDir, execution);
  // The newest task that failed; else the newest one told to stop (its job execution was cancelled or ran
  // past its task timeout, and the workflow gave up on it), which says more than the workflow's own error.
  const newestOf = (state: ProgressRecord["state"]) =>
    records
      .filter((r) => r.state === state)
      .reduce<ProgressRecord | undefined>((a, r) => (a === undefined || r.updatedAt > a.updatedAt ? r : a), undefined);
  const culprit = newestOf("failed") ?? newestOf("stopped");
  const job = culprit?.execution && deps.jobs ? await deps.jobs.get(culprit.execution).catch(() => undefined) : undefined;
  return {
    state: "failed",
    execution: execution.name,
    finishedAt: execution.endTime ?? null,
    phase: culprit?.phase ?? null,
    group: culprit?.group ?? null,
    error:
      culprit?.state === "stopped"
        ? stoppedLine(culprit)
        : firstLine(culprit?.error ?? payload?.message ?? execution.error ?? "unknown error"),
    retryable: retryCanHelp(payload),
    logUri: job?.logUri ?? null,
  };
}

/** A stopped task's record as one line: who stopped and what that means (Cloud Run's SIGTERM). */
function stoppedLine(r: ProgressRecord): string {
  const task = r.group === null ? r.phase : `group ${r.group} task ${r.task}`;
  return `${task} ${firstLine(r.error ?? "stopped")}: its job execution was cancelled or ran past its task timeout`;
}

/** The error a failed execution ends with (workflows/convert.yaml raises the connector's or its own). */
export interface WorkflowError {
  readonly message?: string;
  readonly tags?: readonly string[];
  /** The HTTP status of an HttpError raised by a connector. */
  readonly code?: number;
}

/**
 * Whether running the conversion again may succeed: not when the input or configuration is wrong
 * (PermanentError from a job, ValueError from the workflow), nor when an API refused the request itself (an
 * HTTP 4xx other than 408 and 429: permission, a job that does not exist, a malformed request), which only a
 * redeploy fixes. The workflow's own retry predicate draws the same line for a single call.
 */
export function retryCanHelp(error: WorkflowError | undefined): boolean {
  const tags = error?.tags ?? [];
  if (tags.includes("PermanentError") || tags.includes("ValueError")) return false;
  const code = error?.code ?? 0;
  return !(tags.includes("HttpError") && code >= 400 && !transientStatus(code));
}

/** The progress records written for `execution`'s run (older runs' records are left out by their time). */
async function progressOf(destination: Store, stepDir: string, execution: ExecutionRef): Promise<ProgressRecord[]> {
  // A queued execution has written nothing yet: every record there is an earlier run's.
  if (!execution.startTime) return [];
  const since = Date.parse(execution.startTime) - SKEW_MS;
  return (await progressRecords(destination, stepDir)).filter((r) => !(Date.parse(r.updatedAt) < since));
}

/** Every job's progress record in a destination step (one being rewritten or damaged is left out). */
export async function progressRecords(store: Store, stepDir: string): Promise<ProgressRecord[]> {
  const keys: string[] = [];
  for await (const o of store.list(`${joinKey(stepDir, PROGRESS_PREFIX)}/`)) keys.push(o.key);
  // One record per job task: read a few at a time, not one after another.
  const records = await mapLimited(keys, RECORD_READS, async (key) =>
    parseJson<ProgressRecord>(new TextDecoder().decode(await store.read(key).catch(() => new Uint8Array()))),
  );
  return records.filter(isDefined);
}

/** The object parsed as JSON; undefined when it is absent or not JSON. One request: read, not stat then read. */
async function readJson<T>(store: Store, key: string): Promise<T | undefined> {
  const bytes = await readIfPresent(store, key);
  return bytes === undefined ? undefined : parseJson<T>(new TextDecoder().decode(bytes));
}

function parseJson<T>(text: string | undefined): T | undefined {
  if (text === undefined) return undefined;
  try {
    return JSON.parse(text) as T;
  } catch {
    return undefined;
  }
}

/** Whether `a` began after `b` (an execution not begun yet, QUEUED, is the newer). */
function newer(a: ExecutionSummary, b: ExecutionSummary): boolean {
  if (!a.startTime) return true;
  if (!b.startTime) return false;
  return a.startTime > b.startTime;
}

const firstLine = (s: string) => s.split("\n")[0] as string;
const isDefined = <T>(v: T | undefined): v is T => v !== undefined;
