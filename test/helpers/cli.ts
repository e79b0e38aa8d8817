import { spawn, spawnSync } from "node:child_process";
import { main } from "../../src/cli/main.js";
import type { Output } from "../../src/cli/output.js";

export interface CliResult {
  code: number;
  stdout: string;
  stderr: string;
}

/** Runs the CLI in-process, capturing what it prints. */
export async function runCli(args: string[]): Promise<CliResult> {
  let stdout = "";
  let stderr = "";
  const out: Output = {
    stdout: (line) => {
      stdout += `${line}\n`;
    },
    writeOut: (text) => {
      stdout += text;
    },
    writeErr: (text) => {
      stderr += text;
    },
    warn: (line) => {
      stderr += `warning: ${line}\n`;
    },
    isTTY: false,
  };
  const code = await main(args, out);
  return { code, stdout, stderr };
}

/** Runs the real executable (`bin/orbax2reg.js`, built by the global setup) in a child process. */
export function runBin(args: string[], env: NodeJS.ProcessEnv = {}): CliResult {
  const r = spawnSync(process.execPath, ["bin/orbax2reg.js", ...args], { encoding: "utf8", env: { ...process.env, ...env } });
  return { code: r.status ?? -1, stdout: r.stdout, stderr: r.stderr };
}

/** runBin without blocking the test process (for commands that wait on servers the test itself drives). */
export function runBinAsync(args: string[], env: NodeJS.ProcessEnv = {}): Promise<CliResult> {
  return new Promise((resolve) => {
    const child = spawn(process.execPath, ["bin/orbax2reg.js", ...args], { env: { ...process.env, ...env } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    child.on("close", (code) => resolve({ code: code ?? -1, stdout, stderr }));
  });
}
