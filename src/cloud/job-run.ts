import { Orbax2RegError, UsageError } from "../errors.js";
import { retryStats } from "../store/retry.js";
import type * as fromEnv from "./env.js";
import { jobLogFields, runPhase } from "./job-phases.js";
import { type JobOptions, Progress } from "./job-progress.js";
import { type JobPhase, reportFailure } from "./job-reports.js";
import { jsonLogger, type Logger } from "./log.js";

/**
 * One Cloud Run job task (jobs/main.ts launches it): runs one phase (src/cloud/job-phases.ts: configuration
 * from the environment the workflow sets through container overrides, then the engine the CLI uses) and
 * reports how it ended: an exit code, a progress record, and on failure a report saying whether a retry can
 * help. Logs are single-line JSON for Cloud Logging.
 */

const PHASES: readonly JobPhase[] = ["plan", "convert-group", "finalize"];
const isPhase = (p: string | undefined): p is JobPhase => PHASES.includes(p as JobPhase);

/**
 * Runs one phase; returns the process exit code. On failure it leaves a report the workflow reads to decide
 * whether a retry can help (src/cloud/job-reports.ts, reportFailure).
 */
export async function runJob(
  phase: string | undefined,
  env: fromEnv.Env,
  log: Logger = jsonLogger({ component: "orbax2reg-job" }),
  options: JobOptions = {},
): Promise<number> {
  const started = Date.now();
  const progress = isPhase(phase) ? new Progress(phase, env, started, log, options) : undefined;
  try {
    if (!isPhase(phase) || progress === undefined)
      throw new UsageError(`unknown phase ${JSON.stringify(phase)} (expected plan, convert-group or finalize)`);
    progress.write();
    await runPhase(phase, env, log, started, progress);
    await progress.finish("succeeded", null);
    return 0;
  } catch (e) {
    // Bad input is permanent (exit 2: retrying cannot help); anything else may be transient (exit 1).
    const err = e as Error;
    const permanent = e instanceof Orbax2RegError;
    log.error(err.message, { phase, permanent, errorType: err.name, seconds: (Date.now() - started) / 1000, storageRetries: retryStats() });
    if (isPhase(phase)) await reportFailure(env, phase, err, permanent, log);
    await progress?.finish("failed", err);
    return permanent ? 2 : 1;
  }
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
  process.exitCode = await runJob(phase, process.env, log);
  settled = true;
}
