// Starts the local stand-ins of the end-to-end test on loopback: the Pub/Sub emulator, the Workflows
// emulator, the Cloud Run Admin API stand-in and the trigger function under the real functions-framework.
// (fake-gcs-server is started by the global setup for every test file.) All are installed by scripts/install.sh.
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { afterEach } from "vitest";
import { freePort, need, type Running, serve } from "../helpers/servers.js";
import { type Deployed, workflowsDir } from "./deployed.js";

/** Google's pstest in-memory Pub/Sub server (tools/pubsub-emulator). */
export async function startPubsub(logFile: string): Promise<Running> {
  const bin = ".tools/bin/pubsub-emulator";
  need(bin);
  const port = await freePort();
  return serve("pubsub-emulator", bin, ["-host", "127.0.0.1", "-port", String(port)], port, { logFile });
}

export interface WorkflowsOptions {
  readonly workflowsDir: string;
  readonly hooks: string;
  /** The workflow's user_env_vars. */
  readonly userEnv: Record<string, string>;
  /** The emulator's own environment, inherited by the connector hooks. */
  readonly env: NodeJS.ProcessEnv;
  /** More command-line options (later ones win: "--backoff-scale", "1" undoes the tests' 0; --fast-clock; --step-limit N). */
  readonly args?: readonly string[];
}

/** The Workflows emulator (tools/workflows-emulator/wfemu.py) with connector hooks, retries without sleeping. */
export async function startWorkflows(o: WorkflowsOptions, logFile: string): Promise<Running> {
  const python = ".venv-wfemu/bin/python";
  need(python);
  const port = await freePort();
  const args = ["tools/workflows-emulator/wfemu.py", "--host", "127.0.0.1", "--port", String(port), "--workflows-dir", o.workflowsDir];
  args.push("--project", "test-project", "--location", "us-central1", "--connector-hooks", o.hooks, "--backoff-scale", "0");
  for (const [k, v] of Object.entries(o.userEnv)) args.push("--env", `${k}=${v}`);
  args.push(...(o.args ?? []));
  return serve("workflows emulator", python, args, port, { env: o.env, logFile });
}

/** The trigger function (dist/functions/index.js) served by the real functions-framework. */
export async function startFunction(env: NodeJS.ProcessEnv, logFile: string): Promise<Running> {
  const bin = "node_modules/.bin/functions-framework";
  need(bin);
  const port = await freePort();
  const args = ["--target=onCheckpointFinalized", "--signature-type=cloudevent", `--port=${port}`, "--host=127.0.0.1"];
  args.push("--source=dist/functions/index.js");
  return serve("functions-framework", bin, args, port, { env, logFile });
}

/**
 * The Cloud Run Admin API stand-in (test/e2e/run-api.mjs): executions.get and executions.cancel of the job
 * executions connector-hook.mjs runs, read from their state directory (its E2E_RUN_STATE).
 */
export async function startRunApi(stateDir: string, logFile: string): Promise<Running> {
  const port = await freePort();
  const script = fileURLToPath(new URL("./run-api.mjs", import.meta.url));
  return serve("Run Admin API stand-in", process.execPath, [script, "--state-dir", stateDir, "--port", String(port)], port, { logFile });
}

/**
 * The deployed conversion workflow on the Workflows emulator, its connector calls run by connector-hook.mjs
 * with the jobs' environment as jobs.tf deploys it (the workflow's overrides win over it). The hook's logs
 * (hooks.jsonl, jobs.jsonl), the executions' state (runs/) and the faults file (faults.json) live in `work`.
 */
export function startDeployedWorkflow(work: string, deployed: Deployed, env: NodeJS.ProcessEnv): Promise<Running> {
  return startWorkflows(
    {
      workflowsDir: workflowsDir(deployed.workflowName),
      hooks: resolve("test/e2e/hooks.yaml"),
      userEnv: deployed.workflowEnv,
      env: {
        ...env,
        E2E_HOOK_LOG: join(work, "hooks.jsonl"),
        E2E_JOB_LOG: join(work, "jobs.jsonl"),
        E2E_RUN_STATE: join(work, "runs"),
        E2E_FAULTS: join(work, "faults.json"),
        E2E_JOB_ENV: JSON.stringify(deployed.jobEnv),
        E2E_JOB_NODE_ARGS: JSON.stringify(deployed.jobNodeArgs),
        E2E_TASK_MAX_RETRIES: String(deployed.jobMaxRetries),
      },
    },
    join(work, "workflows.log"),
  );
}

/**
 * After a failed test, prints the last lines of each of the pipeline's logs in `work` (names relative to it),
 * so that a failure seen once in CI can be read without keeping the scratch directory.
 */
export function printLogsOnFailure(work: () => string, names: readonly string[], lines = 40): void {
  afterEach((ctx) => {
    if (ctx.task.result?.state !== "fail") return;
    for (const name of names) {
      const file = join(work(), name);
      const tail = existsSync(file) ? readFileSync(file, "utf8").split("\n").slice(-lines).join("\n") : "(none)";
      process.stderr.write(`--- ${ctx.task.name}: the last lines of ${name}\n${tail}\n`);
    }
  });
}
