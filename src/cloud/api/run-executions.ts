import type { ExecutionsClient, protos } from "@google-cloud/run";
import { RunApiError } from "../../errors.js";
import { emulatorClientOptions } from "./executions.js";
import { type CallRetry, codeOf, isNotFound, isUnavailable, retryCall } from "./grpc.js";
import { rfc3339 } from "./timestamp.js";

/**
 * Cloud Run job executions, as `orbax2reg cloud status|cancel` need them: how many tasks of an execution run,
 * succeeded, failed or were cancelled, and cancelling one. Run Admin API v2, `projects.locations.jobs.executions`
 * (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions).
 */

export interface JobExecutionStatus {
  readonly name: string;
  readonly taskCount: number;
  readonly running: number;
  readonly succeeded: number;
  readonly failed: number;
  readonly cancelled: number;
  /** completionTime is set: the execution has finished (succeeded, failed or cancelled). */
  readonly done: boolean;
  readonly logUri: string | null;
  readonly createTime: string | null;
  readonly completionTime: string | null;
}

export interface JobExecutions {
  /** undefined when Cloud Run says NOT_FOUND. */
  get(name: string): Promise<JobExecutionStatus | undefined>;
  /** Cancels a running execution; resolves (no error) when it had already finished or is gone. */
  cancel(name: string): Promise<void>;
}

/** Per-call deadlines: a status or cancel command should answer in seconds, not the client's default minute. */
const GET_TIMEOUT_MS = 10_000;
const CANCEL_TIMEOUT_MS = 30_000;
/** get: four tries in all, 250 ms apart and doubling, while Cloud Run is unavailable or slow (see grpc.ts). */
const GET_RETRY: CallRetry = { tries: 4, delayMs: (n) => 250 * 2 ** (n - 1), retryable: isUnavailable };
/**
 * How long cancel waits for the execution to finish once Cloud Run has accepted the cancel: the operation
 * it returns completes when the tasks have stopped, which is not worth waiting for without bound.
 */
const CANCEL_WAIT_MS = 60_000;
const CANCEL_POLL_MS = 1_000;

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Job executions through @google-cloud/run's v2 ExecutionsClient. */
export function runJobExecutions(client: ExecutionsClient): JobExecutions {
  async function get(name: string): Promise<JobExecutionStatus | undefined> {
    // executions.get is safe to repeat (the client's own config retries nothing: all methods non_idempotent).
    try {
      const [execution] = await retryCall(() => client.getExecution({ name }, { timeout: GET_TIMEOUT_MS }), GET_RETRY);
      return status(execution);
    } catch (e) {
      if (isNotFound(e)) return undefined;
      throw new RunApiError("get", name, codeOf(e), e);
    }
  }

  return {
    get,
    async cancel(name) {
      // Sent once: a lost answer is settled by looking at the execution, not by cancelling again.
      // executions.cancel answers a long-running Operation whose response is the Execution
      // (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions/cancel).
      let operation: { done?: boolean | null };
      try {
        [operation] = await client.cancelExecution({ name }, { timeout: CANCEL_TIMEOUT_MS });
      } catch (e) {
        if (isNotFound(e)) return;
        // Already finished (Cloud Run refuses to cancel it), or the answer was lost: look again.
        const now = await get(name).catch(() => null);
        if (now === undefined || now?.done) return;
        throw new RunApiError("cancel", name, codeOf(e), e);
      }
      if (operation.done) return;
      // Accepted: wait a bounded time for the tasks to stop, then leave it to Cloud Run.
      const deadline = Date.now() + CANCEL_WAIT_MS;
      while (Date.now() < deadline) {
        const now = await get(name).catch(() => null);
        if (now === undefined || now?.done) return;
        await sleep(CANCEL_POLL_MS);
      }
    },
  };
}

/**
 * The fields of the v2 Execution resource that say how far it got: taskCount, runningCount, succeededCount,
 * failedCount, cancelledCount, logUri, createTime, completionTime
 * (https://cloud.google.com/run/docs/reference/rest/v2/projects.locations.jobs.executions#Execution). Counts
 * that are zero are absent in proto3 JSON, hence the defaults.
 */
function status(e: protos.google.cloud.run.v2.IExecution): JobExecutionStatus {
  const completionTime = rfc3339(e.completionTime);
  return {
    name: e.name ?? "",
    taskCount: e.taskCount ?? 0,
    running: e.runningCount ?? 0,
    succeeded: e.succeededCount ?? 0,
    failed: e.failedCount ?? 0,
    cancelled: e.cancelledCount ?? 0,
    done: completionTime !== null,
    logUri: e.logUri || null,
    createTime: rfc3339(e.createTime),
    completionTime,
  };
}

/**
 * A Run v2 Executions client. `endpoint` (http://host:port, from ORBAX2REG_RUN_ENDPOINT) points it at a local
 * stand-in (test/e2e/run-api.mjs) over the REST fallback, without credentials.
 */
export async function runExecutionsClient(endpoint?: string): Promise<ExecutionsClient> {
  const { ExecutionsClient } = await import("@google-cloud/run");
  if (!endpoint) return new ExecutionsClient();
  return new ExecutionsClient((await emulatorClientOptions(endpoint)) as ConstructorParameters<typeof ExecutionsClient>[0]);
}
