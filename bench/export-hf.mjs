#!/usr/bin/env node
// The Hugging Face export benchmark (issue 35, section 2): on the same fuji-shaped Orbax step, side by side and
// interleaved, best of N:
//   (a) `orbax2reg export-hf STEP OUT` (bfloat16, the default);
//   (b) `orbax2reg convert STEP OUT --params-only --dtype bfloat16`: the baseline (target: a/b wall <= 1.5x);
//   (c) the Python route a user writes today (bench/python_hf_route.py, .venv-hf: orbax restore of the whole
//       state on CPU, the mapping in numpy/torch, `safetensors.torch.save_file` per shard).
// Then (a)'s output is compared with (c)'s tensor by tensor (names, dtypes, shapes, bytes) and checked with
// `orbax2reg verify STEP OUT`. Sizes: the 2 GB step of bench/gen_fuji.py (params + Adam state) and, with --big,
// fuji-7B-v2's real dimensions, params only (bench/gen_fuji_big.py, ~25 GB on disk; --big-dims to scale it).
// See bench/README.md ("export-hf.mjs").
//
// With --cuts 8,256,1024 (issue 43, section 3), the same params cut N ways per weight (bench/gen_fuji_cut.py: a
// regular step, each sharded weight in N chunks spanning every layer) are exported side by side with (b) on the
// 2 GB step: wall, CPU, peak RSS and export-hf's chunk re-reads, open decoders and spilled arrays, per cut.
//
//   npm run build && node bench/export-hf.mjs [--runs N] [--big] [--big-runs N] [--big-dims layers=16,...]
//                                             [--only-big] [--keep-big] [--no-python] [--routes a,b,c]
//                                             [--cuts 8,256,1024] [--only-cuts]
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, readSync, rmSync, statfsSync } from "node:fs";
import os from "node:os";
import { join, resolve } from "node:path";
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

process.chdir(ROOT);
const PYTHON = ".venv/bin/python"; // the generators (orbax-checkpoint, jax)
const PYTHON_HF = ".venv-hf/bin/python"; // the Python route (orbax-checkpoint, jax, torch, safetensors, transformers)
const CLI = "bin/orbax2reg.js";
const OUT = resolve("bench/.generated", "export-hf");
const TARGETS = { wallVsConvert: 1.5, rssMiB: 512 };

const opts = flags(process.argv.slice(2), {
  "--runs": flag.count(3),
  "--big": flag.on(),
  "--big-runs": flag.count(2),
  "--big-dims": flag.text(undefined, "DIMS"),
  "--only-big": flag.on(),
  "--keep-big": flag.on(),
  "--no-python": flag.on(),
  "--routes": flag.some("a,b,c", ["a", "b", "c"]),
  "--cuts": flag.counts(undefined),
  "--only-cuts": flag.on(),
});
const RUNS = opts.runs;
const BIG_RUNS = opts.bigRuns;
const BIG_DIMS = opts.bigDims;
/** Which of a, b, c to run (all by default). */
const ROUTES = opts.routes;
requireBuilt({ command: ROUTES.includes("a") ? "export-hf" : undefined });
requireFiles([PYTHON, ...(opts.noPython || !ROUTES.includes("c") ? [] : [PYTHON_HF])].map((py) => [py, "run `npm run setup`"]));

// ---------------------------------------------------------------------------------------------------
// Safetensors, read here without a library (8-byte little-endian header length, JSON header, data): every tensor
// of an export by name, so that two exports compare tensor by tensor whatever their sharding.

function header(file) {
  const fd = openSync(file, "r");
  try {
    const len = Buffer.alloc(8);
    readSync(fd, len, 0, 8, 0);
    const n = Number(len.readBigUInt64LE(0));
    const json = Buffer.alloc(n);
    readSync(fd, json, 0, n, 8);
    const h = JSON.parse(json.toString("utf8"));
    const meta = h.__metadata__ ?? {};
    delete h.__metadata__;
    return { tensors: h, base: 8 + n, meta };
  } finally {
    closeSync(fd);
  }
}

/** name -> { file, dtype, shape, start, end } (absolute byte offsets) for an export directory. */
function tensorsOf(dir) {
  const indexFile = join(dir, "model.safetensors.index.json");
  const files = existsSync(indexFile)
    ? [...new Set(Object.values(JSON.parse(readFileSync(indexFile, "utf8")).weight_map))]
    : ["model.safetensors"];
  const out = new Map();
  for (const f of files) {
    const { tensors, base } = header(join(dir, f));
    for (const [name, t] of Object.entries(tensors))
      out.set(name, { file: join(dir, f), dtype: t.dtype, shape: t.shape, start: base + t.data_offsets[0], end: base + t.data_offsets[1] });
  }
  return { files, tensors: out };
}

const ELEMENT = { BF16: 2, F16: 2, F32: 4, F64: 8 };
const bf16 = (u16) => new Float32Array(new Uint32Array([u16 << 16]).buffer)[0];

/** Tensor-by-tensor comparison of two exports: names, dtypes, shapes and bytes (read 16 MiB at a time). */
function compareExports(a, b) {
  const A = tensorsOf(a);
  const B = tensorsOf(b);
  const diffs = [];
  for (const name of [...A.tensors.keys()].filter((n) => !B.tensors.has(n))) diffs.push(`${name}: only in orbax2reg's export`);
  for (const name of [...B.tensors.keys()].filter((n) => !A.tensors.has(n))) diffs.push(`${name}: only in the Python route's export`);
  const piece = 16 << 20;
  const bufA = Buffer.allocUnsafe(piece);
  const bufB = Buffer.allocUnsafe(piece);
  let same = 0;
  let bytes = 0;
  for (const [name, ta] of A.tensors) {
    const tb = B.tensors.get(name);
    if (!tb) continue;
    if (ta.dtype !== tb.dtype || JSON.stringify(ta.shape) !== JSON.stringify(tb.shape)) {
      diffs.push(`${name}: ${ta.dtype}${JSON.stringify(ta.shape)} against ${tb.dtype}${JSON.stringify(tb.shape)}`);
      continue;
    }
    const size = ELEMENT[ta.dtype] ?? 1;
    const fa = openSync(ta.file, "r");
    const fb = openSync(tb.file, "r");
    let differing = 0;
    let first;
    for (let off = 0; off < ta.end - ta.start; off += piece) {
      const n = Math.min(piece, ta.end - ta.start - off);
      readSync(fa, bufA, 0, n, ta.start + off);
      readSync(fb, bufB, 0, n, tb.start + off);
      if (bufA.compare(bufB, 0, n, 0, n) === 0) continue;
      for (let i = 0; i < n; i += size) {
        if (bufA.compare(bufB, i, i + size, i, i + size) === 0) continue;
        differing++;
        if (first === undefined) {
          const va = size === 2 && ta.dtype === "BF16" ? bf16(bufA.readUInt16LE(i)) : size === 4 ? bufA.readFloatLE(i) : "?";
          const vb = size === 2 && ta.dtype === "BF16" ? bf16(bufB.readUInt16LE(i)) : size === 4 ? bufB.readFloatLE(i) : "?";
          first = `element ${(off + i) / size}: ${va} against ${vb}`;
        }
      }
    }
    closeSync(fa);
    closeSync(fb);
    bytes += ta.end - ta.start;
    if (differing === 0) same++;
    else diffs.push(`${name}: ${differing} of ${(ta.end - ta.start) / size} elements differ (first: ${first})`);
  }
  return { tensors: A.tensors.size, same, bytes, diffs, filesA: A.files.length, filesB: B.files.length };
}

/** The config.json fields of the two exports that differ (information: flags decide some of them). */
function configDiff(a, b) {
  const read = (d) => (existsSync(join(d, "config.json")) ? JSON.parse(readFileSync(join(d, "config.json"), "utf8")) : {});
  const ca = read(a);
  const cb = read(b);
  const keys = [...new Set([...Object.keys(ca), ...Object.keys(cb)])].filter((k) => k !== "transformers_version");
  return keys
    .filter((k) => JSON.stringify(ca[k]) !== JSON.stringify(cb[k]))
    .map((k) => `${k}: ${JSON.stringify(ca[k])} / ${JSON.stringify(cb[k])}`);
}

// ---------------------------------------------------------------------------------------------------
// One size: the routes interleaved round by round, then the checks.

function warm(files) {
  const buf = Buffer.allocUnsafe(8 << 20);
  for (const f of files) {
    const fd = openSync(f, "r");
    while (readSync(fd, buf, 0, buf.length, null) > 0) {}
    closeSync(fd);
  }
}

async function benchSize({ label, step, sourceBytes, runs, python, noPython }) {
  const dest = { a: join(OUT, "a"), b: join(OUT, "b"), c: join(OUT, "c") };
  const routes = {
    a: { label: "(a) `orbax2reg export-hf` (bfloat16)", cmd: [CLI, ["export-hf", step, dest.a, "--json", "--no-progress"]] },
    b: {
      label: "(b) `orbax2reg convert --params-only --dtype bfloat16`",
      cmd: [CLI, ["convert", step, dest.b, "--params-only", "--dtype", "bfloat16", "--json"]],
    },
    c: {
      label: "(c) Python route (orbax restore, numpy/torch mapping, safetensors `save_file`)",
      cmd: [PYTHON_HF, ["bench/python_hf_route.py", step, dest.c]],
    },
  };
  for (const name of Object.keys(routes)) if (!ROUTES.includes(name)) delete routes[name];
  if (!python) delete routes.c;
  const results = Object.fromEntries(Object.keys(routes).map((k) => [k, []]));
  say(`## ${label}`);
  say();
  if (noPython) {
    say(`(c) not run: ${noPython}`);
    say();
  }
  say(`Runs (best of ${runs}; destination deleted and \`sync\` before each run; "others" = CPU busy with other work just before):`);
  for (let round = 1; round <= runs; round++) {
    for (const name of Object.keys(routes)) {
      for (const d of Object.values(dest)) rmSync(d, { recursive: true, force: true }); // one output on disk at a time
      freshDir(dest[name]);
      const background = cpuBusy();
      const r = await timed(...routes[name].cmd);
      if (r.status !== 0) {
        say(`  ${round}. ${name} FAILED (exit ${r.status}): ${r.stderr.trim().split("\n").slice(-3).join(" | ")}`);
        process.exitCode = 1;
        results[name].push({ ...r, failed: true, background, flush: 0, outBytes: 0 });
        continue;
      }
      r.background = background;
      r.flush = syncSeconds();
      r.outBytes = bytesUnder(dest[name]);
      let extra = "";
      if (name === "c") {
        const j = JSON.parse(r.stdout.trim().split("\n").pop());
        extra = `; inside: restore ${j.restore_s} s, map ${j.map_s} s, save ${j.save_s} s, config ${j.config_s} s`;
      }
      results[name].push(r);
      say(
        `  ${round}. ${name}  ${fmt(r.seconds).padStart(7)} s  CPU ${fmt(r.cpu).padStart(7)} s  peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(6)} MiB  ` +
          `out ${fmt(mb(r.outBytes), 0)} MB  flush ${fmt(r.flush)} s  (others ${fmt(100 * background, 0)} %)${extra}`,
      );
      // Keep the last round's (a) and (c) outputs for the checks below.
      if (round === runs && name === "a") sh("mv", [dest.a, `${dest.a}.kept`]);
      if (round === runs && name === "c") sh("mv", [dest.c, `${dest.c}.kept`]);
    }
  }
  for (const d of Object.values(dest)) rmSync(d, { recursive: true, force: true });
  say();

  // Checks (untimed): (a) against its source with `orbax2reg verify`, (a) against (c) tensor by tensor.
  const checks = [];
  const keptA = `${dest.a}.kept`;
  const keptC = `${dest.c}.kept`;
  if (existsSync(keptA)) {
    const t0 = performance.now();
    const v = sh(process.execPath, [CLI, "verify", step, keptA, "--json"], { maxBuffer: 64 << 20 });
    let line = `\`orbax2reg verify\` of (a) against the step: exit ${v.status}`;
    try {
      const j = JSON.parse(v.stdout);
      line += `, ${j.passed} passed, ${j.failed} failed`;
      const bad = (j.checks ?? []).filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`);
      if (bad.length) line += ` -- ${bad.slice(0, 3).join("; ")}`;
    } catch {
      line += ` ${(v.stderr || v.stdout).trim().split("\n").slice(-2).join(" | ")}`;
    }
    checks.push(`${line} (${fmt((performance.now() - t0) / 1000, 1)} s)`);
    if (v.status !== 0) process.exitCode = 1;
  }
  if (existsSync(keptA) && existsSync(keptC)) {
    const t0 = performance.now();
    const c = compareExports(keptA, keptC);
    checks.push(
      `(a) against (c), tensor by tensor: ${c.same} of ${c.tensors} tensors byte-identical (${fmt(mb(c.bytes), 0)} MB compared; ` +
        `${c.filesA} / ${c.filesB} shard file(s)) (${fmt((performance.now() - t0) / 1000, 1)} s)`,
    );
    for (const d of c.diffs.slice(0, 12)) checks.push(`  DIFFERENCE ${d}`);
    if (c.diffs.length > 12) checks.push(`  ... ${c.diffs.length - 12} more`);
    if (c.diffs.length) process.exitCode = 1;
    const cd = configDiff(keptA, keptC);
    checks.push(`config.json fields that differ, (a) / (c): ${cd.length ? cd.join("; ") : "none"}`);
  }
  for (const l of checks) say(`  ${l}`);
  rmSync(keptA, { recursive: true, force: true });
  rmSync(keptC, { recursive: true, force: true });
  say();

  const ok = (name) => (results[name] ?? []).filter((r) => !r.failed);
  const best = (name) => ok(name).reduce((x, y) => (y.seconds < x.seconds ? y : x), ok(name)[0]);
  const peak = (name) => Math.max(...ok(name).map((r) => r.rssKiB)) / 1024;
  const lines = [];
  lines.push("| route | best wall | all runs (s) | MB/s | CPU (user+sys) | peak RSS (max of runs) | output | others before best |");
  lines.push("|---|---:|---|---:|---:|---:|---:|---:|");
  for (const name of Object.keys(routes)) {
    const b = best(name);
    if (!b) {
      lines.push(`| ${routes[name].label} | failed | | | | | | |`);
      continue;
    }
    lines.push(
      `| ${routes[name].label} | ${fmt(b.seconds)} s | ${results[name].map((r) => (r.failed ? "failed" : fmt(r.seconds))).join(", ")} | ` +
        `${fmt(mb(sourceBytes) / b.seconds, 0)} | ${fmt(b.cpu)} s | ${fmt(peak(name), 0)} MiB | ${fmt(mb(b.outBytes), 0)} MB | ${fmt(100 * b.background, 0)} % |`,
    );
  }
  lines.push("");
  const A = best("a");
  const B = best("b");
  const C = routes.c ? best("c") : undefined;
  const verdict = (good) => (good ? "met" : "**missed**");
  lines.push("| ratio | measured | target | |");
  lines.push("|---|---:|---:|---|");
  if (A && B) {
    lines.push(
      `| wall, (a) / (b) | ${fmt(A.seconds / B.seconds)}x | <= ${TARGETS.wallVsConvert}x | ${verdict(A.seconds / B.seconds <= TARGETS.wallVsConvert)} |`,
    );
    lines.push(`| CPU, (a) / (b) | ${fmt(A.cpu / B.cpu)}x | | |`);
    lines.push(`| peak RSS, (a) / (b) | ${fmt(peak("a") / peak("b"))}x | | |`);
  }
  if (A) lines.push(`| peak RSS of (a) | ${fmt(peak("a"), 0)} MiB | <= ${TARGETS.rssMiB} MiB | ${verdict(peak("a") <= TARGETS.rssMiB)} |`);
  if (A && C) {
    lines.push(`| wall, (c) / (a) | ${fmt(C.seconds / A.seconds, 1)}x | | |`);
    lines.push(`| CPU, (c) / (a) | ${fmt(C.cpu / A.cpu, 1)}x | | |`);
    lines.push(`| peak RSS, (c) / (a) | ${fmt(peak("c") / peak("a"), 1)}x | | |`);
  }
  const disturbed = Object.keys(routes).filter((n) => best(n) && best(n).background > BUSY_WARN);
  if (disturbed.length)
    lines.push(
      "",
      `Other work kept more than ${fmt(100 * BUSY_WARN, 0)} % of the CPUs busy just before the best run of ${disturbed.join(", ")}: compare the ratios, not the times.`,
    );
  for (const l of lines) say(l);
  say();
  return { lines, checks };
}

// ---------------------------------------------------------------------------------------------------

const fsInfo = statfsSync(".");
say("# orbax2reg Hugging Face export benchmark");
say();
say(
  `  ${os.cpus().length} CPUs (${os.cpus()[0]?.model ?? "?"}), ${fmt(os.totalmem() / 2 ** 30, 1)} GiB (${fmt(os.freemem() / 2 ** 30, 1)} GiB free), ` +
    `${fmt((fsInfo.bavail * fsInfo.bsize) / 2 ** 30, 0)} GiB free on disk; node ${process.version}; load average ${os
      .loadavg()
      .map((x) => fmt(x, 1))
      .join(" ")}`,
);
mkdirSync(OUT, { recursive: true });

/**
 * export-hf of the params cut N ways (bench/gen_fuji_cut.py) against (b) on the 2 GB Orbax step (the same params,
 * cut 8 ways), interleaved, best of `runs` each.
 */
async function benchCuts(cuts, runs, orbaxStep) {
  const dest = join(OUT, "cut");
  say(`## The params cut N ways per weight (bench/gen_fuji_cut.py), export-hf against convert of the 2 GB step`);
  say();
  const steps = {};
  for (const n of cuts) {
    const gen = must(sh(PYTHON, ["bench/gen_fuji_cut.py", String(n)], { stdio: ["ignore", "pipe", "inherit"] }), "bench/gen_fuji_cut.py");
    const info = JSON.parse(gen.stdout.trim().split("\n").pop());
    steps[n] = resolve(info.step_dir);
    warm(filesUnder(steps[n]));
    say(`  cut ${n}: ${info.step_dir}, ${filesUnder(steps[n]).length} files, ${info.stored_bytes.toLocaleString("en-US")} B`);
  }
  say();
  const routes = [
    ["convert", [CLI, ["convert", orbaxStep, dest, "--params-only", "--dtype", "bfloat16", "--json"]]],
    ...cuts.map((n) => [`export-hf cut ${n}`, [CLI, ["export-hf", steps[n], dest, "--json", "--no-progress"]]]),
  ];
  const results = Object.fromEntries(routes.map(([name]) => [name, []]));
  for (let round = 1; round <= runs; round++) {
    for (const [name, cmd] of routes) {
      freshDir(dest);
      const background = cpuBusy();
      const r = await timed(...cmd);
      r.background = background;
      r.flush = syncSeconds();
      if (r.status !== 0) {
        say(`  ${round}. ${name} FAILED (exit ${r.status}): ${r.stderr.trim().split("\n").slice(-3).join(" | ")}`);
        process.exitCode = 1;
        continue;
      }
      if (name !== "convert") {
        const j = JSON.parse(r.stdout);
        r.report = j;
        if (r.stderr.trim() !== "") say(`     stderr: ${r.stderr.trim()}`);
        if (readdirSync(dest).some((f) => f.startsWith(".orbax2reg-spill."))) {
          say(`  ${round}. ${name}: scratch objects LEFT BEHIND`);
          process.exitCode = 1;
        }
      }
      results[name].push(r);
      const extra = r.report
        ? `  re-reads ${r.report.chunkRereads}  decoders ${r.report.peakOpenDecoders}/${r.report.decodersNeeded}  spilled ${r.report.spilledArrays}`
        : "";
      say(
        `  ${round}. ${name.padEnd(18)} ${fmt(r.seconds).padStart(7)} s  CPU ${fmt(r.cpu).padStart(6)} s  peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(5)} MiB  (others ${fmt(100 * background, 0)} %)${extra}`,
      );
    }
  }
  rmSync(dest, { recursive: true, force: true });
  say();
  const best = (name) => results[name].reduce((x, y) => (y.seconds < x.seconds ? y : x), results[name][0]);
  const conv = best("convert");
  const lines = [
    "| route | best wall | wall / convert | CPU (user+sys) | peak RSS | chunk re-reads | decoders open / per layer | spilled arrays | others before best |",
    "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
  ];
  for (const [name] of routes) {
    const b = best(name);
    if (!b) {
      lines.push(`| ${name} | failed | | | | | | | |`);
      continue;
    }
    const j = b.report;
    const rss = Math.max(...results[name].map((r) => r.rssKiB)) / 1024;
    lines.push(
      `| ${name} | ${fmt(b.seconds)} s | ${conv ? `${fmt(b.seconds / conv.seconds)}x` : ""} | ${fmt(b.cpu)} s | ${fmt(rss, 0)} MiB | ` +
        `${j ? j.chunkRereads : ""} | ${j ? `${j.peakOpenDecoders} / ${j.decodersNeeded}` : ""} | ${j ? j.spilledArrays : ""} | ${fmt(100 * b.background, 0)} % |`,
    );
  }
  lines.push("", `Targets: each cut's wall <= ${TARGETS.wallVsConvert}x convert's, peak RSS <= ${TARGETS.rssMiB} MiB, no chunk re-read.`);
  for (const l of lines) say(l);
  say();
}

if (opts.cuts !== undefined || opts.onlyCuts) {
  const { dir, files } = fujiStep(PYTHON);
  warm(files);
  await benchCuts(opts.cuts ?? [8, 256, 1024], RUNS, dir);
}

if (!opts.onlyBig && !opts.onlyCuts) {
  const { info, dir, files, bytes } = fujiStep(PYTHON);
  say(`  2 GB step ${info.step_dir}: ${info.arrays} arrays, ${bytes.toLocaleString("en-US")} B on disk (float32 params + Adam mu/nu)`);
  warm(files);
  say("  warm-up: the whole source read once; every run reads it from the page cache");
  say();
  await benchSize({
    label: `2 GB step (bench/gen_fuji.py: fuji-7B-v2 shrunk to dim ${info.dims.dim}, ${info.dims.layers} layers; params + Adam state)`,
    step: dir,
    sourceBytes: bytes,
    runs: RUNS,
    python: !opts.noPython,
  });
}

if (opts.big || opts.onlyBig) {
  say("Big step: generating or reusing bench/.generated/fuji-big (bench/gen_fuji_big.py) ...");
  const gen = must(
    sh(PYTHON, ["bench/gen_fuji_big.py", ...(BIG_DIMS ? ["--dims", BIG_DIMS] : [])], { stdio: ["ignore", "pipe", "inherit"] }),
    "bench/gen_fuji_big.py",
  );
  const info = JSON.parse(gen.stdout.trim().split("\n").pop());
  const dir = resolve(info.step_dir);
  const files = filesUnder(dir);
  const bytes = bytesUnder(dir);
  // Each run writes about half the float32 step (bfloat16) beside it: refuse when that would nearly fill the disk.
  const fsNow = statfsSync(".");
  const free = fsNow.bavail * fsNow.bsize;
  if (free < info.raw_bytes / 2 + 8 * 2 ** 30) {
    console.error(
      `only ${fmt(free / 2 ** 30, 1)} GiB free on disk: the big step's runs need ${fmt(info.raw_bytes / 2 / 2 ** 30, 1)} GiB plus 8 GiB to spare; ` +
        "scale it down with --big-dims (e.g. layers=16) or free space",
    );
    if (!opts.keepBig) rmSync(resolve("bench/.generated/fuji-big"), { recursive: true, force: true });
    rmSync(OUT, { recursive: true, force: true });
    process.exit(1);
  }
  const cold = bytes > os.totalmem() / 2;
  // The Python route peaked at 1.9x the restored state on the 2 GB step; with other work on the machine, run it
  // only where 2.5x the state fits in the memory available now.
  const pythonFits = info.raw_bytes * 2.5 < os.freemem();
  say(
    `  big step ${info.step_dir}: ${info.arrays} arrays, ${bytes.toLocaleString("en-US")} B on disk (float32 params; generated in ${info.seconds} s)` +
      (cold ? "; larger than half the memory: read from disk (no warm-up)" : ""),
  );
  if (!cold) warm(files);
  say();
  await benchSize({
    label: `big step (bench/gen_fuji_big.py: fuji-7B-v2's dims dim ${info.dims.dim}, ${info.dims.layers} layers, ffn ${info.dims.ffn}, vocab ${info.dims.vocab}; params only)`,
    step: dir,
    sourceBytes: bytes,
    runs: BIG_RUNS,
    python: !opts.noPython && pythonFits,
    noPython: pythonFits
      ? undefined
      : `restoring the whole state in host memory needs at least the step's ${fmt(info.raw_bytes / 2 ** 30, 1)} GiB of float32 (it peaked at ~1.9x the state's size on the 2 GB step), and 2.5x that is more than the ${fmt(os.freemem() / 2 ** 30, 1)} GiB this machine has available`,
  });
  if (!opts.keepBig) rmSync(resolve("bench/.generated/fuji-big"), { recursive: true, force: true });
}
rmSync(OUT, { recursive: true, force: true });
