// The Cloud Run job image's entry point: `node dist/jobs/main.js plan|convert-group|finalize`.
// It only reads its configuration from the environment (set per execution by the workflow through
// container overrides) and calls the same engine the CLI uses; logs are single-line JSON for Cloud Logging.

import { jsonLogger, type Logger } from "../src/cloud/log.js";
import { finalizePhase, groupPhase, planPhase } from "../src/convert/convert.js";
import { dataLength } from "../src/convert/plan-format.js";
import { Orbax2RegError } from "../src/errors.js";

export interface JobEnv {
  readonly [name: string]: string | undefined;
}

const PROGRESS_EVERY_MS = 5000;

function required(env: JobEnv, name: string): string {
  const v = env[name];
  if (v === undefined || v === "") throw new JobConfigError(`environment variable ${name} is required`);
  return v;
}

function integer(env: JobEnv, name: string, fallback?: number): number {
  const v = env[name];
  if (v === undefined || v === "") {
    if (fallback !== undefined) return fallback;
    throw new JobConfigError(`environment variable ${name} is required`);
  }
  if (!/^\d+$/.test(v)) throw new JobConfigError(`environment variable ${name} must be a non-negative integer, got ${JSON.stringify(v)}`);
  return Number(v);
}

const flag = (env: JobEnv, name: string) => /^(1|true|yes)$/i.test(env[name] ?? "");

export class JobConfigError extends Error {}

/** Runs one phase; returns the process exit code. */
export async function runJob(
  phase: string | undefined,
  env: JobEnv,
  log: Logger = jsonLogger({ component: "orbax2reg-job" }),
): Promise<number> {
  const started = Date.now();
  try {
    const destination = required(env, "ORBAX2REG_DESTINATION");
    if (phase === "plan") {
      const source = required(env, "ORBAX2REG_SOURCE");
      const stepEnv = env.ORBAX2REG_STEP;
      const { plan, reused } = await planPhase(source, destination, {
        groups: integer(env, "ORBAX2REG_GROUPS", 1),
        paramsOnly: flag(env, "ORBAX2REG_PARAMS_ONLY"),
        force: flag(env, "ORBAX2REG_FORCE"),
        allowUncommitted: flag(env, "ORBAX2REG_ALLOW_UNCOMMITTED"),
        dryRun: false,
        ...(stepEnv ? { step: integer(env, "ORBAX2REG_STEP") } : {}),
      });
      log.info(reused ? "reusing existing plan" : "plan written", {
        phase,
        step: plan.step,
        arrays: plan.totals.arrays,
        objects: plan.totals.objects,
        bytes: plan.totals.bytes,
        groups: plan.groups.length,
        seconds: (Date.now() - started) / 1000,
      });
      return 0;
    }
    const step = integer(env, "ORBAX2REG_STEP");
    if (phase === "convert-group") {
      const group = integer(env, "ORBAX2REG_GROUP");
      const taskIndex = integer(env, "CLOUD_RUN_TASK_INDEX", 0);
      const taskCount = integer(env, "CLOUD_RUN_TASK_COUNT", 1);
      const glog = log.with({ phase, step, group, task: taskIndex });
      let bytes = 0;
      let last = Date.now();
      const report = await groupPhase(destination, step, group, {
        concurrency: integer(env, "ORBAX2REG_CONCURRENCY", 32),
        memoryBytes: integer(env, "ORBAX2REG_MEMORY_MIB", 1024) << 20,
        taskIndex,
        taskCount,
        onObject: (e) => {
          bytes += e.bytes;
          const now = Date.now();
          if (now - last >= PROGRESS_EVERY_MS) {
            last = now;
            const seconds = (now - started) / 1000;
            glog.info("copying", { bytes, mbPerSecond: Number((bytes / 1e6 / seconds).toFixed(1)) });
          }
        },
      });
      glog.info("group done", {
        objects: report.objects,
        written: report.written,
        skipped: report.skipped,
        bytes: report.bytesWritten,
        seconds: report.seconds,
        mbPerSecond: Number((report.bytesWritten / 1e6 / Math.max(report.seconds, 1e-3)).toFixed(1)),
      });
      return 0;
    }
    if (phase === "finalize") {
      const report = await finalizePhase(destination, step);
      log.info("checkpoint committed", {
        phase,
        step,
        objects: report.objects,
        files: report.files,
        indexWritten: report.indexWritten,
        bytes: report.plan.objects.reduce((s, o) => s + dataLength(o.data), 0),
        seconds: (Date.now() - started) / 1000,
      });
      return 0;
    }
    throw new JobConfigError(`unknown phase ${JSON.stringify(phase)} (expected plan, convert-group or finalize)`);
  } catch (e) {
    // Bad input is permanent (exit 2: retrying cannot help); anything else may be transient (exit 1).
    const permanent = e instanceof Orbax2RegError || e instanceof JobConfigError;
    log.error((e as Error).message, { phase, permanent, errorType: (e as Error).name, seconds: (Date.now() - started) / 1000 });
    return permanent ? 2 : 1;
  }
}

// Run when executed directly (not when imported by tests).
if (process.argv[1] && import.meta.url === new URL(`file://${process.argv[1]}`).href) {
  process.exitCode = await runJob(process.argv[2], process.env);
}
