#!/usr/bin/env node
// The bfloat16 export: `orbax2reg convert --dtype bfloat16` of the ~2 GB fuji-7B-v2-shaped step (bench/gen_fuji.py,
// every float32 leaf cast) beside the Python route doing the same cast (bench/python_route.py --dtype bfloat16:
// orbax restore as numpy, `jnp.asarray(x).astype(jnp.bfloat16)`, TensorStore zarr v2 write). Best of N, interleaved;
// the source is read once before the runs (warm page cache). Both outputs are checked with `orbax2reg verify`
// (against the cast of the source). See bench/README.md.
//
//   npx tsc -p tsconfig.build.json && node bench/cast.mjs [--runs N] [--memory MiB]
import { closeSync, mkdirSync, openSync, readSync } from "node:fs";
import os from "node:os";
import { join, resolve } from "node:path";
import {
  BUSY_WARN,
  bytesUnder,
  cpuBusy,
  flag,
  flags,
  fmt,
  freshDir,
  fujiStep,
  mb,
  must,
  ROOT,
  requireBuilt,
  requireFiles,
  say,
  sh,
  syncSeconds,
  timed,
} from "./lib.mjs";

process.chdir(ROOT);
const PYTHON = ".venv/bin/python";
const CLI = "bin/orbax2reg.js";
const OUT = resolve("bench/.generated", "cast");
const { runs: RUNS, memory: MEMORY } = flags(process.argv.slice(2), { "--runs": flag.count(3), "--memory": flag.count(256, "MiB") });
requireBuilt();
requireFiles([[PYTHON, "run `npm run setup` (the generator and the Python route need the real orbax)"]]);

say("# orbax2reg bfloat16 export benchmark");
say();
say(`  ${os.cpus().length} CPUs, ${fmt(os.totalmem() / 2 ** 30, 1)} GiB, node ${process.version}; --memory ${MEMORY} MiB`);
const { info, dir: STEP, name: STEP_NAME, files, bytes: SOURCE_BYTES } = fujiStep(PYTHON);
say(`  source ${info.step_dir}: ${info.arrays} arrays, ${SOURCE_BYTES.toLocaleString("en-US")} B on disk (float32 params + Adam mu/nu)`);
{
  const buf = Buffer.allocUnsafe(8 << 20);
  for (const f of files) {
    const fd = openSync(f, "r");
    while (readSync(fd, buf, 0, buf.length, null) > 0) {}
    closeSync(fd);
  }
}
say("  warm-up: the whole source read once; every run reads it from the page cache");
say();

const DEST = { orbax2reg: join(OUT, "orbax2reg"), python: join(OUT, "python") };
const ROUTES = {
  orbax2reg: {
    label: "`orbax2reg convert --dtype bfloat16`",
    cmd: [CLI, ["convert", STEP, DEST.orbax2reg, "--dtype", "bfloat16", "--memory", String(MEMORY), "--json"]],
  },
  python: {
    label: "Python route (orbax restore + astype(bfloat16) + TensorStore write)",
    cmd: [PYTHON, ["bench/python_route.py", STEP, DEST.python, "--dtype", "bfloat16"]],
  },
};
const results = { orbax2reg: [], python: [] };
let failed = false;
mkdirSync(OUT, { recursive: true });
say(`Runs (best of ${RUNS}; destination deleted and \`sync\` before each run):`);
for (let round = 1; round <= RUNS; round++) {
  for (const name of Object.keys(ROUTES)) {
    freshDir(DEST[name]);
    const background = cpuBusy();
    const r = must(await timed(...ROUTES[name].cmd), name);
    r.background = background;
    r.flush = syncSeconds();
    r.outBytes = bytesUnder(join(DEST[name], STEP_NAME));
    // orbax2reg --json prints one indented object; the Python route one JSON line after any library output.
    const inside = JSON.parse(name === "orbax2reg" ? r.stdout : r.stdout.trim().split("\n").pop());
    const extra = name === "python" ? `; restore ${inside.restore_s} s, cast ${inside.cast_s} s, write ${inside.write_s} s inside` : "";
    results[name].push(r);
    say(
      `  ${round}. ${name.padEnd(9)} ${fmt(r.seconds).padStart(6)} s  ${fmt(mb(SOURCE_BYTES) / r.seconds, 0).padStart(5)} MB/s  ` +
        `CPU ${fmt(r.cpu).padStart(6)} s  peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(5)} MiB  out ${fmt(mb(r.outBytes), 0)} MB  ` +
        `(others ${fmt(100 * background, 0)} % CPU before)${extra}`,
    );
    if (round === 1) {
      const v = sh(process.execPath, [CLI, "verify", STEP, join(DEST[name], STEP_NAME), "--json"], { maxBuffer: 64 << 20 });
      const j = v.status === 0 || v.status === 4 ? JSON.parse(v.stdout) : { passed: 0, failed: 1, checks: [] };
      const bad = j.checks.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`);
      say(
        `     verify ${name} output against the cast of its source: ${j.passed} passed, ${j.failed} failed${bad.length ? ` -- ${bad.slice(0, 3).join("; ")}` : ""}`,
      );
      if (j.failed !== 0) failed = true;
    }
  }
}
say();

const best = (name) => results[name].reduce((a, b) => (b.seconds < a.seconds ? b : a));
const o = best("orbax2reg");
const p = best("python");
say("| route | best wall time | all runs (s) | MB/s | CPU (user+sys) | peak RSS |");
say("|---|---:|---|---:|---:|---:|");
for (const [name, r] of [
  ["orbax2reg", o],
  ["python", p],
]) {
  say(
    `| ${ROUTES[name].label} | ${fmt(r.seconds)} s | ${results[name].map((x) => fmt(x.seconds)).join(", ")} | ${fmt(mb(SOURCE_BYTES) / r.seconds, 0)} | ${fmt(r.cpu)} s | ${fmt(Math.max(...results[name].map((x) => x.rssKiB)) / 1024, 0)} MiB |`,
  );
}
say();
say("| ratio (Python route / orbax2reg) | |");
say("|---|---:|");
say(`| wall time | ${fmt(p.seconds / o.seconds, 1)}x |`);
say(`| CPU (user+sys) | ${fmt(p.cpu / o.cpu, 1)}x |`);
say(`| peak RSS | ${fmt(Math.max(...results.python.map((x) => x.rssKiB)) / Math.max(...results.orbax2reg.map((x) => x.rssKiB)), 1)}x |`);
say();
say(`orbax2reg peak RSS ${fmt(Math.max(...results.orbax2reg.map((x) => x.rssKiB)) / 1024, 0)} MiB with --memory ${MEMORY} MiB`);
if (o.background > BUSY_WARN || p.background > BUSY_WARN)
  say("WARNING: other work kept the CPUs busy before a best run: wall times are unreliable (CPU seconds less so)");
if (failed) process.exitCode = 1;
