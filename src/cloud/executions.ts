import { createHash } from "node:crypto";
import type { ExecutionsClient, protos } from "@google-cloud/workflows";

/**
 * Workflows executions of the conversion workflow, as the trigger function (and `orbax2reg cloud`) need
 * them: start one, and find the ones already started for a step.
 */

/** The workflow's documented argument (workflows/convert.yaml). */
export interface WorkflowArgument {
  readonly source: string;
  readonly destination: string;
  readonly step: number;
  readonly groups: number;
  /** params_only keeps only the model/ leaves; force replaces an already committed step. */
  readonly options?: { readonly params_only?: boolean; readonly force?: boolean };
}

export interface ExecutionRef {
  /** projects/P/locations/L/workflows/W/executions/ID */
  readonly name: string;
  /** ACTIVE, QUEUED, SUCCEEDED, FAILED, CANCELLED or UNAVAILABLE. */
  readonly state: string;
  /** RFC 3339; when the execution was created. */
  readonly startTime: string;
  /** RFC 3339; when it finished, if it has. */
  readonly endTime?: string;
  /** The JSON argument it was started with. */
  readonly argument: string;
  /** For a failed execution, the error payload (JSON). */
  readonly error?: string;
  /** For a succeeded one, its result (JSON). */
  readonly result?: string;
}

export interface Executions {
  /** Starts an execution; returns its name. */
  start(workflow: string, argument: WorkflowArgument, labels: Record<string, string>): Promise<string>;
  /** Executions of `workflow` carrying all of `labels`, newest first; at most 100. */
  find(workflow: string, labels: Record<string, string>): Promise<ExecutionRef[]>;
  /** One execution by name. */
  get(name: string): Promise<ExecutionRef>;
  /** Cancels a running execution; its state afterwards. */
  cancel(name: string): Promise<ExecutionRef>;
}

/** An execution that may still do work: running, or queued behind the workflow's concurrency limit. */
export const isLive = (e: ExecutionRef): boolean => e.state === "ACTIVE" || e.state === "QUEUED";

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
export function labelFilter(labels: Record<string, string>): string {
  return Object.entries(labels)
    .map(([k, v]) => `labels.${k}="${v}"`)
    .join(" AND ");
}

/**
 * Per-call deadlines, well inside the function's default 60 s timeout so that after a failed start there is
 * still time to look the execution up and release the claim. (The client's own default is 60 s per call,
 * and it retries none of these methods: executions_client_config.json marks them all non-idempotent.)
 */
const START_TIMEOUT_MS = 20_000;
const LIST_TIMEOUT_MS = 10_000;

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
    async find(workflow, labels) {
      // Listing is safe to repeat: a few quick tries ride out a blip.
      let found: protos.google.cloud.workflows.executions.v1.IExecution[] = [];
      for (let attempt = 1; ; attempt++) {
        try {
          // One page, newest first: a step has a handful of executions at most.
          [found] = await client.listExecutions(
            { parent: workflow, filter: labelFilter(labels), pageSize: 100 },
            { timeout: LIST_TIMEOUT_MS, autoPaginate: false },
          );
          break;
        } catch (e) {
          if (attempt >= 3) throw e;
          await new Promise((r) => setTimeout(r, 500 * attempt));
        }
      }
      return found.filter((e) => e.name).map(ref);
    },
    async get(name) {
      const [e] = await client.getExecution({ name }, { timeout: LIST_TIMEOUT_MS });
      return ref(e);
    },
    async cancel(name) {
      // https://cloud.google.com/workflows/docs/reference/executions/rest/v1/projects.locations.workflows.executions/cancel
      const [e] = await client.cancelExecution({ name }, { timeout: LIST_TIMEOUT_MS });
      return ref(e);
    },
  };
}

function ref(e: protos.google.cloud.workflows.executions.v1.IExecution): ExecutionRef {
  return {
    name: e.name ?? "",
    state: String(e.state ?? "STATE_UNSPECIFIED"),
    startTime: timestamp(e.startTime),
    ...(e.endTime ? { endTime: timestamp(e.endTime) } : {}),
    argument: e.argument ?? "",
    ...(e.error?.payload ? { error: e.error.payload } : {}),
    ...(e.result ? { result: e.result } : {}),
  };
}

/**
 * Errors from the Workflows API that a retry cannot fix: the request itself is wrong (INVALID_ARGUMENT,
 * FAILED_PRECONDITION) or the workflow does not exist (NOT_FOUND). gRPC codes; the REST fallback maps
 * HTTP statuses onto them.
 */
export function isPermanentApiError(e: unknown): boolean {
  const code = (e as { code?: unknown }).code;
  return code === 3 || code === 5 || code === 9 || code === 400 || code === 404;
}

function timestamp(t: { seconds?: unknown; nanos?: unknown } | string | null | undefined): string {
  if (typeof t === "string") return t;
  if (t && t.seconds !== undefined && t.seconds !== null) {
    return new Date(Number(t.seconds) * 1000 + Math.floor(Number(t.nanos ?? 0) / 1e6)).toISOString();
  }
  return new Date(0).toISOString();
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
