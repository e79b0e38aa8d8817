// A child node process run as every deployed process runs (bin/orbax2reg.js's shebang, the job image's entry point),
// and its peak RSS: the kernel's VmHWM, which a script preloaded with --require reports on exit. Tests that bound a
// command's memory (test/store/gcs-memory.test.ts, test/orbax/many-keys.test.ts) run it this way: with node's
// default young generation instead, garbage not yet collected can take a process far past what it holds.
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { tempDir } from "./tmp.js";

/** The environment and node flags the CLI starts with: its shebang, `env -S VAR=value... node FLAGS`. */
export function productRuntime(): { env: Record<string, string>; flags: string[] } {
  const [shebang = ""] = readFileSync("bin/orbax2reg.js", "utf8").split("\n");
  const words = shebang.replace(/^#!\/usr\/bin\/env -S /, "").split(" ");
  const node = words.indexOf("node");
  const env = Object.fromEntries(words.slice(0, node).map((w) => w.split("=", 2) as [string, string]));
  return { env, flags: words.slice(node + 1) };
}

let reporter: string | undefined;

/** The preloaded script: one line `peak-rss-kib <n>` on stderr as the process exits. */
function peakReporter(): string {
  if (reporter === undefined) {
    reporter = join(tempDir("peak-rss"), "report-peak.cjs");
    writeFileSync(
      reporter,
      `process.on("exit", () => { const m = /VmHWM:\\s+(\\d+) kB/.exec(require("node:fs").readFileSync("/proc/self/status", "utf8")); process.stderr.write("peak-rss-kib " + (m ? m[1] : "0") + "\\n"); });\n`,
    );
  }
  return reporter;
}

export interface PeakRun {
  readonly code: number | null;
  readonly stdout: string;
  /** Without the report's line. */
  readonly stderr: string;
  readonly peakMiB: number;
}

/** Runs `node <the CLI's flags> ...args` with the CLI's environment (then `env`) over the test's, and its peak RSS. */
export function runWithPeakRss(args: readonly string[], o: { env?: Record<string, string>; timeoutMs: number }): PeakRun {
  const runtime = productRuntime();
  const r = spawnSync(process.execPath, [...runtime.flags, "--require", peakReporter(), ...args], {
    env: { ...process.env, ...runtime.env, ...o.env },
    encoding: "utf8",
    timeout: o.timeoutMs,
  });
  const m = /^peak-rss-kib (\d+)\n/m.exec(r.stderr ?? "");
  if (m === null) throw new Error(`no peak RSS reported (exit ${r.status}, ${r.signal ?? "no signal"}): ${r.stderr}`);
  return { code: r.status, stdout: r.stdout, stderr: r.stderr.replace(m[0], ""), peakMiB: Number(m[1]) / 1024 };
}
