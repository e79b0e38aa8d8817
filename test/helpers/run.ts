// A command run without blocking the test worker. A test worker blocked for a minute (spawnSync of an `npm install`
// or a release build on a loaded machine) cannot answer vitest's own calls, which then fail the run with "Timeout
// calling onTaskUpdate" although every test passed.
import { type SpawnOptions, spawn } from "node:child_process";

export interface RunResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

export function run(command: string, args: string[], options: SpawnOptions = {}): Promise<RunResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { ...options, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout?.setEncoding("utf8").on("data", (s: string) => {
      stdout += s;
    });
    child.stderr?.setEncoding("utf8").on("data", (s: string) => {
      stderr += s;
    });
    child.on("error", reject);
    child.on("close", (code) => resolve({ code, stdout, stderr }));
  });
}
