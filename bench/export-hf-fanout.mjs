#!/usr/bin/env node
// The Hugging Face export fanned out over tasks (issue 45): the ~2 GB fuji-shaped step (bench/gen_fuji.py) in
// fake-gcs-server over TLS (its folder on tmpfs), exported to gs:// on the same emulator as the pipeline's tasks
// will: `export-hf --begin --task-count N`, then N processes at once (`--task-index I --task-count N`), then
// `--finalize`; for N = 1, 2 and 4, and the single command `export-hf` beside them. Per task: wall, CPU, peak
// RSS, bytes written, chunk re-reads; per N: the wall from begin to the index, its ratio to the 1-task run, and
// whether every shard's md5 (the emulator's) is the single command's. Shards of --max-shard-size (default 50MB:
// about 7 of the step's ~340 MB of bfloat16, so that 4 tasks have shards to share). See bench/README.md
// ("export-hf-fanout.mjs").
//
//   npm run build && node bench/export-hf-fanout.mjs [--tasks 1,2,4] [--max-shard-size 50MB] [--step DIR]
import { existsSync } from "node:fs";
import os from "node:os";
import { relative, resolve } from "node:path";
import { createBucket, emulatorHolding, listObjects, runTrustingTestCa } from "./fake-gcs.mjs";
import { BUSY_WARN, cpuBusy, filesUnder, flag, flags, fmt, fujiStep, must, ROOT, requireBuilt, say, timed } from "./lib.mjs";

const opts = flags(process.argv.slice(2), {
  "--tasks": flag.counts("1,2,4"),
  "--max-shard-size": flag.text("50MB", "SIZE"),
  "--step": flag.text(undefined, "DIR"),
});
const TASKS = opts.tasks;
const SHARD = opts.maxShardSize;
requireBuilt();
await runTrustingTestCa();
process.chdir(ROOT);
const CLI = "bin/orbax2reg.js";
const FS_ROOT = existsSync("/dev/shm")
  ? `/dev/shm/orbax2reg-bench-export-fanout-${process.pid}`
  : `${os.tmpdir()}/orbax2reg-bench-export-fanout-${process.pid}`;

say("# export-hf fanned out over tasks (fake-gcs-server over TLS, source and destination)");
say();
say(
  `Machine: ${os.cpus().length} CPUs, node ${process.version}; load before the runs: ${os
    .loadavg()
    .map((x) => fmt(x))
    .join(", ")} (1, 5, 15 min)`,
);
// --step DIR: another local Orbax step instead of the generated one (a smaller one checks the benchmark itself).
const given = opts.step;
const {
  info,
  dir: STEP,
  name: STEP_NAME,
  files,
} = given === undefined
  ? fujiStep(".venv/bin/python")
  : {
      info: { step_dir: given, arrays: "?" },
      dir: resolve(given),
      name: resolve(given).split("/").pop(),
      files: filesUnder(resolve(given)),
    };
const SRC = `gs://src/ckpt/${STEP_NAME}`;
const { emulator } = await emulatorHolding(
  FS_ROOT,
  "src",
  files.map((f) => [f, `ckpt/${STEP_NAME}/${relative(STEP, f)}`]),
);
await createBucket(emulator.plainUrl, "dst");
const ENV = { ORBAX2REG_GCS_ENDPOINT: emulator.url };
say(`Source: ${info.step_dir} (${info.arrays} arrays) uploaded to ${SRC}; served over TLS at ${emulator.url}`);
say(`Shards: --max-shard-size ${SHARD}; each task the default --memory (336 MiB)`);
say();

const cli = (dest, ...extra) => [CLI, "export-hf", SRC, dest, "--max-shard-size", SHARD, "--json", "--no-progress", ...extra];
/** The shards under a destination prefix, by name: their md5 (the emulator's) and size. */
async function shards(prefix) {
  const objects = await listObjects(emulator.plainUrl, "dst", `${prefix}/`);
  return new Map(
    objects.filter((o) => o.name.endsWith(".safetensors")).map((o) => [o.name.slice(prefix.length + 1), `${o.md5Hash} ${o.size}`]),
  );
}
const busy = [];

// The single command: the reference bytes.
busy.push(cpuBusy());
const single = must(await timed(process.execPath, cli("gs://dst/single"), ENV), "export-hf");
const singleJson = JSON.parse(single.stdout);
const reference = await shards("single");
say(
  `export-hf (one command): ${fmt(single.seconds)} s, CPU ${fmt(single.cpu)} s, peak RSS ${fmt(single.rssKiB / 1024, 0)} MiB; ` +
    `${singleJson.shards.length} shards, ${fmt(singleJson.totalSize / 1e6, 1)} MB, ${singleJson.chunkRereads} chunk re-reads`,
);
say();

const rows = [];
for (const n of TASKS) {
  busy.push(cpuBusy());
  const dest = `gs://dst/tasks-${n}`;
  const t0 = performance.now();
  const begun = must(await timed(process.execPath, cli(dest, "--begin", "--task-count", String(n)), ENV), `--begin (${n})`);
  const plan = JSON.parse(begun.stdout);
  const runs = await Promise.all(
    plan.tasks.map((t) => timed(process.execPath, cli(dest, "--task-index", String(t.index), "--task-count", String(n)), ENV)),
  );
  for (const [i, r] of runs.entries()) must(r, `--task-index ${i} (${n})`);
  const tasksDone = performance.now();
  const fin = must(await timed(process.execPath, cli(dest, "--finalize"), ENV), `--finalize (${n})`);
  const wall = (performance.now() - t0) / 1000;
  const got = await shards(`tasks-${n}`);
  const same = got.size === reference.size && [...reference].every(([k, v]) => got.get(k) === v);
  if (!same) process.exitCode = 1;
  const tasks = runs.map((r) => ({ ...r, json: JSON.parse(r.stdout) }));
  say(
    `${n} task(s): begin ${fmt(begun.seconds)} s, tasks ${fmt((tasksDone - t0) / 1000 - begun.seconds)} s, finalize ${fmt(fin.seconds)} s; shards ${same ? "byte-identical to the single command's (md5)" : "DIFFER from the single command's"}`,
  );
  for (const t of tasks)
    say(
      `  task ${t.json.task}: ${t.json.shards.length} shard(s), ${fmt(t.json.bytes / 1e6, 1)} MB, ${fmt(t.seconds)} s, CPU ${fmt(t.cpu)} s, ` +
        `peak RSS ${fmt(t.rssKiB / 1024, 0)} MiB, ${t.json.chunkRereads} chunk re-reads`,
    );
  rows.push({ n, wall, begun, fin, tasks, same });
}
say();

const base = rows.find((r) => r.n === 1) ?? rows[0];
say(
  "| tasks | wall, begin to index | vs 1 task | begin / finalize | per task: wall, peak RSS, MB written, chunk re-reads | CPU, all processes | shards as the single command's |",
);
say("|---:|---:|---:|---|---|---:|---|");
for (const r of rows) {
  const cpu = r.begun.cpu + r.fin.cpu + r.tasks.reduce((a, t) => a + t.cpu, 0);
  const per = r.tasks
    .map((t) => `${fmt(t.seconds, 1)} s, ${fmt(t.rssKiB / 1024, 0)} MiB, ${fmt(t.json.bytes / 1e6, 0)} MB, ${t.json.chunkRereads}`)
    .join("; ");
  say(
    `| ${r.n} | ${fmt(r.wall, 1)} s | ${fmt(r.wall / base.wall)}x | ${fmt(r.begun.seconds, 1)} s / ${fmt(r.fin.seconds, 1)} s | ${per} | ${fmt(cpu, 1)} s | ${r.same ? "yes" : "NO"} |`,
  );
}
say(
  `| export-hf | ${fmt(single.seconds, 1)} s | ${fmt(single.seconds / base.wall)}x | (one process) | ${fmt(single.seconds, 1)} s, ${fmt(single.rssKiB / 1024, 0)} MiB, ${fmt(singleJson.totalSize / 1e6, 0)} MB, ${singleJson.chunkRereads} | ${fmt(single.cpu, 1)} s | (reference) |`,
);
const most = Math.max(...busy);
say();
say(
  `CPUs busy with other work before the runs: ${busy.map((b) => `${fmt(b * 100, 0)} %`).join(", ")}${most > BUSY_WARN ? " (the machine was shared: figures disturbed)" : ""}`,
);
emulator.stop(); // its folder is removed on exit (bench/fake-gcs.mjs)
