// Starts the local stand-ins of the end-to-end test on loopback: the Pub/Sub emulator, the Workflows
// emulator and the trigger function under the real functions-framework. (fake-gcs-server is started by the
// global setup for every test file.) All are installed by scripts/install.sh.
import { type ChildProcess, spawn } from "node:child_process";
import { createWriteStream } from "node:fs";
import { Socket } from "node:net";
import { freePort, need } from "../helpers/servers.js";

export interface Running {
  readonly url: string;
  readonly port: number;
  stop(): Promise<void>;
}

const listening = (port: number) =>
  new Promise<boolean>((resolve) => {
    const s = new Socket();
    s.once("connect", () => {
      s.destroy();
      resolve(true);
    });
    s.once("error", () => resolve(false));
    s.connect(port, "127.0.0.1");
  });

/** Spawns a server, sends its output to `logFile`, and waits until its port accepts connections. */
async function serve(
  name: string,
  command: string,
  args: string[],
  port: number,
  env: NodeJS.ProcessEnv,
  logFile: string,
): Promise<Running> {
  const log = createWriteStream(logFile, { flags: "a" });
  const child: ChildProcess = spawn(command, args, { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  child.stdout?.pipe(log);
  child.stderr?.pipe(log);
  let exited: number | null | undefined;
  child.once("exit", (code) => {
    exited = code;
  });
  const deadline = Date.now() + 60_000;
  while (!(await listening(port))) {
    if (exited !== undefined) throw new Error(`${name} exited with ${exited} before listening; see ${logFile}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`${name} did not listen on port ${port} within 60 s; see ${logFile}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    stop: () =>
      new Promise<void>((resolve) => {
        if (exited !== undefined) return resolve();
        const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
        child.once("exit", () => {
          clearTimeout(timer);
          resolve();
        });
        child.kill("SIGTERM");
      }),
  };
}

/** Google's pstest in-memory Pub/Sub server (tools/pubsub-emulator). */
export async function startPubsub(logFile: string): Promise<Running> {
  const bin = ".tools/bin/pubsub-emulator";
  need(bin);
  const port = await freePort();
  return serve("pubsub-emulator", bin, ["-host", "127.0.0.1", "-port", String(port)], port, {}, logFile);
}

export interface WorkflowsOptions {
  readonly workflowsDir: string;
  readonly hooks: string;
  /** The workflow's user_env_vars. */
  readonly userEnv: Record<string, string>;
  /** The emulator's own environment, inherited by the connector hooks. */
  readonly env: NodeJS.ProcessEnv;
}

/** The Workflows emulator (tools/workflows-emulator/wfemu.py) with connector hooks, retries without sleeping. */
export async function startWorkflows(o: WorkflowsOptions, logFile: string): Promise<Running> {
  const python = ".venv-wfemu/bin/python";
  need(python);
  const port = await freePort();
  const args = ["tools/workflows-emulator/wfemu.py", "--host", "127.0.0.1", "--port", String(port), "--workflows-dir", o.workflowsDir];
  args.push("--project", "test-project", "--location", "us-central1", "--connector-hooks", o.hooks, "--backoff-scale", "0");
  for (const [k, v] of Object.entries(o.userEnv)) args.push("--env", `${k}=${v}`);
  return serve("workflows emulator", python, args, port, o.env, logFile);
}

/** The trigger function (dist/functions/index.js) served by the real functions-framework. */
export async function startFunction(env: NodeJS.ProcessEnv, logFile: string): Promise<Running> {
  const bin = "node_modules/.bin/functions-framework";
  need(bin);
  const port = await freePort();
  const args = ["--target=onCheckpointFinalized", "--signature-type=cloudevent", `--port=${port}`, "--host=127.0.0.1"];
  args.push("--source=dist/functions/index.js");
  return serve("functions-framework", bin, args, port, env, logFile);
}
