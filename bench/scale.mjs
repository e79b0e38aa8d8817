#!/usr/bin/env node
// Scale benchmark: real Orbax steps of A float32 arrays each sharded into C chunks of 2 KiB (bench/gen_scale.py:
// orbax's CheckpointManager over C fake CPU devices, AXLearn's layout, one B+tree leaf), timed through the CLI
// as a user runs it: inspect, plan --groups 8, convert (local), verify, and one convert-group of a 256-group
// plan; each with its wall time and peak RSS, beside TensorStore reading the same chunks (per chunk).
//
//   npm run bench:scale [-- --shapes 300x64,1000x64,2000x64 --runs N --convert-max N --gcs 2000x64|none --root-steps 1000]
//
// Then, on fake-gcs-server (bench/fake-gcs.mjs), over HTTPS as GCS serves: the --gcs step converted gs:// -> gs://
// and verified, beside TensorStore's C++ GCS client moving the same chunks (bench/tensorstore_gcs_route.py) over
// plain HTTP from the same emulator (it has no fair TLS run against fake-gcs-server: see bench/README.md); and `convert ROOT`
// of a root of --root-steps copies of the tiny fixture step (commit markers included), with AXLearn's tracker
// file and without it, beside the same root holding one step.
//
// Steps are generated once and cached under bench/.generated/scale/; destinations are written under
// bench/.generated/scale-out-<pid>/ and removed afterwards. Warm page cache (each source is read by inspect first).
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync, rmSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import {
  copyObject,
  createBucket,
  deleteObject,
  deletePrefix,
  each,
  FAKE_GCS,
  runTrustingTestCa,
  startEmulator,
  upload,
} from "./fake-gcs.mjs";
import { bytesUnder, filesUnder, flag, flags, freshDir, ROOT, requireBuilt, say, timed } from "./lib.mjs";

/** A step's shape, ARRAYSxCHUNKS (`2000x64`): A float32 arrays of C chunks each. */
const shape = (s) => {
  const dims = s.split("x").map(Number);
  if (dims.length !== 2 || !dims.every((n) => Number.isInteger(n) && n >= 1)) throw "shapes such as 2000x64";
  return dims;
};
const opts = flags(process.argv.slice(2), {
  "--shapes": flag.parsed("300x64,1000x64,2000x64", "AxC,...|none", (s) =>
    s
      .split(",")
      .filter((x) => x !== "none")
      .map(shape),
  ),
  "--runs": flag.count(1),
  "--convert-max": flag.number(Number.POSITIVE_INFINITY, { metavar: "OBJECTS" }),
  "--gcs": flag.parsed("2000x64", "AxC|none", (s) => {
    if (s !== "none") shape(s);
    return s;
  }),
  "--root-steps": flag.parsed(1000, "N", (s) => {
    const n = s.trim() === "" ? Number.NaN : Number(s);
    if (!Number.isInteger(n) || n < 0) throw "an integer >= 0 (0: no root)";
    return n;
  }),
});
requireBuilt();
// The emulator serves HTTPS with the tests' CA: this process and the CLI it runs trust it (NODE_EXTRA_CA_CERTS).
await runTrustingTestCa();
process.chdir(ROOT);
const PYTHON = ".venv/bin/python";
const CLI = "bin/orbax2reg.js";
// Per process: two runs at once must not remove each other's destinations.
const OUT = resolve(`bench/.generated/scale-out-${process.pid}`);

const SHAPES = opts.shapes;
const RUNS = opts.runs;
/** Steps (by object count) above which convert and verify are not run: `--convert-max N`. */
const CONVERT_MAX = opts.convertMax;
/** The step converted through GCS (`none`: skip the GCS part), and the number of steps in the GCS root. */
const GCS_SHAPE = opts.gcs;
const ROOT_STEPS = opts.rootSteps;

/** Runs a command (bench/lib.mjs's timed()): wall seconds and peak RSS (MB); throws on failure. */
async function run(cmd, argv, env = {}) {
  const r = await timed(cmd, argv, env);
  if (r.status !== 0) throw new Error(`${cmd} ${argv.join(" ")} failed (${r.status}):\n${r.stderr.slice(-2000)}`);
  return { seconds: r.seconds, rssMB: (r.rssKiB * 1024) / 1e6, stdout: r.stdout };
}

/**
 * The best (least wall time) of RUNS runs; `before` runs before each (a fresh destination). A failure is
 * a result too (the table says how it failed): `{ failed: "EMFILE" }`.
 */
async function best(make, before = () => {}) {
  let out;
  for (let i = 0; i < RUNS; i++) {
    before();
    let r;
    try {
      r = await make();
    } catch (e) {
      const m = /(EMFILE|RangeError: [^\n]*|ENOMEM|[A-Z][a-zA-Z]+Error: [^\n]{0,80})/.exec(String(e.message));
      return { failed: m ? m[1] : "failed", detail: String(e.message).slice(-600) };
    }
    if (out === undefined || r.seconds < out.seconds) out = r;
  }
  return out;
}

const node = (...argv) => run(process.execPath, [CLI, ...argv]);
/** Before a run: an empty destination (no `sync`: scale's figures were always taken without one). */
const fresh = (dir) => () => freshDir(dir, { sync: false });

const rows = [];
for (const [arrays, chunks] of SHAPES) {
  const gen = spawnSync(PYTHON, ["bench/gen_scale.py", String(arrays), String(chunks)], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  if (gen.status !== 0) throw new Error(`generating ${arrays}x${chunks} failed`);
  const info = JSON.parse(gen.stdout.trim().split("\n").pop());
  const step = info.step_dir;
  say(`${arrays} x ${chunks}: ${info.objects} objects at ${step}${info.cached ? " (cached)" : ` (generated in ${info.save_seconds} s)`}`);
  const dest = join(OUT, `${arrays}_x_${chunks}`);
  const regular = join(dest, "step_00000100");

  await node("inspect", step, "--json"); // warm the page cache
  const inspect = await best(() => node("inspect", step, "--json"));
  const plan = await best(() => node("plan", step, dest, "--groups", "8"), fresh(dest));
  const planBytes = bytesUnder(join(regular, ".orbax2reg"));
  const convert =
    info.objects > CONVERT_MAX
      ? { failed: "not run", skipped: true }
      : await best(() => node("convert", step, dest, "--json"), fresh(dest));
  if (convert.failed && !convert.skipped) {
    // One process per ~10k objects (plan, convert-group each, finalize): a destination for verify, and the
    // time of the pipeline's route on one machine.
    const groups = Math.ceil(info.objects / 10_000);
    fresh(dest)();
    let seconds = 0;
    let rssMB = 0;
    const add = (r) => {
      seconds += r.seconds;
      rssMB = Math.max(rssMB, r.rssMB);
    };
    try {
      add(await node("plan", step, dest, "--groups", String(groups)));
      for (let g = 0; g < groups; g++) add(await node("convert-group", dest, "--step", "100", "--group", String(g)));
      add(await node("finalize", dest, "--step", "100"));
    } catch (e) {
      convert.failed += `; by groups: ${/(EMFILE|RangeError: [^\n]*)/.exec(String(e.message))?.[1] ?? "failed"}`;
      seconds = Number.NaN;
    }
    convert.byGroups = { groups, seconds, rssMB };
  }
  const verify =
    convert.skipped || Number.isNaN(convert.byGroups?.seconds)
      ? { failed: "no destination" }
      : await best(() => node("verify", step, regular));
  if (verify.stdout !== undefined && !/ 0 failed/.test(verify.stdout)) throw new Error(`verify failed:\n${verify.stdout.slice(-2000)}`);
  // One group of 256: what a convert-group costs in a plan of many groups.
  const g256 = join(OUT, `${arrays}_x_${chunks}-256`);
  fresh(g256)();
  await node("plan", step, g256, "--groups", "256");
  const group = await best(() => node("convert-group", g256, "--step", "100", "--group", "0"));
  const tsOut = join(OUT, `${arrays}_x_${chunks}-tensorstore`);
  const ts = JSON.parse(
    spawnSync(PYTHON, ["bench/gen_scale.py", "read", step, tsOut], { encoding: "utf8" }).stdout.trim().split("\n").pop(),
  );
  rmSync(tsOut, { recursive: true, force: true });
  rmSync(dest, { recursive: true, force: true });
  rmSync(g256, { recursive: true, force: true });
  const row = { arrays, chunks, objects: info.objects, inspect, plan, planBytes, convert, verify, group, ts };
  rows.push(row);
  say(JSON.stringify({ ...row, inspect: undefined, plan: undefined, convert: undefined, verify: undefined, group: undefined }));
  for (const k of ["inspect", "plan", "convert", "verify", "group"])
    say(`  ${k}: ${s(row[k])}${row[k].detail ? `\n${row[k].detail}` : ""}`);
}

function s(r) {
  const ok = (x) => `${x.seconds.toFixed(2)} s, ${x.rssMB.toFixed(0)} MB`;
  if (!r.failed) return ok(r);
  if (r.skipped) return "not run";
  return `**fails: ${r.failed}**${r.byGroups ? ` (as plan + ${r.byGroups.groups} convert-group + finalize: ${ok(r.byGroups)})` : ""}`;
}
say();
say(
  "| step (arrays × chunks) | inspect | plan --groups 8 | convert (local) | verify | convert-group 1 of 256 | convert per chunk | TensorStore read / read+write per chunk | convert ÷ TensorStore read+write |",
);
say("|---|---|---|---|---|---|---|---|---|");
for (const r of rows) {
  const chunks = r.arrays * r.chunks;
  const mine = ((r.convert.failed ? (r.convert.byGroups?.seconds ?? Number.NaN) : r.convert.seconds) * 1000) / chunks;
  const read = (r.ts.seconds * 1000) / r.ts.chunks;
  const copy = (r.ts.copy_seconds * 1000) / r.ts.chunks;
  say(
    `| ${r.arrays.toLocaleString("en")} × ${r.chunks} (${(r.objects / 1000).toFixed(1)}k objects) | ${s(r.inspect)} | ${s(r.plan)}, plan ${(r.planBytes / 1e6).toFixed(1)} MB | ${s(r.convert)} | ${s(r.verify)} | ${s(r.group)} | ${mine.toFixed(3)} ms | ${read.toFixed(3)} / ${copy.toFixed(3)} ms | ${(mine / copy).toFixed(2)}x |`,
  );
}

if (GCS_SHAPE !== "none" || ROOT_STEPS > 0) await gcsPart();
rmSync(OUT, { recursive: true, force: true });

async function gcsPart() {
  if (!existsSync(FAKE_GCS)) {
    say(`\n${FAKE_GCS} is missing (npm run setup builds it): no GCS figures`);
    return;
  }
  // The filesystem backend on a RAM disk: it fsyncs each object before answering (~190 objects/s on this
  // machine's disk), and the memory backend keeps a bucket's objects in a list it scans on every request
  // (~230 objects/s at a few thousand objects, slower as the bucket fills); on tmpfs the fsync is free and
  // 2 KiB uploads run at ~1,800 objects/s.
  const ramRoot = existsSync("/dev/shm") ? join("/dev/shm", `orbax2reg-bench-scale-${process.pid}`) : undefined;
  const backend = ramRoot === undefined ? "memory backend" : "filesystem backend on tmpfs";
  const { url: gcs, plainUrl, stop } = await startEmulator(ramRoot, { plain: true });
  const env = { ORBAX2REG_GCS_ENDPOINT: gcs };
  const gnode = (...argv) => run(process.execPath, [CLI, ...argv], env);
  try {
    await createBucket(gcs, "src");
    await createBucket(gcs, "dst");
    if (GCS_SHAPE !== "none") await gcsStep(gcs, plainUrl, gnode, backend);
    if (ROOT_STEPS > 0) await rootPart(gcs, gnode);
  } finally {
    stop();
  }
}

/** The GCS_SHAPE step converted gs:// -> gs:// and verified, beside TensorStore moving the same chunks. */
async function gcsStep(gcs, plainUrl, gnode, backend) {
  const [arrays, chunks] = GCS_SHAPE.split("x").map(Number);
  const gen = spawnSync(PYTHON, ["bench/gen_scale.py", String(arrays), String(chunks)], {
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  if (gen.status !== 0) throw new Error(`generating ${GCS_SHAPE} failed`);
  const info = JSON.parse(gen.stdout.trim().split("\n").pop());
  {
    const stepName = info.step_dir.split("/").pop();
    const src = `ckpt/${stepName}`;
    await each(filesUnder(info.step_dir), 8, (f) => upload(gcs, "src", `${src}/${relative(info.step_dir, f)}`, f));
    say(`\n${arrays} × ${chunks} (${info.objects} objects) through gs:// on fake-gcs-server (${backend}, loopback):`);
    const rows = { convert: [], ts: [] };
    for (let i = 0; i < RUNS; i++) {
      // Interleaved: each route's destination emptied before its run.
      await deletePrefix(gcs, "dst", "o2r/");
      rows.convert.push(await best(() => gnode("convert", `gs://src/${src}`, "gs://dst/o2r", "--json")));
      await deletePrefix(gcs, "dst", "ts/");
      const t = await run(PYTHON, ["bench/tensorstore_gcs_route.py", "src", src, "dst", `ts/${stepName}`], {
        TENSORSTORE_GCS_HTTP_URL: plainUrl,
        TENSORSTORE_GCS_HTTP_VERSION: "1.1",
        GOOGLE_AUTH_TOKEN_FOR_TESTING: "bench",
      });
      rows.ts.push(t);
    }
    const pick = (xs) => xs.reduce((a, b) => (b.failed || (!a.failed && a.seconds <= b.seconds) ? a : b));
    const convert = pick(rows.convert);
    const ts = pick(rows.ts);
    const verify = convert.failed
      ? { failed: "no destination" }
      : await best(() => gnode("verify", `gs://src/${src}`, `gs://dst/o2r/${stepName}`, "--json"));
    if (verify.stdout !== undefined && JSON.parse(verify.stdout).failed !== 0)
      throw new Error(`verify through GCS failed:\n${verify.stdout.slice(-2000)}`);
    const per = (r) => ((r.seconds * 1000) / info.objects).toFixed(3);
    say(`  convert gs:// -> gs:// (HTTPS): ${s(convert)}${convert.failed ? "" : ` (${per(convert)} ms per object)`}`);
    say(`  TensorStore read + write, gs:// -> gs:// (same chunks, raw; plain HTTP): ${s(ts)} (${per(ts)} ms per object)`);
    if (!convert.failed)
      say(
        `  convert (HTTPS) ÷ TensorStore (plain HTTP): ${(convert.seconds / ts.seconds).toFixed(2)}x wall, ${(convert.rssMB / ts.rssMB).toFixed(2)}x peak RSS`,
      );
    say(`  verify through gs:// (HTTPS): ${s(verify)}`);
  }
}

/**
 * `convert ROOT` of a root of ROOT_STEPS steps: the tiny fixture step uploaded once, then copied server-side
 * under step_%08d names (its index names step 100: the newest copy gets an index naming its own step, the
 * one that is converted), with and without the tracker file; beside the same conversion of a one-step root.
 */
async function rootPart(gcs, gnode) {
  const tiny = resolve("test/fixtures/orbax-axlearn/tiny/step_00000100");
  const files = filesUnder(tiny).map((f) => relative(tiny, f));
  const name = (n) => `step_${String(n).padStart(8, "0")}`;
  const last = ROOT_STEPS - 1;
  const indexFor = (n) => Buffer.from(readFileSync(join(tiny, "index/index"), "utf8").replace(/^\[\["step", 100\]/, `[["step", ${n}]`));
  const put = async (root, n, copyFrom) => {
    await each(files, 8, (f) =>
      f === "index/index"
        ? upload(gcs, "src", `${root}/${name(n)}/${f}`, indexFor(n))
        : copyFrom === undefined
          ? upload(gcs, "src", `${root}/${name(n)}/${f}`, join(tiny, f))
          : copyObject(gcs, "src", `${copyFrom}/${f}`, `${root}/${name(n)}/${f}`),
    );
  };
  const t0 = performance.now();
  await put("one", last);
  await put("many", 0);
  await each(
    Array.from({ length: ROOT_STEPS - 1 }, (_, i) => i + 1),
    8,
    (n) => put("many", n, `many/${name(0)}`),
  );
  say(
    `\nconvert ROOT on fake-gcs-server: a root of ${ROOT_STEPS} copies of the tiny fixture step (made in ${((performance.now() - t0) / 1000).toFixed(0)} s):`,
  );
  const tracker = Buffer.from(String(last));
  const convertRoot = async (root, label) => {
    const r = await best(() => gnode("convert", `gs://src/${root}`, `gs://dst/${root}-${label}`, "--json"));
    const j = r.failed ? {} : JSON.parse(r.stdout);
    if (!r.failed && (j.step !== last || !j.committed)) throw new Error(`convert ${root} chose step ${j.step}, not ${last}`);
    return { ...r, chosenBy: j.stepChosenBy };
  };
  await upload(gcs, "src", "one/latest_checkpointed_step.txt", tracker);
  await upload(gcs, "src", "many/latest_checkpointed_step.txt", tracker);
  const oneTracked = await convertRoot("one", "t");
  const manyTracked = await convertRoot("many", "t");
  await deleteObject(gcs, "src", "one/latest_checkpointed_step.txt");
  await deleteObject(gcs, "src", "many/latest_checkpointed_step.txt");
  const oneListed = await convertRoot("one", "l");
  const manyListed = await convertRoot("many", "l");
  const row = (label, many, one) => say(`  ${label}: ${ROOT_STEPS} steps ${s(many)} (step chosen by ${many.chosenBy}); 1 step ${s(one)}`);
  row("with latest_checkpointed_step.txt", manyTracked, oneTracked);
  row("without it (listing, commit markers checked)", manyListed, oneListed);
}
