// The tests' local servers (fake-gcs-server, the emulators, the function): free ports, installed binaries,
// and one way to start a server and wait until it answers.
import { spawn } from "node:child_process";
import { createWriteStream, existsSync } from "node:fs";
import { createServer, Socket } from "node:net";
import { answersOk } from "./tls.mjs";

/** A TCP port on loopback nobody listens on right now. */
export async function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const addr = srv.address();
      srv.close(() => (typeof addr === "object" && addr ? resolve(addr.port) : reject(new Error("no port"))));
    });
  });
}

/** Fails with the fix when something scripts/install.sh installs is missing. */
export function need(path: string): void {
  if (!existsSync(path)) throw new Error(`${path} is missing: run scripts/install.sh first`);
}

export interface Running {
  readonly url: string;
  readonly port: number;
  /** The process's id (to stop and continue it: SIGSTOP, SIGCONT). */
  readonly pid: number;
  /** SIGTERM, then SIGKILL after 5 s; or SIGKILL at once (a crash, as a platform kill looks). */
  stop(signal?: "SIGTERM" | "SIGKILL"): Promise<void>;
}

export interface ServeOptions {
  readonly env?: NodeJS.ProcessEnv;
  /** Where its stdout and stderr go; without one, stdout is dropped and stderr shows in the test output. */
  readonly logFile?: string;
  /** When it is ready; by default, when its port accepts connections. */
  readonly ready?: (url: string) => Promise<boolean>;
  readonly timeoutMs?: number;
  /** What it speaks: its url's scheme (https: the GCS emulators, with the test CA's certificate, test/helpers/tls.mjs). */
  readonly scheme?: "http" | "https";
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

/** Spawns a server listening on `port` of loopback and waits until it is ready. */
export async function serve(name: string, command: string, args: string[], port: number, o: ServeOptions = {}): Promise<Running> {
  const url = `${o.scheme ?? "http"}://127.0.0.1:${port}`;
  const child = spawn(command, args, {
    env: { ...process.env, ...o.env },
    stdio: ["ignore", o.logFile ? "pipe" : "ignore", o.logFile ? "pipe" : "inherit"],
  });
  // Stopped means its log is complete on disk: 'exit' can come before the pipes are drained, so the log ends
  // once both are closed ('close'), and stop() waits for that (a test reads the log right after stopping it).
  let logWritten: Promise<void> = Promise.resolve();
  if (o.logFile) {
    const log = createWriteStream(o.logFile, { flags: "a" });
    child.stdout?.pipe(log, { end: false });
    child.stderr?.pipe(log, { end: false });
    logWritten = new Promise((resolve) => {
      child.once("close", () => log.end(resolve));
    });
  }
  let exited: number | null | undefined;
  child.once("exit", (code) => {
    exited = code;
  });
  const see = o.logFile ? `; see ${o.logFile}` : "";
  const ready = o.ready ?? (() => listening(port));
  const timeoutMs = o.timeoutMs ?? 60_000;
  const deadline = Date.now() + timeoutMs;
  while (!(await ready(url))) {
    if (exited !== undefined) throw new Error(`${name} exited with ${exited} before it was ready${see}`);
    if (Date.now() > deadline) {
      child.kill("SIGKILL");
      throw new Error(`${name} was not ready on port ${port} within ${timeoutMs / 1000} s${see}`);
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  return {
    url,
    port,
    pid: child.pid as number,
    stop: async (signal = "SIGTERM") => {
      if (exited === undefined)
        await new Promise<void>((resolve) => {
          const timer = setTimeout(() => child.kill("SIGKILL"), 5_000);
          child.once("exit", () => {
            clearTimeout(timer);
            resolve();
          });
          child.kill(signal);
        });
      // Bounded: a child of the server that outlives it would hold the pipes open.
      await Promise.race([logWritten, new Promise((r) => setTimeout(r, 5_000).unref())]);
    },
  };
}

/**
 * A readiness probe: ready when a GET of `path` under the server's url answers 2xx, over https trusting the test CA
 * (the global setup runs in vitest's main process, which was started without it).
 */
export const answers =
  (path: string) =>
  (url: string): Promise<boolean> =>
    answersOk(`${url}${path}`);

/** Whether a process with this pid exists (signal 0 only asks). */
export function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
