#!/usr/bin/env node
// Conversion benchmark: one real ~2 GB Orbax step shaped like fuji-7B-v2 (bench/gen_fuji.py), converted
// side by side by (1) `cp -r` of the step (the I/O floor), (2) `orbax2reg convert` and (3) the Python route
// users take today (bench/python_route.py: orbax restore as numpy + TensorStore zarr writes). Best of 3.
//
//   npx tsc -p tsconfig.build.json && node bench/convert.mjs [--runs N] [--profile | --no-profile] [--no-strace]
//
// The source is read once before the runs (a warm-up), so every run reads it from a warm page cache;
// nothing is dropped from the page cache. Before each run the destination is deleted and `sync` flushes
// the previous run's dirty pages, so one run's writeback does not land in the next one's time. A run's
// wall time ends when its process exits (no fsync: cp and orbax2reg leave data in the page cache;
// TensorStore's file driver fsyncs, as it does for users). See bench/README.md.
import { closeSync, mkdirSync, openSync, readFileSync, readSync, rmSync, statfsSync } from "node:fs";
import os from "node:os";
import { join, resolve } from "node:path";
import {
  BUSY_WARN,
  cpuBusy,
  cpuProfile,
  filesUnder,
  flag,
  flags,
  fmt,
  freshDir,
  fujiStep,
  mb,
  mib,
  must,
  profileSummary,
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
const GEN = "bench/.generated";
const OUT = resolve(GEN, "out");
/** Run as a command, as users run it: its launcher sets the runtime (bin/orbax2reg.js). */
const CLI = "bin/orbax2reg.js";
const TARGETS = { cpRatio: 0.5, cpRatioAim: 0.8, durableRatio: 0.8, pythonRatio: 5, rssMiB: 512 };

const opts = flags(process.argv.slice(2), {
  "--runs": flag.count(3),
  "--profile": flag.on(),
  "--no-profile": flag.on(),
  "--no-strace": flag.on(),
});
const RUNS = opts.runs;
requireBuilt();
requireFiles([[PYTHON, "run `npm run setup` (the generator and the Python route need the real orbax)"]]);

// ---------------------------------------------------------------------------------------------------
// The machine.

function machine() {
  const cpu = (readFileSync("/proc/cpuinfo", "utf8").match(/^model name\s*:\s*(.*)$/m) ?? [])[1] ?? "?";
  mkdirSync(GEN, { recursive: true });
  const fs = statfsSync(GEN);
  const mounts = readFileSync("/proc/mounts", "utf8")
    .split("\n")
    .map((l) => l.split(" "))
    .filter((m) => m.length > 2 && resolve(GEN).startsWith(m[1]))
    .sort((a, b) => b[1].length - a[1].length)[0];
  const py = sh(PYTHON, [
    "-c",
    "import sys, importlib.metadata as m; print(sys.version.split()[0], *(m.version(p) for p in ('orbax-checkpoint', 'jax', 'tensorstore')))",
  ]).stdout.trim();
  const [pyv, orbax, jax, tensorstore] = py.split(" ");
  return {
    cpus: `${sh("nproc", []).stdout.trim()} (${cpu})`,
    memory: `${fmt(os.totalmem() / 2 ** 30, 1)} GiB (${fmt(os.freemem() / 2 ** 30, 1)} GiB free)`,
    disk: `${fmt((fs.bavail * fs.bsize) / 2 ** 30, 0)} GiB free of ${fmt((fs.blocks * fs.bsize) / 2 ** 30, 0)} GiB (${mounts?.[2] ?? "?"} on ${mounts?.[0] ?? "?"}, mounted at ${mounts?.[1] ?? "?"})`,
    kernel: `${os.type()} ${os.release()}`,
    node: process.version,
    python: `${pyv} (orbax-checkpoint ${orbax}, jax ${jax}, tensorstore ${tensorstore})`,
    cp: sh("cp", ["--version"]).stdout.split("\n")[0],
  };
}

// ---------------------------------------------------------------------------------------------------

say("# orbax2reg conversion benchmark");
say();
const m = machine();
say("Machine:");
for (const [k, v] of Object.entries(m)) say(`  ${k.padEnd(7)} ${v}`);
const loadBefore = os.loadavg();
say(`  load    ${loadBefore.map((x) => fmt(x)).join(" ")} (1/5/15 min) before the benchmark`);
const busyBefore = cpuBusy(1000);
say(`  busy    ${fmt(100 * busyBefore, 0)} % of the CPUs busy with other work before the benchmark`);
if (busyBefore > BUSY_WARN) say("  WARNING: other work is running; runs that start while it lasts are flagged below");
say();

// 1. The source (generated once, cached under bench/.generated/fuji-mini).
const { info, dir: STEP, name: STEP_NAME, files: sourceFiles, bytes: SOURCE_BYTES } = fujiStep(PYTHON);
const d = info.dims;
say(
  `  ${info.step_dir}: ${info.arrays} arrays, ${sourceFiles.length} files, ${SOURCE_BYTES.toLocaleString("en-US")} B on disk ` +
    `(${fmt(mb(info.raw_bytes), 0)} MB raw float32), version "${info.version}"`,
);
say(
  `  fuji-7B-v2 tree scaled down: dim ${d.dim}, ${d.layers} layers, ${d.heads} heads x ${d.head_dim}, ffn ${d.ffn}, vocab ${d.vocab}; ` +
    `params + Adam mu/nu float32, sharded 8-way (fsdp) on 8 CPU devices`,
);
say(
  `  generation: ${info.cached ? "cached; it took" : "took"} ${info.seconds} s (values ${info.values_seconds} s, orbax save ${info.save_seconds} s)`,
);

// 2. Warm-up: read the whole source once, so all three routes read it from the page cache.
{
  const t0 = performance.now();
  const buf = Buffer.allocUnsafe(8 << 20);
  for (const f of sourceFiles) {
    const fd = openSync(f, "r");
    while (readSync(fd, buf, 0, buf.length, null) > 0) {}
    closeSync(fd);
  }
  const s = (performance.now() - t0) / 1000;
  say(`  warm-up: read the whole source once (${fmt(s)} s); every run below reads it from a warm page cache, nothing is dropped`);
}
say();

// 3. Runs, interleaved: round i runs cp, orbax2reg, python once each.
const DEST = { cp: join(OUT, "cp"), orbax2reg: join(OUT, "orbax2reg"), python: join(OUT, "python") };
const ROUTES = {
  cp: { label: "`cp -r` (I/O floor)", cmd: ["cp", ["-r", STEP, `${DEST.cp}/`]] },
  orbax2reg: { label: "`orbax2reg convert`", cmd: [CLI, ["convert", STEP, DEST.orbax2reg, "--json"]] },
  python: { label: "Python route (orbax restore + TensorStore write)", cmd: [PYTHON, ["bench/python_route.py", STEP, DEST.python]] },
};
const results = { cp: [], orbax2reg: [], python: [] };
const verifies = [];
mkdirSync(OUT, { recursive: true });
say(`Runs (best of ${RUNS}; destination deleted and \`sync\` before each run; "flush" = the \`sync\` right after it, not counted):`);
for (let round = 1; round <= RUNS; round++) {
  for (const name of Object.keys(ROUTES)) {
    freshDir(DEST[name]);
    const background = cpuBusy();
    const r = must(await timed(...ROUTES[name].cmd), name);
    r.background = background;
    r.flush = syncSeconds();
    let extra = "";
    if (name === "orbax2reg") {
      const s = JSON.parse(r.stdout);
      r.summary = s;
      extra = `; ${s.written} objects written, ${s.seconds} s inside`;
    } else if (name === "python") {
      const s = JSON.parse(r.stdout.trim().split("\n").pop());
      extra = `; restore ${s.restore_s} s, write ${s.write_s} s inside`;
    }
    results[name].push(r);
    say(
      `  ${String(round)}. ${name.padEnd(9)} ${fmt(r.seconds).padStart(6)} s  ${fmt(mb(SOURCE_BYTES) / r.seconds, 0).padStart(5)} MB/s  ` +
        `CPU ${fmt(r.cpu).padStart(6)} s  peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(5)} MiB  flush ${fmt(r.flush)} s  (others ${fmt(100 * background, 0)} % CPU before)${extra}`,
    );
    // Prove the output right (not timed): orbax2reg after every run, the Python route once (same checks).
    if (name === "orbax2reg" || (name === "python" && round === 1)) {
      const t0 = performance.now();
      const v = sh(process.execPath, [CLI, "verify", STEP, join(DEST[name], STEP_NAME), "--json"], { maxBuffer: 64 << 20 });
      const j = v.status === 0 || v.status === 4 ? JSON.parse(v.stdout) : { passed: 0, failed: 1, checks: [] };
      verifies.push({ name, round, ...j, seconds: (performance.now() - t0) / 1000 });
      const bad = j.checks.filter((c) => !c.ok).map((c) => `${c.name}: ${c.detail}`);
      say(
        `     verify ${name} output: ${j.passed} passed, ${j.failed} failed (${fmt((performance.now() - t0) / 1000, 1)} s)${bad.length ? ` -- ${bad.slice(0, 3).join("; ")}` : ""}`,
      );
      if (j.failed !== 0 || v.status !== 0) process.exitCode = 1;
    }
  }
}
say();

// 4. Store operations of orbax2reg: the plan, the destination, and a counted in-process run.
const o2rStep = join(DEST.orbax2reg, STEP_NAME);
/** The plan on record (its head, `.orbax2reg/plan.json`, and commit part) and every object of its parts, in order. */
async function planWithObjects(dest, step) {
  const { loadPlan } = await import("../dist/src/convert/convert.js");
  const { readPart } = await import("../dist/src/convert/ownership.js");
  const { partsOf } = await import("../dist/src/convert/finalize.js");
  const loaded = await loadPlan(dest, step);
  const parts = [];
  for (const ref of partsOf(loaded.plan)) parts.push(await readPart(loaded.destination, loaded.plan, ref));
  return { ...loaded, parts, objects: parts.flatMap((p) => p.objects) };
}
const { plan: head, objects: planObjects } = await planWithObjects(DEST.orbax2reg, Number(STEP_NAME.slice(5)));
const plan = { ...head, objects: planObjects };
const destFiles = filesUnder(o2rStep);
const chunkObjects = plan.objects.filter((o) => !/(^|\/)\.z(array|attrs|group)$|zarr\.json$/.test(o.target));
const rangedChunks = chunkObjects.filter((o) => o.data.kind === "range");
const transforms = {};
for (const o of plan.objects) transforms[o.transform] = (transforms[o.transform] ?? 0) + 1;

async function countedRun() {
  const { planPhase } = await import("../dist/src/convert/convert.js");
  const { executeObjects, DEFAULT_EXECUTE } = await import("../dist/src/convert/execute.js");
  const { finalize } = await import("../dist/src/convert/finalize.js");
  const { CountingStore } = await import("../dist/src/store/counting.js");
  const dest = join(OUT, "counted");
  freshDir(dest);
  const opts = { groups: 1, paramsOnly: false, allowUncommitted: false, force: false, dryRun: false };
  await planPhase(STEP, dest, opts);
  const loaded = await planWithObjects(dest, plan.step);
  const source = new CountingStore(loaded.source, { log: true });
  const destination = new CountingStore(loaded.destination);
  // The CLI's defaults (concurrency 16, 256 MiB) are DEFAULT_EXECUTE; a part of the plan at a time.
  for (const part of loaded.parts) {
    await executeObjects(part, part.objects, source, destination, { ...DEFAULT_EXECUTE, part: { group: part.group, part: part.part } });
  }
  await finalize(loaded.plan, source, destination);
  rmSync(dest, { recursive: true, force: true });
  return { source: source.counts, destination: destination.counts, ranges: source.ranges };
}
const counted = await countedRun();

/** Syscalls of one orbax2reg convert under strace -f (opens, reads, writes on source data files / destination). */
function straceRun() {
  if (opts.noStrace || sh("strace", ["-V"]).status !== 0) return undefined;
  const dest = join(OUT, "strace");
  freshDir(dest);
  const log = join(OUT, "strace.log");
  const r = sh(
    "strace",
    [
      "-f",
      "-qq",
      "-s",
      "0",
      "-o",
      log,
      "-e",
      "trace=openat,close,read,pread64,readv,preadv,write,pwrite64,writev,pwritev",
      process.execPath,
      CLI,
      "convert",
      STEP,
      dest,
    ],
    { maxBuffer: 64 << 20 },
  );
  if (r.status !== 0) return undefined;
  const fds = new Map(); // "fd" -> "src" | "dst"
  const pending = new Map();
  const c = { srcOpens: 0, srcReads: 0, srcReadBytes: 0, dstCreates: 0, dstWrites: 0, dstWriteBytes: 0 };
  const dataPrefix = `${STEP}/state/`;
  for (let line of readFileSync(log, "utf8").split("\n")) {
    const pid = line.split(" ", 1)[0];
    if (line.includes("<unfinished ...>")) {
      pending.set(pid, line.replace(/ <unfinished \.\.\.>$/, ""));
      continue;
    }
    const resumed = line.match(/^(\d+)\s+<\.\.\. \w+ resumed>(.*)$/);
    if (resumed) {
      line = `${pending.get(pid) ?? ""}${resumed[2]}`;
      pending.delete(pid);
    }
    const call = line.match(/^\d+\s+(\w+)\((.*)\)\s+= (-?\d+)/);
    if (!call) continue;
    const [, name, rest, ret] = call;
    const result = Number(ret);
    if (name === "openat") {
      const path = (rest.match(/"([^"]*)"/) ?? [])[1] ?? "";
      if (result < 0) continue;
      if (path.startsWith(dataPrefix) && /\/d\/[^/]+$/.test(path)) {
        fds.set(result, "src");
        c.srcOpens++;
      } else if (path.startsWith(dest) && rest.includes("O_CREAT")) {
        fds.set(result, "dst");
        c.dstCreates++;
      } else fds.delete(result);
    } else if (name === "close") {
      fds.delete(Number(rest));
    } else {
      const kind = fds.get(Number(rest.split(",", 1)[0]));
      if (kind === "src" && name.includes("read") && result >= 0) {
        c.srcReads++;
        c.srcReadBytes += result;
      } else if (kind === "dst" && name.includes("write") && result >= 0) {
        c.dstWrites++;
        c.dstWriteBytes += result;
      }
    }
  }
  rmSync(log, { force: true });
  rmSync(dest, { recursive: true, force: true });
  return c;
}
const sys = straceRun();

// 5. Results.
const best = (name) => results[name].reduce((a, b) => (b.seconds < a.seconds ? b : a));
const peak = (name) => Math.max(...results[name].map((r) => r.rssKiB)) / 1024;
const B = { cp: best("cp"), orbax2reg: best("orbax2reg"), python: best("python") };
const cpRatio = B.cp.seconds / B.orbax2reg.seconds;
const pyRatio = B.python.seconds / B.orbax2reg.seconds;
// Durable against durable: orbax2reg flushes the whole step before its index (its flush is ~0); cp's data reaches
// the disk only with the sync after it.
const durable = (name) => Math.min(...results[name].map((r) => r.seconds + r.flush));
const durableRatio = durable("cp") / durable("orbax2reg");
const o2rRss = peak("orbax2reg");
const verdict = (ok) => (ok ? "met" : "**missed**");

const lines = [];
const out = (l = "") => lines.push(l);
out(
  `Source: ${info.arrays}-array fuji-7B-v2-shaped Orbax step (dim ${d.dim}, ${d.layers} layers, ffn ${d.ffn}, vocab ${d.vocab}; params + Adam mu/nu float32), ` +
    `${fmt(mb(SOURCE_BYTES), 0)} MB on disk in ${sourceFiles.length} files, ${chunkObjects.length} chunks (${rangedChunks.length} out of line). ` +
    `Machine: ${m.cpus.split(" ")[0]} cores, ${fmt(os.totalmem() / 2 ** 30, 0)} GiB RAM, ${m.disk.replace(/ \(.*/, "")} local ${(m.disk.match(/\((\w+) on/) ?? [])[1] ?? ""} disk; node ${m.node}, Python ${m.python.split(" ")[0]}. ` +
    `Best of ${RUNS}, warm page cache (source read once before the runs, nothing dropped); MB/s = source bytes on disk / wall time.`,
);
out();
out("| route | best wall time | all runs (s) | MB/s | CPU (user+sys) | peak RSS | throughput vs cp | best wall + flush |");
out("|---|---:|---|---:|---:|---:|---:|---:|");
for (const name of Object.keys(ROUTES)) {
  const b = B[name];
  out(
    `| ${ROUTES[name].label} | ${fmt(b.seconds)} s | ${results[name].map((r) => fmt(r.seconds)).join(", ")} | ${fmt(mb(SOURCE_BYTES) / b.seconds, 0)} | ${fmt(b.cpu)} s | ` +
      `${fmt(peak(name), 0)} MiB | ${fmt(B.cp.seconds / b.seconds)}x | ${fmt(Math.min(...results[name].map((r) => r.seconds + r.flush)))} s |`,
  );
}
out();
out(
  '"flush" is the `sync` after a run: cp leaves its output in the page cache; orbax2reg flushes its step before the index, TensorStore each file. ' +
    "CPU and wall time are those of the best run.",
);
out();
out("| target | measured | goal | |");
out("|---|---:|---|---|");
out(
  `| orbax2reg throughput / cp throughput | ${fmt(cpRatio)}x | >= ${TARGETS.cpRatio}x (aim ${TARGETS.cpRatioAim}x) | ${verdict(cpRatio >= TARGETS.cpRatio)}${cpRatio >= TARGETS.cpRatio && cpRatio < TARGETS.cpRatioAim ? " (below the aim)" : ""} |`,
);
out(
  `| orbax2reg durable / \`cp -r\` + \`sync\` (both on disk) | ${fmt(durableRatio)}x | >= ${TARGETS.durableRatio}x | ${verdict(durableRatio >= TARGETS.durableRatio)} |`,
);
out(
  `| orbax2reg speed / Python route speed | ${fmt(pyRatio, 1)}x | >= ${TARGETS.pythonRatio}x | ${verdict(pyRatio >= TARGETS.pythonRatio)} |`,
);
out(
  `| orbax2reg peak RSS (max of ${RUNS} runs) | ${fmt(o2rRss, 0)} MiB | <= ${TARGETS.rssMiB} MiB | ${verdict(o2rRss <= TARGETS.rssMiB)} |`,
);
out();
const execReads = counted.source.rangeReads + counted.source.reads;
const coalescedNote = execReads <= chunkObjects.length ? "1 ranged read per chunk or fewer (coalesced)" : "more than 1 read per chunk";
out("| orbax2reg store operations (one run) | |");
out("|---|---|");
out(
  `| plan (\`.orbax2reg/plan.json\`) | ${plan.objects.length} objects (${Object.entries(transforms)
    .map(([k, v]) => `${v} ${k}`)
    .join(
      ", ",
    )}: ${chunkObjects.length} chunks + ${plan.objects.length - chunkObjects.length} \`.zarray\`), ${plan.groups.length} group(s), ${plan.files.length} iterator files |`,
);
out(`| destination files | ${destFiles.length} (${plan.objects.length} objects + \`index\` + the plan) |`);
out(
  `| source reads while copying (CountingStore) | ${counted.source.rangeReads} ranged + ${counted.source.reads} whole reads for ${chunkObjects.length} chunks ` +
    `(${rangedChunks.length} out of line, ${chunkObjects.length - rangedChunks.length} inline in the B+tree): ${fmt(execReads / chunkObjects.length)} per chunk, ${coalescedNote}; ${fmt(mb(counted.source.bytesRead), 0)} MB |`,
);
out(
  `| destination writes (CountingStore) | ${counted.destination.writes} writes, ${fmt(mb(counted.destination.bytesWritten), 0)} MB, ${counted.destination.lists} list(s), ${counted.destination.stats} stat(s) |`,
);
if (sys) {
  out(
    `| syscalls (strace -f) | ${sys.srcOpens} opens of source data files (${fmt(sys.srcOpens / rangedChunks.length)} per out-of-line chunk), ` +
      `${sys.srcReads} read syscalls on them (avg ${fmt(mib(sys.srcReadBytes / Math.max(sys.srcReads, 1)), 2)} MiB); ${sys.dstCreates} files created, ${sys.dstWrites} write syscalls (avg ${fmt(mib(sys.dstWriteBytes / Math.max(sys.dstWrites, 1)), 2)} MiB) |`,
  );
}
const disturbed = Object.values(results)
  .flat()
  .filter((r) => r.background > BUSY_WARN).length;
const bestDisturbed = Object.keys(results).filter((name) => best(name).background > BUSY_WARN);
if (bestDisturbed.length > 0)
  say(
    `WARNING: other processes kept more than ${fmt(100 * BUSY_WARN, 0)} % of the CPUs busy just before the best run of ${bestDisturbed.join(", ")}; ` +
      "the times are not reliable. Rerun on an idle machine.",
  );
else if (disturbed > 0)
  say(`Note: ${disturbed} run(s) started while other processes were busy (see "others" above); every best run started on an idle machine.`);
else say(`The machine was idle before every run (other processes below ${fmt(100 * BUSY_WARN, 0)} % CPU).`);
say();
say("## Results (markdown for bench/README.md)");
say();
for (const l of lines) say(l);
say();

// 6. Profile orbax2reg when it is below the aim (or with --profile): where its time goes, by src/ line.
if (opts.profile || (!opts.noProfile && (cpRatio < TARGETS.cpRatioAim || pyRatio < TARGETS.pythonRatio || o2rRss > TARGETS.rssMiB))) {
  const dest = join(OUT, "profiled");
  freshDir(dest);
  const { profile: prof, wall } = cpuProfile([CLI, "convert", STEP, dest], resolve(GEN, "convert.cpuprofile"));
  rmSync(dest, { recursive: true, force: true });
  say(`## Profile of one \`orbax2reg convert\` (node --cpu-prof, ${fmt(wall)} s wall; saved to ${GEN}/convert.cpuprofile)`);
  say();
  for (const l of profileSummary(prof)) say(l);
  say();
}

rmSync(OUT, { recursive: true, force: true });
