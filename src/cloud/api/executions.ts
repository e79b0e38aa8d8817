import { createHash } from "node:crypto";
import type { ExecutionsClient, protos } from "@google-cloud/workflows";
import { type CallRetry, isPermanent, retryCall } from "./grpc.js";
import { rfc3339 } from "./timestamp.js";

/**
 * Workflows executions of the conversion workflow, as the trigger function (and `orbax2reg cloud`) need
 * them: start one, and find the ones already started for a step.
 */

/**
 * The workflow's documented argument as it is sent (workflows/convert.yaml); the plan job checks it and
 * fills in the rest (src/cloud/job/workflow-argument.ts, CheckedArgument).
 */
export interface WorkflowArgument {
  readonly source: string;
  readonly destination: string;
  readonly step: number;
  readonly groups: number;
  readonly tasks_per_group?: number;
  /** Seconds the workflow waits for one job execution. */
  readonly job_timeout?: number;
  /** params_only keeps only the model/ leaves and prng_key; force replaces an already committed step. */
  readonly options?: { readonly params_only?: boolean; readonly force?: boolean };
  /** false: only the export is made (from the Orbax source); absent or true: the step is converted. */
  readonly convert?: boolean;
  /** A Hugging Face export of the step (src/cloud/job/workflow-argument.ts, CheckedExport, reads it). */
  readonly export?: WorkflowExport;
}

/** The argument's "export": only destination is required. */
export interface WorkflowExport {
  readonly destination: string;
  readonly dtype?: "bfloat16" | "float32";
  /** A gs:// tokenizer file or "none"; absent: the vocabulary's own. */
  readonly tokenizer?: string;
  /** Bytes, or a size such as "5GB". */
  readonly max_shard_size?: number | string;
  readonly tasks?: number;
  readonly force?: boolean;
}

/**
 * An execution as executions.list gives it in its BASIC view, the default: "name, startTime, endTime, duration,
 * state, and workflowRevisionId" and nothing else: no argument, labels, result or error
 * (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/ExecutionView).
 */
export interface ExecutionSummary {
  /** projects/P/locations/L/workflows/W/executions/ID */
  readonly name: string;
  /** ACTIVE, QUEUED, SUCCEEDED, FAILED, CANCELLED or UNAVAILABLE. */
  readonly state: string;
  /** RFC 3339; when it began running. Absent while it waits QUEUED in the backlog. */
  readonly startTime?: string;
  /** RFC 3339; when it finished, if it has. */
  readonly endTime?: string;
}

/** An execution in the FULL view: what executions.get gives by default, and executions.list only when asked. */
export interface ExecutionRef extends ExecutionSummary {
  /** The JSON argument it was started with. */
  readonly argument: string;
  readonly labels: Readonly<Record<string, string>>;
  /** For a failed execution, the error payload (JSON). */
  readonly error?: string;
  /** For a succeeded one, its result (JSON). */
  readonly result?: string;
}

export interface FindOptions {
  /** Only executions created at or after this time (RFC 3339): a createTime filter, evaluated by the API. */
  readonly createdSince?: string;
}

export interface Executions {
  /** Starts an execution; returns its name. */
  start(workflow: string, argument: WorkflowArgument, labels: Record<string, string>): Promise<string>;
  /** Executions of `workflow` carrying all of `labels` (BASIC view), newest created first, every page. */
  find(workflow: string, labels: Record<string, string>, options?: FindOptions): Promise<ExecutionSummary[]>;
  /** The same in the FULL view (pages of at most 100, so more requests): for when arguments or results are needed. */
  findFull(workflow: string, labels: Record<string, string>, options?: FindOptions): Promise<ExecutionRef[]>;
  /** One execution by name (FULL view). */
  get(name: string): Promise<ExecutionRef>;
  /** Cancels a running execution; its state afterwards. */
  cancel(name: string): Promise<ExecutionSummary>;
}

/** An execution that may still do work: running, or queued behind the workflow's concurrency limit. */
export const isLive = (e: ExecutionSummary): boolean => e.state === "ACTIVE" || e.state === "QUEUED";

/**
 * Labels that identify a step's conversion: its number, and a short hash of the checkpoint root it came
 * from (two training runs in one bucket share step numbers). Label values allow only lowercase letters,
 * digits, '_' and '-', at most 63 characters
 * (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions#Execution).
 */
export function executionLabels(source: string, step: number): Record<string, string> {
  const root = source.replace(/\/+$/, "").replace(/\/[^/]*$/, "");
  return { step: String(step), source: rootLabel(root) };
}

/** The `source` label of every execution converting a step of checkpoint root `root` (gs://bucket/path). */
export function rootLabel(root: string): string {
  return createHash("sha256").update(root).digest("hex").slice(0, 16);
}

/**
 * AIP-160 filter on labels, as executions.list takes it
 * (https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/list:
 * "The following fields are supported for filtering: ... label ...").
 */
export function labelFilter(labels: Record<string, string>, options: FindOptions = {}): string {
  const terms = Object.entries(labels).map(([k, v]) => `labels.${k}="${v}"`);
  // createTime, not startTime: a backlogged (QUEUED) execution has no startTime yet. The same page lists
  // createTime among the fields executions can be filtered and ordered by.
  if (options.createdSince !== undefined) {
    if (Number.isNaN(Date.parse(options.createdSince))) throw new Error(`not an RFC 3339 time: ${options.createdSince}`);
    terms.push(`createTime>="${options.createdSince}"`);
  }
  return terms.join(" AND ");
}

/**
 * Page sizes of executions.list: "Max supported value depends on the selected Execution view: it's 1000 for
 * BASIC and 100 for FULL ... Values greater than the max value will be coerced down to it" (same page).
 */
export const LIST_PAGE_SIZE = { BASIC: 1000, FULL: 100 } as const;
/** Pages read at most for one listing (a runaway page token must not loop forever): 100,000 FULL executions. */
const MAX_PAGES = 1000;

/**
 * Per-call deadlines, well inside the function's default 60 s timeout so that after a failed start there is
 * still time to look the execution up and release the claim. (The client's own default is 60 s per call,
 * and it retries none of these methods: executions_client_config.json marks them all non-idempotent.)
 */
const START_TIMEOUT_MS = 20_000;
const LIST_TIMEOUT_MS = 10_000;
/** A list page: three tries, 0.5 s then 1 s apart, unless the request itself is wrong (see grpc.ts). */
const LIST_RETRY: CallRetry = { tries: 3, delayMs: (n) => 500 * n, retryable: (e) => !isPermanent(e) };

/** Executions through @google-cloud/workflows. */
export function workflowsExecutions(client: ExecutionsClient): Executions {
  return {
    async start(workflow, argument, labels) {
      // Never retried here: a retry after a lost answer would start a second execution. The caller looks
      // the execution up by its labels instead.
      const [execution] = await client.createExecution(
        { parent: workflow, execution: { argument: JSON.stringify(argument), labels } },
        { timeout: START_TIMEOUT_MS },
      );
      if (!execution.name) throw new Error(`createExecution on ${workflow} returned no execution name`);
      return execution.name;
    },
    find: (workflow, labels, options) => list(client, "BASIC", workflow, labels, options),
    findFull: (workflow, labels, options) => list(client, "FULL", workflow, labels, options) as Promise<ExecutionRef[]>,
    async get(name) {
      // FULL is get's default; asked for all the same, since the argument and result are what callers read.
      const [e] = await client.getExecution({ name, view: "FULL" }, { timeout: LIST_TIMEOUT_MS });
      return ref(e);
    },
    async cancel(name) {
      // https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/cancel
      const [e] = await client.cancelExecution({ name }, { timeout: LIST_TIMEOUT_MS });
      return summary(e);
    },
  };
}

type IExecution = protos.google.cloud.workflows.executions.v1.IExecution;

/**
 * Every page of executions.list for `labels`, newest created first. Each page is its own request, retried a
 * few times (listing is safe to repeat); the next page is asked with the same parameters and the page token,
 * as the API requires ("all other parameters provided to executions.list must match").
 */
async function list(
  client: ExecutionsClient,
  view: "BASIC" | "FULL",
  workflow: string,
  labels: Record<string, string>,
  options: FindOptions = {},
): Promise<ExecutionSummary[]> {
  const out: ExecutionSummary[] = [];
  let request: protos.google.cloud.workflows.executions.v1.IListExecutionsRequest = {
    parent: workflow,
    filter: labelFilter(labels, options),
    orderBy: "createTime desc",
    pageSize: LIST_PAGE_SIZE[view],
    view,
  };
  for (let page = 1; ; page++) {
    const asked = request;
    const [found, next] = await retryCall(
      () => client.listExecutions(asked, { timeout: LIST_TIMEOUT_MS, autoPaginate: false }),
      LIST_RETRY,
    );
    for (const e of found) if (e.name) out.push(view === "FULL" ? ref(e) : summary(e));
    if (!next?.pageToken) return out;
    if (page >= MAX_PAGES) throw new Error(`executions.list of ${workflow}: more than ${MAX_PAGES} pages`);
    request = { ...request, pageToken: next.pageToken };
  }
}

/** Only what the BASIC view carries, so that nothing can read a field the API did not send. */
function summary(e: IExecution): ExecutionSummary {
  const startTime = rfc3339(e.startTime);
  const endTime = rfc3339(e.endTime);
  return {
    name: e.name ?? "",
    state: String(e.state ?? "STATE_UNSPECIFIED"),
    ...(startTime !== null ? { startTime } : {}),
    ...(endTime !== null ? { endTime } : {}),
  };
}

function ref(e: IExecution): ExecutionRef {
  return {
    ...summary(e),
    argument: e.argument ?? "",
    labels: { ...(e.labels ?? {}) },
    ...(e.error?.payload ? { error: e.error.payload } : {}),
    ...(e.result ? { result: e.result } : {}),
  };
}

/**
 * A Workflows Executions client. `endpoint` (http://host:port, from ORBAX2REG_WORKFLOWS_ENDPOINT) points it
 * at a local emulator's REST API instead of Google's.
 */
export async function executionsClient(endpoint?: string): Promise<ExecutionsClient> {
  const { ExecutionsClient } = await import("@google-cloud/workflows");
  if (!endpoint) return new ExecutionsClient();
  return new ExecutionsClient((await emulatorClientOptions(endpoint)) as ConstructorParameters<typeof ExecutionsClient>[0]);
}

/**
 * Options for a google-gax client that talks REST to a local stand-in at `endpoint` (http://host:port),
 * without credentials: the Workflows emulator, the Cloud Run Admin API stand-in.
 */
export async function emulatorClientOptions(endpoint: string): Promise<object> {
  const url = new URL(endpoint);
  const { PassThroughClient } = await import("google-auth-library");
  return {
    fallback: true,
    protocol: url.protocol.replace(":", ""),
    apiEndpoint: url.hostname,
    port: Number(url.port),
    authClient: new PassThroughClient(),
  };
}
