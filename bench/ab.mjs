#!/usr/bin/env node
// A/B timing of `orbax2reg convert` on the benchmark step for two builds (e.g. before and after a change),
// interleaved with `cp -r` (the I/O floor) and `cp -r` then `sync` (the floor for a durable copy: orbax2reg
// flushes every object to the disk before the index) so that machine noise hits all
// alike. Each run: destination deleted, `sync`, then the command; wall time until the process exits.
// Prints best and median per route.
//
//   node bench/ab.mjs <step-dir> <label>=<repo-with-dist>[:ENV=VALUE,...] [<label>=<repo> ...] [--runs N]
import { spawnSync } from "node:child_process";
import { rmSync } from "node:fs";
import { join } from "node:path";
import { flag, flags, freshDir, requireFiles, usageError } from "./lib.mjs";

const opts = flags(
  process.argv.slice(2),
  { "--runs": flag.count(5) },
  { positionals: { names: "<step-dir> <label>=<repo-with-dist>[:ENV=VALUE,...] ...", min: 1, max: Number.POSITIVE_INFINITY } },
);
const RUNS = opts.runs;
const [step, ...builds] = opts._;
for (const b of builds) if (!b.includes("=") || b.startsWith("=")) usageError(`${b} is no <label>=<repo-with-dist>`);
requireFiles([
  [step, "the first argument is the step directory to convert"],
  ...builds.map((b) => [
    join(b.slice(b.indexOf("=") + 1).split(":")[0], "dist/src/cli/main.js"),
    "build that repository first (npm run build)",
  ]),
]);
const OUT = "/tmp/orbax2reg-ab";
const routes = [
  { label: "cp -r", cmd: ["cp", ["-r", step, join(OUT, "cp")]] },
  { label: "cp+sync", cmd: ["sh", ["-c", 'cp -r "$0" "$1" && sync', step, join(OUT, "cp")]] },
  ...builds.map((b) => {
    // label=repo or label=repo:NAME=VALUE,... (environment for that build's runs)
    const [label, rest] = [b.slice(0, b.indexOf("=")), b.slice(b.indexOf("=") + 1)];
    const [repo, envs = ""] = rest.split(":");
    const env = {
      ...process.env,
      ...Object.fromEntries(
        envs
          .split(",")
          .filter(Boolean)
          .map((e) => e.split("=")),
      ),
    };
    return { label, env, cmd: [join(repo, "bin/orbax2reg.js"), ["convert", step, join(OUT, label)]] };
  }),
];
const times = Object.fromEntries(routes.map((r) => [r.label, []]));
for (let i = 0; i < RUNS; i++) {
  for (const r of routes) {
    freshDir(OUT);
    const t = process.hrtime.bigint();
    const p = spawnSync(r.cmd[0], r.cmd[1], { stdio: ["ignore", "ignore", "ignore"], env: r.env ?? process.env });
    const s = Number(process.hrtime.bigint() - t) / 1e9;
    if (p.status !== 0) throw new Error(`${r.label} exited ${p.status}`);
    times[r.label].push(s);
  }
}
rmSync(OUT, { recursive: true, force: true });
const median = (xs) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)];
const cp = Math.min(...times["cp -r"]);
for (const r of routes) {
  const xs = times[r.label];
  console.log(
    `${r.label.padEnd(10)} best ${Math.min(...xs).toFixed(2)} s  median ${median(xs).toFixed(2)} s  (vs cp best: ${(cp / Math.min(...xs)).toFixed(2)}x)  runs ${xs.map((x) => x.toFixed(2)).join(", ")}`,
  );
}
