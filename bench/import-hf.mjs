#!/usr/bin/env node
// The Hugging Face import benchmark (issue 46): Llama-shaped safetensors sources (bench/gen_llama.py) imported into
// AXLearn regular steps, side by side and interleaved, best of N:
//   (a) `orbax2reg import-hf SRC OUT` (float32, the default, from the float32 2 GB source: the same bytes out as in);
//   (b) `orbax2reg convert` of bench/gen_fuji.py's ~2 GB Orbax step: the baseline that moves as many bytes
//       (target: (a)'s MB/s at least (b)'s);
//   (c) the Python route a team writes today (bench/python_import_route.py in .venv-axlearn: every tensor loaded
//       with the safetensors library, mapped with jax.numpy, saved with AXLearn's TensorStoreStateStorage).
// (a)'s output is compared with (c)'s array by array (bench/compare_steps.py). Then from gs:// (fake-gcs-server on
// tmpfs, plain and through bench/delay-proxy.mjs holding every answer --delay ms, 30 by default): (a) and (b) from
// the same emulator. With --big, the 13.5 GB bfloat16 source with Llama-2-7B's widths (--big-layers N for fewer
// layers), imported with --dtype bfloat16 beside (d) `cp -r` of the source, --runs rounds, each from an empty page
// cache where the machine allows it (root on Linux); (c) there only where 3.5x the source fits in free memory. Peak
// RSS target: 512 MiB whatever the size. See bench/README.md ("import-hf.mjs").
//
//   npm run build && node bench/import-hf.mjs [--runs N] [--delay MS] [--no-gcs] [--no-python] [--big]
//                                             [--big-layers N] [--keep-big]
import { existsSync, mkdirSync, rmSync, statfsSync, symlinkSync, writeFileSync } from "node:fs";
import os from "node:os";
import { join, relative, resolve } from "node:path";
import { emulatorHolding, runTrustingTestCa, startDelayProxy } from "./fake-gcs.mjs";
import {
  BUSY_WARN,
  bytesUnder,
  cpuBusy,
  filesUnder,
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

const opts = flags(process.argv.slice(2), {
  "--runs": flag.count(2),
  "--delay": flag.number(30, { metavar: "MS" }),
  "--no-gcs": flag.on(),
  "--no-python": flag.on(),
  "--big": flag.on(),
  "--big-layers": flag.count(undefined),
  "--keep-big": flag.on(),
});
await runTrustingTestCa();
process.chdir(ROOT);
const PYTHON = ".venv/bin/python"; // bench/gen_fuji.py (orbax-checkpoint)
const PYTHON_HF = ".venv-hf/bin/python"; // bench/gen_llama.py (safetensors, numpy)
const PYTHON_AX = ".venv-axlearn/bin/python"; // the Python route (AXLearn, jax, tensorstore) + safetensors
const CLI = "bin/orbax2reg.js";
const OUT = resolve("bench/.generated", `import-hf-${process.pid}`);
const TARGETS = { rssMiB: 512 };

const { runs: RUNS, delay: DELAY } = opts;
requireBuilt({ command: "import-hf" });
requireFiles([PYTHON, PYTHON_HF, ...(opts.noPython ? [] : [PYTHON_AX])].map((py) => [py, "run `npm run setup`"]));
mkdirSync(OUT, { recursive: true });

/** The Python route runs in AXLearn's venv with only the HF venv's safetensors package added to its path. */
function pythonPath() {
  const where = must(sh(PYTHON_HF, ["-c", "import os, safetensors; print(os.path.dirname(safetensors.__file__))"]), "safetensors");
  const dir = join(OUT, "pythonpath");
  mkdirSync(dir, { recursive: true });
  symlinkSync(where.stdout.trim(), join(dir, "safetensors"));
  return dir;
}

function llama(size, extra = []) {
  say(`Source: generating or reusing bench/.generated/llama-${size} (bench/gen_llama.py) ...`);
  const gen = must(sh(PYTHON_HF, ["bench/gen_llama.py", size, ...extra], { stdio: ["ignore", "pipe", "inherit"] }), "bench/gen_llama.py");
  const info = JSON.parse(gen.stdout.trim().split("\n").pop());
  return { info, dir: resolve(info.dir), files: filesUnder(resolve(info.dir)), bytes: bytesUnder(resolve(info.dir)) };
}

function warm(files) {
  for (const f of files) sh("cat", [f], { stdio: ["ignore", "ignore", "ignore"] });
}

const load = () =>
  `load average ${os
    .loadavg()
    .map((x) => fmt(x, 1))
    .join(" ")}, ${fmt(os.freemem() / 2 ** 30, 1)} GiB free`;

/** Runs `routes` ({name: {label, cmd, env?, out, bytes}}) interleaved `runs` times; returns name -> results. */
/**
 * Empties the page cache (root on Linux), so that the next run reads its source from the disk as a first import
 * of a downloaded model does; false where the machine does not allow it.
 */
function dropCaches() {
  sh("sync", []);
  try {
    writeFileSync("/proc/sys/vm/drop_caches", "1");
    return true;
  } catch {
    return false;
  }
}

async function interleaved(routes, runs, keep = [], before = () => {}) {
  const results = Object.fromEntries(Object.keys(routes).map((k) => [k, []]));
  for (let round = 1; round <= runs; round++) {
    for (const [name, route] of Object.entries(routes)) {
      for (const r of Object.values(routes)) rmSync(r.out, { recursive: true, force: true }); // one output on disk at a time
      freshDir(route.out);
      before();
      const background = cpuBusy();
      const r = await timed(...route.cmd, route.env ?? {});
      r.background = background;
      r.flush = syncSeconds();
      if (r.status !== 0) {
        say(`  ${round}. ${name} FAILED (exit ${r.status}): ${r.stderr.trim().split("\n").slice(-3).join(" | ")}`);
        process.exitCode = 1;
        results[name].push({ ...r, failed: true });
        continue;
      }
      r.outBytes = bytesUnder(route.out);
      results[name].push(r);
      say(
        `  ${round}. ${name.padEnd(14)} ${fmt(r.seconds).padStart(7)} s  CPU ${fmt(r.cpu).padStart(7)} s  peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(6)} MiB  ` +
          `out ${fmt(mb(r.outBytes), 0)} MB  flush ${fmt(r.flush)} s  (others ${fmt(100 * background, 0)} %)`,
      );
      if (round === runs && keep.includes(name)) sh("mv", [route.out, `${route.out}.kept`]);
    }
  }
  for (const r of Object.values(routes)) rmSync(r.out, { recursive: true, force: true });
  return results;
}

const ok = (rs) => rs.filter((r) => !r.failed);
const best = (rs) => ok(rs).reduce((x, y) => (y.seconds < x.seconds ? y : x), ok(rs)[0]);
const peak = (rs) => Math.max(...ok(rs).map((r) => r.rssKiB)) / 1024;
const verdict = (good) => (good ? "met" : "**missed**");

function table(routes, results) {
  say(
    "| route | best wall | all runs (s) | MB/s (source bytes / wall) | CPU (user+sys) | peak RSS (max of runs) | output | others before best |",
  );
  say("|---|---:|---|---:|---:|---:|---:|---:|");
  for (const [name, route] of Object.entries(routes)) {
    const b = best(results[name]);
    if (!b) {
      say(`| ${route.label} | failed | | | | | | |`);
      continue;
    }
    say(
      `| ${route.label} | ${fmt(b.seconds)} s | ${results[name].map((r) => (r.failed ? "failed" : fmt(r.seconds))).join(", ")} | ` +
        `${fmt(mb(route.bytes) / b.seconds, 0)} | ${fmt(b.cpu)} s | ${fmt(peak(results[name]), 0)} MiB | ${fmt(mb(b.outBytes), 0)} MB | ${fmt(100 * b.background, 0)} % |`,
    );
  }
  say();
}

function compareKept(a, c) {
  const stepA = join(`${a}.kept`, "step_00000000");
  const stepC = join(`${c}.kept`, "step_00000000");
  if (!existsSync(stepA) || !existsSync(stepC)) return;
  const t0 = performance.now();
  const r = sh(PYTHON_AX, ["bench/compare_steps.py", stepA, stepC]);
  if (r.status !== 0) {
    say(`  (a) against (c): compare_steps.py exited ${r.status}: ${r.stderr.trim().split("\n").slice(-2).join(" | ")}`);
    process.exitCode = 1;
    return;
  }
  const j = JSON.parse(r.stdout.trim().split("\n").pop());
  say(
    `  (a) against (c), array by array: ${j.equal} of ${j.arrays} arrays byte-identical (${fmt(mb(j.bytes), 0)} MB compared, ${fmt((performance.now() - t0) / 1000, 1)} s)`,
  );
  for (const d of j.differences) say(`    DIFFERENCE ${d}`);
  if (j.differences.length) process.exitCode = 1;
  say();
}

// ---------------------------------------------------------------------------------------------------

const fsInfo = statfsSync(".");
say("# orbax2reg Hugging Face import benchmark");
say();
say(
  `  ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? "?"}), ${fmt(os.totalmem() / 2 ** 30, 1)} GiB; ` +
    `${fmt((fsInfo.bavail * fsInfo.bsize) / 2 ** 30, 0)} GiB free on disk; node ${process.version}; at the start: ${load()}`,
);
const PYTHONPATH = opts.noPython ? undefined : pythonPath();
const small = llama("2gb");
const fuji = fujiStep(PYTHON);
say(`  (a)/(c) source: ${small.info.tensors} tensors in ${small.info.shards} shards, ${small.bytes.toLocaleString("en-US")} B (float32)`);
say(`  (b) source: ${fuji.info.step_dir}, ${fuji.info.arrays} arrays, ${fuji.bytes.toLocaleString("en-US")} B on disk`);
warm([...small.files, ...fuji.files]);
say("  warm-up: both sources read once; every run reads them from the page cache");
say();

const dest = { a: join(OUT, "a"), b: join(OUT, "b"), c: join(OUT, "c"), d: join(OUT, "d") };
const localRoutes = {
  a: {
    label: "(a) `orbax2reg import-hf` (float32)",
    cmd: [CLI, ["import-hf", small.dir, dest.a, "--json", "--no-progress"]],
    out: dest.a,
    bytes: small.bytes,
  },
  b: {
    label: "(b) `orbax2reg convert` of the ~2 GB Orbax step",
    cmd: [CLI, ["convert", fuji.dir, dest.b, "--json"]],
    out: dest.b,
    bytes: fuji.bytes,
  },
  c: {
    label: "(c) Python route (safetensors load, jax.numpy mapping, TensorStoreStateStorage save)",
    cmd: [PYTHON_AX, ["bench/python_import_route.py", small.dir, dest.c]],
    env: { PYTHONPATH },
    out: dest.c,
    bytes: small.bytes,
  },
};
if (opts.noPython) delete localRoutes.c;
say(`## 2 GB, local disk (best of ${RUNS}, interleaved; destination deleted and \`sync\` before each run)`);
say();
const local = await interleaved(localRoutes, RUNS, ["a", "c"]);
say();
compareKept(dest.a, dest.c);
rmSync(`${dest.a}.kept`, { recursive: true, force: true });
rmSync(`${dest.c}.kept`, { recursive: true, force: true });
table(localRoutes, local);
const A = best(local.a);
const B = best(local.b);
const C = localRoutes.c ? best(local.c) : undefined;
say("| ratio | measured | target | |");
say("|---|---:|---:|---|");
if (A && B) {
  const ratio = mb(small.bytes) / A.seconds / (mb(fuji.bytes) / B.seconds);
  say(`| MB/s, (a) / (b) | ${fmt(ratio)}x | >= 1x | ${verdict(ratio >= 1)} |`);
  say(`| CPU per MB, (a) / (b) | ${fmt(A.cpu / small.bytes / (B.cpu / fuji.bytes))}x | | |`);
}
if (A) say(`| peak RSS of (a) | ${fmt(peak(local.a), 0)} MiB | <= ${TARGETS.rssMiB} MiB | ${verdict(peak(local.a) <= TARGETS.rssMiB)} |`);
if (A && C) {
  say(`| wall, (c) / (a) | ${fmt(C.seconds / A.seconds, 1)}x | | |`);
  say(`| CPU, (c) / (a) | ${fmt(C.cpu / A.cpu, 1)}x | | |`);
  say(`| peak RSS, (c) / (a) | ${fmt(peak(local.c) / peak(local.a), 1)}x | | |`);
}
say();

if (!opts.noGcs) {
  const FS_ROOT = existsSync("/dev/shm") ? `/dev/shm/orbax2reg-bench-import-gcs-${process.pid}` : resolve(OUT, "fs");
  const HF_SRC = "hf/llama-2gb";
  const ORBAX_SRC = `ckpt/${fuji.name}`;
  say(`## 2 GB from gs:// (fake-gcs-server, its folder on tmpfs; plain HTTP and every answer held ${DELAY} ms)`);
  say();
  const { emulator, seconds } = await emulatorHolding(FS_ROOT, "src", [
    ...small.files.filter((f) => !f.endsWith("generated.json")).map((f) => [f, `${HF_SRC}/${relative(small.dir, f)}`]),
    ...fuji.files.map((f) => [f, `${ORBAX_SRC}/${relative(fuji.dir, f)}`]),
  ]);
  const delayed = await startDelayProxy(emulator.plainUrl, DELAY);
  say(`  uploaded both sources in ${fmt(seconds, 1)} s; ${load()}`);
  const routes = {};
  for (const [row, url] of [
    ["plain", emulator.plainUrl],
    [`${DELAY} ms`, delayed.url],
  ]) {
    const env = { ORBAX2REG_GCS_ENDPOINT: url };
    routes[`a ${row}`] = {
      label: `(a) import-hf gs://, ${row}`,
      cmd: [CLI, ["import-hf", `gs://src/${HF_SRC}`, join(OUT, "ga"), "--json", "--no-progress"]],
      env,
      out: join(OUT, "ga"),
      bytes: small.bytes,
    };
    routes[`b ${row}`] = {
      label: `(b) convert gs://, ${row}`,
      cmd: [CLI, ["convert", `gs://src/${ORBAX_SRC}`, join(OUT, "gb"), "--json"]],
      env,
      out: join(OUT, "gb"),
      bytes: fuji.bytes,
    };
  }
  const gcs = await interleaved(routes, RUNS);
  say();
  table(routes, gcs);
  say("| source | MB/s, (a) / (b) | target | peak RSS of (a) | target |");
  say("|---|---:|---:|---:|---|");
  for (const row of ["plain", `${DELAY} ms`]) {
    const a = best(gcs[`a ${row}`]);
    const b = best(gcs[`b ${row}`]);
    if (!a || !b) continue;
    const ratio = mb(small.bytes) / a.seconds / (mb(fuji.bytes) / b.seconds);
    say(
      `| gs://, ${row} | ${fmt(ratio)}x | >= 1x ${verdict(ratio >= 1)} | ${fmt(peak(gcs[`a ${row}`]), 0)} MiB | ${verdict(peak(gcs[`a ${row}`]) <= TARGETS.rssMiB)} |`,
    );
  }
  say();
  delayed.stop();
  emulator.stop();
}

if (opts.big) {
  const layers = opts.bigLayers;
  const big = llama("7b", layers ? ["--layers", String(layers)] : []);
  const free = statfsSync(".").bavail * statfsSync(".").bsize;
  if (free < big.bytes + 8 * 2 ** 30) {
    console.error(`only ${fmt(free / 2 ** 30, 1)} GiB free on disk: the import needs the source's size plus 8 GiB; use --big-layers`);
    process.exit(1);
  }
  // The Python route holds every tensor and then the mapped tree: its peak was 3.4x the 2 GB source.
  const pythonFits = !opts.noPython && big.bytes * 3.5 < os.freemem();
  // Cold: a source this size is read from the disk (it is more than the page cache keeps here), so each run starts
  // from an empty page cache where the machine allows it, and the baseline is (d), `cp -r` of the same bytes.
  const cold = dropCaches();
  say(
    `## 13.5 GB class: ${big.info.dims.layers} layers at Llama-2-7B's widths (hidden ${big.info.dims.hidden}, ffn ${big.info.dims.ffn}, vocab ${big.info.dims.vocab}), bfloat16, ` +
      `${big.info.shards} shards, ${big.bytes.toLocaleString("en-US")} B; ` +
      `${cold ? "cold: the page cache emptied before every run" : "not cold (the page cache cannot be emptied here: what it kept of the source)"}; ${load()}`,
  );
  say();
  if (!pythonFits)
    say(
      `(c) not run: it holds every tensor and then the mapped tree (peak 3.4x the source on the 2 GB one), more than the ${fmt(os.freemem() / 2 ** 30, 1)} GiB free here for ${fmt(big.bytes / 2 ** 30, 1)} GiB`,
    );
  const bigRoutes = {
    a: {
      label: "(a) `orbax2reg import-hf --dtype bfloat16`",
      cmd: [CLI, ["import-hf", big.dir, dest.a, "--dtype", "bfloat16", "--json", "--no-progress"]],
      out: dest.a,
      bytes: big.bytes,
    },
    d: {
      label: "(d) `cp -r` of the source: the same bytes moved",
      cmd: ["cp", ["-r", `${big.dir}/.`, dest.d]],
      out: dest.d,
      bytes: big.bytes,
    },
    ...(pythonFits
      ? {
          c: {
            label: "(c) Python route --dtype bfloat16",
            cmd: [PYTHON_AX, ["bench/python_import_route.py", big.dir, dest.c, "--dtype", "bfloat16"]],
            env: { PYTHONPATH },
            out: dest.c,
            bytes: big.bytes,
          },
        }
      : {}),
  };
  const bigResults = await interleaved(bigRoutes, RUNS, [], cold ? dropCaches : () => {});
  say();
  table(bigRoutes, bigResults);
  const a = best(bigResults.a);
  const d = best(bigResults.d);
  if (a && d) {
    const ratio = d.seconds / a.seconds;
    say(`MB/s, (a) / (d) \`cp -r\` of the same bytes: ${fmt(ratio)}x (target >= 1x: ${verdict(ratio >= 1)}).`);
  }
  if (a)
    say(
      `Peak RSS of (a): ${fmt(peak(bigResults.a), 0)} MiB (target <= ${TARGETS.rssMiB} MiB: ${verdict(peak(bigResults.a) <= TARGETS.rssMiB)}).`,
    );
  say();
  if (!opts.keepBig) rmSync(big.dir, { recursive: true, force: true });
}
const disturbed = Object.values(local)
  .flat()
  .some((r) => r.background > BUSY_WARN);
if (disturbed)
  say(`Other work kept more than ${fmt(100 * BUSY_WARN, 0)} % of the CPUs busy before some runs: compare the ratios, not the times.`);
say(`At the end: ${load()}`);
rmSync(OUT, { recursive: true, force: true });
