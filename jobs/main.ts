// The Cloud Run job image's entry point: `node dist/jobs/main.js plan|convert-group|finalize`.
// It runs one phase (src/cloud/job-phases.ts: configuration from the environment the workflow sets through
// container overrides, then the engine the CLI uses) and reports how it ended: an exit code, a progress
// record, and on failure a report saying whether a retry can help. Logs are single-line JSON for Cloud Logging.

import * as fromEnv from "../src/cloud/env.js";
import { runPhase } from "../src/cloud/job-phases.js";
import { type JobOptions, Progress } from "../src/cloud/job-progress.js";
import { type JobPhase, reportFailure } from "../src/cloud/job-reports.js";
import { jsonLogger, type Logger } from "../src/cloud/log.js";
import { Orbax2RegError, UsageError } from "../src/errors.js";
import { retryStats } from "../src/store/retry.js";

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

// Run when executed directly (not when imported by tests).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  // The workflow passes its execution name so every log line of a conversion can be found from it, and the
  // id of this job execution (the failure reports' key) so its lines can be told from a retry's.
  const execution = fromEnv.optionalString(process.env, "ORBAX2REG_EXECUTION", "");
  const attempt = fromEnv.optionalString(process.env, "ORBAX2REG_ATTEMPT", "");
  const log = jsonLogger({ component: "orbax2reg-job", ...(execution ? { execution } : {}), ...(attempt ? { attempt } : {}) });
  // Last resorts, so that no task ends without a log line: an error nobody awaited, or an event loop that
  // empties while the phase still waits (Node would exit 13 silently). Both exit 1, which the workflow retries.
  let settled = false;
  process.on("unhandledRejection", (e) => {
    log.error(`unexpected error: ${e instanceof Error ? e.message : String(e)}`, {
      phase: process.argv[2],
      permanent: false,
      storageRetries: retryStats(),
    });
    process.exit(1);
  });
  process.on("exit", () => {
    if (settled) return;
    log.error("the phase stopped while still waiting for an operation to finish", { phase: process.argv[2], permanent: false });
    process.exitCode = 1;
  });
  process.exitCode = await runJob(process.argv[2], process.env, log);
  settled = true;
}
