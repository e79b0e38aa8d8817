import type { JobPhase } from "../../convert/work-dir.js";
import { classify, EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_STOPPED, StoppedError, UsageError } from "../../errors.js";
import { observeRetries, type RetryNotice, retryStats } from "../../store/retry.js";
import type * as fromEnv from "../api/env.js";
import { jsonLogger, type Logger } from "../api/log.js";
import { jobLogFields, runPhase } from "./phases.js";
import { type JobOptions, Progress } from "./progress.js";
import { recordedGroup, reportFailure } from "./reports.js";

/**
 * One Cloud Run job task (jobs/main.ts launches it): runs one phase (src/cloud/job/phases.ts: configuration
 * from the environment the workflow sets through container overrides, then the engine the CLI uses) and
 * reports how it ended: an exit code, a progress record, and on failure a report saying whether a retry can
 * help. Logs are single-line JSON for Cloud Logging.
 */

const PHASES: readonly JobPhase[] = ["plan", "convert-group", "finalize", "export-begin", "export-shards", "export-finalize"];
const isPhase = (p: string | undefined): p is JobPhase => PHASES.includes(p as JobPhase);

/**
 * How long a stopped task gives its progress record to land. Cloud Run sends SIGTERM when a job execution is
 * cancelled or a task runs past its timeout, and SIGKILL 10 s later
 * (https://cloud.google.com/run/docs/container-contract): the exit must come well before that.
 */
export const STOP_RECORD_MS = 5_000;

export interface RunOptions extends JobOptions {
  /**
   * Aborted when the task must stop: runJob then returns EXIT_STOPPED at once, with the progress record
   * marked "stopped" (within STOP_RECORD_MS) and no failure report; the phase's own work is abandoned (the
   * process exits) and finalize no longer writes the index.
   */
  readonly stop?: AbortSignal;
}

/**
 * Runs one phase; returns the process exit code. On failure it leaves a report the workflow reads to decide
 * whether a retry can help (src/cloud/job/reports.ts, reportFailure). A permanent failure reported to the workflow
 * that started this execution exits 0, so that Cloud Run does not retry it; otherwise permanent exits 2, transient 1.
 */
export async function runJob(
  phase: string | undefined,
  env: fromEnv.Env,
  log: Logger = jsonLogger({ component: "orbax2reg-job" }),
  options: RunOptions = {},
): Promise<number> {
  const started = Date.now();
  const progress = isPhase(phase) ? new Progress(phase, env, started, log, options) : undefined;
  const { stop } = options;
  const unobserve = observeRetries(retryWarnings(log.with({ phase })));
  try {
    if (!isPhase(phase) || progress === undefined)
      throw new UsageError(`unknown phase ${JSON.stringify(phase)} (expected ${PHASES.join(", ")})`);
    stop?.throwIfAborted();
    progress.write();
    const work = runPhase(phase, env, log, started, progress, stop);
    if (stop !== undefined) {
      work.catch(() => {}); // once stopped, how the abandoned work ends is nobody's concern
      await Promise.race([work, stopped(stop)]);
    } else await work;
    await progress.finish("succeeded", null);
    return 0;
  } catch (e) {
    if (stop?.aborted) {
      // Whoever stopped the task has said so in the log (main's one line); the record says so too.
      const reason = stop.reason instanceof Error ? stop.reason : new StoppedError("stopped");
      await within(STOP_RECORD_MS, progress?.finish("stopped", reason));
      return EXIT_STOPPED;
    }
    // What the error's class says (src/errors.ts): a fault no retry can help is permanent (exit 2); anything
    // else may be transient (exit 1). A job's exit code is only that verdict, which is what the workflow reads.
    const err = e as Error;
    const { retryable, line, kind: errorKind } = classify(e);
    const permanent = !retryable;
    const group = isPhase(phase) ? recordedGroup(phase, env) : null;
    log.error(line, {
      phase,
      group,
      permanent,
      errorType: err.name,
      errorKind,
      seconds: (Date.now() - started) / 1000,
      storageRetries: retryStats(),
    });
    // Side by side, each within its own short deadline (reports.ts, RECORD_RETRY_DEADLINE_MS).
    const [report] = await Promise.all([
      isPhase(phase) ? reportFailure(env, phase, err, permanent, log) : undefined,
      progress?.finish("failed", err),
    ]);
    if (permanent && report !== undefined && env.ORBAX2REG_ATTEMPT) {
      // Cloud Run counts a task that exits non-zero as failed (https://cloud.google.com/run/docs/container-contract#jobs)
      // and restarts it up to the job's max_retries times, each attempt up to task_timeout
      // (https://cloud.google.com/run/docs/configuring/max-retries, .../configuring/task-timeout), which no retry of a
      // permanent fault can help. The workflow that started this execution (ORBAX2REG_ATTEMPT) reads its permanent
      // reports once it ends, succeeded or not (workflows/convert.yaml, run_execution), and fails the conversion with
      // this message: so the task ends here, with a line saying why its exit code is 0.
      log.info("exiting 0 so that Cloud Run does not retry a permanent failure: the workflow reads the report and fails the conversion", {
        phase,
        group,
        permanent,
        report,
        exitCode: 0,
      });
      return 0;
    }
    return permanent ? EXIT_BAD_INPUT : EXIT_FAILURE;
  } finally {
    unobserve();
  }
}

/** Retry warnings after the first: at most one line per this interval, counting the retries between. */
export const RETRY_WARNING_EVERY_MS = 60_000;

/**
 * Storage retries are silent (a phase retries each request for up to 2 minutes, src/store/retry.ts): a
 * task whose storage is unreachable would say nothing for minutes. The first failed attempt is logged at
 * once, at WARNING, then at most one line a minute while requests keep failing.
 */
function retryWarnings(log: Logger): (n: RetryNotice) => void {
  let lastWarning: number | undefined;
  let since = 0;
  return (n) => {
    since++;
    const now = Date.now();
    if (lastWarning !== undefined && now - lastWarning < RETRY_WARNING_EVERY_MS) return;
    const first = lastWarning === undefined;
    log.warn(first ? `storage request failed; retrying: ${n.message}` : `storage requests still failing; retrying: ${n.message}`, {
      what: n.what,
      path: n.path,
      kind: n.kind,
      retry: n.retry,
      retryForSeconds: n.deadlineMs / 1000,
      ...(first ? {} : { retriesSinceLastWarning: since }),
    });
    lastWarning = now;
    since = 0;
  };
}

/** The job process: `node dist/jobs/main.js PHASE`, the environment as the workflow and Cloud Run set it. */
export async function main(argv: readonly string[]): Promise<void> {
  const phase = argv[0];
  const log = jsonLogger({ component: "orbax2reg-job", ...jobLogFields(process.env) });
  // Last resorts, so that no task ends without a log line: an error nobody awaited, or an event loop that
  // empties while the phase still waits (Node would exit 13 silently). Both exit 1, which the workflow retries.
  let settled = false;
  process.on("unhandledRejection", (e) => {
    log.error(`unexpected error: ${e instanceof Error ? e.message : String(e)}`, { phase, permanent: false, storageRetries: retryStats() });
    process.exit(1);
  });
  process.on("exit", () => {
    if (settled) return;
    log.error("the phase stopped while still waiting for an operation to finish", { phase, permanent: false });
    process.exitCode = 1;
  });
  // Cloud Run stops a task with SIGTERM (https://cloud.google.com/run/docs/container-contract), which Node,
  // as PID 1 without a handler, would ignore until the SIGKILL 10 s later: no log line, the record left
  // "running". Once: a second SIGTERM ends the process at once.
  const stop = new AbortController();
  process.once("SIGTERM", () => {
    const why = "SIGTERM: the job execution was cancelled or the task ran past its timeout";
    log.warn(`stopping (${why}); work in flight is abandoned, nothing is committed`, { phase, permanent: false });
    stop.abort(new StoppedError(`stopped by ${why}`));
  });
  const code = await runJob(phase, process.env, log, { stop: stop.signal });
  settled = true;
  // Stopped: the abandoned work may still hold requests and timers; exit now rather than when they end.
  if (code === EXIT_STOPPED) process.exit(code);
  process.exitCode = code;
}

/** Rejects with the signal's reason once it is aborted. */
function stopped(signal: AbortSignal): Promise<never> {
  return new Promise((_, reject) => {
    if (signal.aborted) reject(signal.reason);
    else signal.addEventListener("abort", () => reject(signal.reason), { once: true });
  });
}

/** Waits for `work`, but no longer than `ms`. */
async function within(ms: number, work: Promise<void> | undefined): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  await Promise.race([work, new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  clearTimeout(timer);
}
