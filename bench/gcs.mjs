#!/usr/bin/env node
// GCS benchmark: the ~2 GB fuji-7B-v2-shaped step (bench/gen_fuji.py) in fake-gcs-server (filesystem backend,
// loopback), converted gs:// -> gs:// by (1) `orbax2reg convert` and (2) TensorStore's C++ GCS client doing the
// same raw chunk passthrough (bench/tensorstore_gcs_route.py), both over plain HTTP, and (3) the same orbax2reg
// conversion over HTTPS, as every real request to GCS goes; interleaved, best of 3: wall time, CPU (user + sys)
// and peak RSS of each, the ratios to TensorStore over plain HTTP, and HTTPS / plain HTTP. TensorStore has no
// fair TLS run against fake-gcs-server here (issue 25: 68 s over HTTP/2, stalls over HTTP/1.1, against 1 s over
// plain HTTP), so TLS is measured against orbax2reg's own plain-HTTP run. One emulator serves both schemes over
// the same objects (bench/fake-gcs.mjs). See bench/README.md.
//
//   npm run bench:gcs                 # = npm run build && node bench/gcs.mjs
//   node bench/gcs.mjs [--runs N] [--profile] [--no-verify]
//
// One emulator serves every run (the source is uploaded once); before each run the destination's objects are
// deleted. --profile adds one `node --cpu-prof` orbax2reg run over each transport and prints where its main thread's time goes.
import { existsSync, readFileSync, statSync } from "node:fs";
import os from "node:os";
import { relative, resolve } from "node:path";
import { createBucket, deletePrefix, FAKE_GCS, listObjects, runTrustingTestCa, startEmulator, upload } from "./fake-gcs.mjs";
import { BUSY_WARN, cpuBusy, cpuProfile, fmt, fujiStep, mb, must, profileSummary, ROOT, say, sh, timed } from "./lib.mjs";

// The emulator serves HTTPS with the tests' CA: this process and the CLI it runs trust it (NODE_EXTRA_CA_CERTS).
await runTrustingTestCa();
process.chdir(ROOT);
const PYTHON = ".venv/bin/python";
const GEN = "bench/.generated";
const FS_ROOT = resolve(GEN, "gcs-fs");
/** Run as a command, as users run it: its launcher sets the runtime (bin/orbax2reg.js). */
const CLI = "bin/orbax2reg.js";
/** orbax2reg over plain HTTP / TensorStore over plain HTTP, and orbax2reg over HTTPS / over plain HTTP (issue 25). */
const TARGETS = { wall: 1.0, cpu: 1.0, rss: 0.25 };
const TLS_TARGETS = { wall: 1.5 };

const args = process.argv.slice(2);
const flag = (name) => args.includes(name);
const runsArg = args.indexOf("--runs");
const RUNS = runsArg >= 0 ? Number(args[runsArg + 1]) : 3;
if (!Number.isInteger(RUNS) || RUNS < 1) {
  console.error("--runs takes a positive integer");
  process.exit(2);
}
for (const [path, fix] of [
  ["dist/src/cli/main.js", "build first with `npx tsc -p tsconfig.build.json` (or use `npm run bench:gcs`)"],
  [PYTHON, "run `npm run setup` (the generator and TensorStore come from .venv)"],
  [FAKE_GCS, "run `npm run setup` (it builds fake-gcs-server into .tools/bin)"],
]) {
  if (!existsSync(path)) {
    console.error(`${path} is missing: ${fix}`);
    process.exit(1);
  }
}

// ---------------------------------------------------------------------------------------------------

say("# orbax2reg GCS benchmark (gs:// -> gs:// on fake-gcs-server)");
say();
const py = sh(PYTHON, ["-c", "import sys, importlib.metadata as m; print(sys.version.split()[0], m.version('tensorstore'))"]).stdout.trim();
const [pyVersion, tsVersion] = py.split(" ");
const fakeGcsVersion = (readFileSync("scripts/install.sh", "utf8").match(/fake-gcs-server@(v[\d.]+)/) ?? [])[1] ?? "?";
const cpuModel = (readFileSync("/proc/cpuinfo", "utf8").match(/^model name\s*:\s*(.*)$/m) ?? [])[1] ?? "?";
say(
  `Machine: ${os.cpus().length} CPUs (${cpuModel}), ${fmt(os.totalmem() / 2 ** 30, 1)} GiB; node ${process.version}; Python ${pyVersion}, tensorstore ${tsVersion}; fake-gcs-server ${fakeGcsVersion}`,
);
const busyBefore = cpuBusy(1000);
say(
  `  ${fmt(100 * busyBefore, 0)} % of the CPUs busy with other work before the benchmark${busyBefore > BUSY_WARN ? " (WARNING: not idle)" : ""}`,
);
say();

const { info, dir: STEP, name: STEP_NAME, files: sourceFiles, bytes: SOURCE_BYTES } = fujiStep(PYTHON);
const largest = Math.max(...sourceFiles.map((f) => statSync(f).size));
say(
  `  ${info.step_dir}: ${info.arrays} arrays, ${sourceFiles.length} files, ${SOURCE_BYTES.toLocaleString("en-US")} B (largest object ${fmt(mb(largest), 0)} MB)`,
);

// Stopped, and its folder removed, on exit, SIGINT and SIGTERM (bench/fake-gcs.mjs).
const { url: GCS, plainUrl: PLAIN, stop: stopEmulator } = await startEmulator(FS_ROOT, { plain: true });
const SRC = `ckpt/${STEP_NAME}`;
await createBucket(GCS, "src");
await createBucket(GCS, "dst");
{
  const t0 = performance.now();
  for (const f of sourceFiles) await upload(GCS, "src", `${SRC}/${relative(STEP, f)}`, f);
  say(
    `  uploaded to gs://src/${SRC} on fake-gcs-server (filesystem backend under ${relative(ROOT, FS_ROOT)}) in ${fmt((performance.now() - t0) / 1000, 1)} s`,
  );
}
say();

const TS_ENV = { TENSORSTORE_GCS_HTTP_URL: PLAIN, TENSORSTORE_GCS_HTTP_VERSION: "1.1", GOOGLE_AUTH_TOKEN_FOR_TESTING: "bench" };
const ROUTES = {
  orbax2reg: {
    label: "`orbax2reg convert` gs:// -> gs://, plain HTTP",
    dest: "o2r",
    cmd: [CLI, ["convert", `gs://src/${SRC}`, "gs://dst/o2r", "--json"], { ORBAX2REG_GCS_ENDPOINT: PLAIN }],
  },
  tensorstore: {
    label: "TensorStore C++ GCS client, raw chunk passthrough, plain HTTP",
    dest: "ts",
    cmd: [PYTHON, ["bench/tensorstore_gcs_route.py", "src", SRC, "dst", `ts/${STEP_NAME}`], TS_ENV],
  },
  https: {
    label: "`orbax2reg convert` gs:// -> gs://, HTTPS",
    dest: "tls",
    cmd: [CLI, ["convert", `gs://src/${SRC}`, "gs://dst/tls", "--json"], { ORBAX2REG_GCS_ENDPOINT: GCS }],
  },
};
const results = { orbax2reg: [], tensorstore: [], https: [] };
say(`Runs (interleaved, best of ${RUNS}; the destination's objects deleted before each run):`);
for (let round = 1; round <= RUNS; round++) {
  for (const [name, route] of Object.entries(ROUTES)) {
    await deletePrefix(GCS, "dst", `${route.dest}/`);
    const background = cpuBusy();
    const r = must(await timed(...route.cmd), name);
    r.background = background;
    results[name].push(r);
    const inside =
      name === "tensorstore"
        ? `${JSON.parse(r.stdout.trim().split("\n").pop()).keys} keys copied`
        : `${JSON.parse(r.stdout).written} objects written`;
    say(
      `  ${round}. ${name.padEnd(11)} ${fmt(r.seconds).padStart(7)} s  ${fmt(mb(SOURCE_BYTES) / r.seconds, 0).padStart(4)} MB/s  CPU ${fmt(r.cpu).padStart(6)} s  ` +
        `peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(5)} MiB  (others ${fmt(100 * background, 0)} % CPU before); ${inside}`,
    );
  }
}
say();

// The three outputs carry the same chunk bytes (CRC-32C of every gda/ chunk object); orbax2reg's also verify.
{
  const chunks = async (prefix) =>
    new Map(
      (await listObjects(GCS, "dst", prefix))
        .filter((o) => o.name.includes("/gda/") && !o.name.endsWith("/.zarray"))
        .map((o) => [o.name.slice(o.name.indexOf("/gda/")), o.crc32c]),
    );
  const [a, b, c] = [await chunks(`o2r/${STEP_NAME}/`), await chunks(`ts/${STEP_NAME}/`), await chunks(`tls/${STEP_NAME}/`)];
  const equal = (x, y) => x.size === y.size && [...x].every(([k, v]) => y.get(k) === v);
  const same = equal(a, b) && equal(a, c);
  say(
    `Same chunks: ${same ? "yes" : "NO"} (${a.size} chunk objects from orbax2reg over plain HTTP, ${c.size} over HTTPS, ${b.size} from TensorStore, compared by CRC-32C)`,
  );
  if (!same) process.exitCode = 1;
  if (!flag("--no-verify")) {
    for (const [dest, scheme] of [
      ["o2r", "plain HTTP"],
      ["tls", "HTTPS"],
    ]) {
      const t0 = performance.now();
      const v = sh(process.execPath, [CLI, "verify", `gs://src/${SRC}`, `gs://dst/${dest}/${STEP_NAME}`, "--json"], {
        env: { ...process.env, ORBAX2REG_GCS_ENDPOINT: GCS },
      });
      const j = v.status === 0 || v.status === 4 ? JSON.parse(v.stdout) : { passed: 0, failed: 1 };
      say(
        `verify of orbax2reg's output over ${scheme}, read through GCS over HTTPS: ${j.passed} passed, ${j.failed} failed (${fmt((performance.now() - t0) / 1000, 1)} s)`,
      );
      if (j.failed !== 0 || v.status !== 0) process.exitCode = 1;
    }
  }
}
say();

const best = (name) => results[name].reduce((a, b) => (b.seconds < a.seconds ? b : a));
const peak = (name) => Math.max(...results[name].map((r) => r.rssKiB)) / 1024;
const [O, T, S] = [best("orbax2reg"), best("tensorstore"), best("https")];
const ratios = { wall: O.seconds / T.seconds, cpu: O.cpu / T.cpu, rss: peak("orbax2reg") / peak("tensorstore") };
const tls = { wall: S.seconds / O.seconds, cpu: S.cpu / O.cpu, rss: peak("https") / peak("orbax2reg") };
const bestDisturbed = Object.keys(results).filter((n) => best(n).background > BUSY_WARN);
if (bestDisturbed.length > 0)
  say(`WARNING: the best run of ${bestDisturbed.join(", ")} started while other processes kept the CPUs busy; rerun on an idle machine.`);
say("## Results (markdown for bench/README.md)");
say();
say(
  `Source: the ${info.arrays}-array fuji-7B-v2-shaped step of bench/gen_fuji.py, ${fmt(mb(SOURCE_BYTES), 0)} MB in ${sourceFiles.length} objects (largest ${fmt(mb(largest), 0)} MB), ` +
    `in fake-gcs-server ${fakeGcsVersion} (filesystem backend, plain HTTP and HTTPS over the same objects) on loopback; ${os.cpus().length} CPUs. ` +
    `Best of ${RUNS}, interleaved; MB/s = source bytes / wall time.`,
);
say();
say("| route | best wall time | all runs (s) | MB/s | CPU (user+sys) | peak RSS |");
say("|---|---:|---|---:|---:|---:|");
for (const [name, route] of Object.entries(ROUTES)) {
  const b = best(name);
  say(
    `| ${route.label} | ${fmt(b.seconds)} s | ${results[name].map((r) => fmt(r.seconds)).join(", ")} | ${fmt(mb(SOURCE_BYTES) / b.seconds, 0)} | ${fmt(b.cpu)} s | ${fmt(peak(name), 0)} MiB |`,
  );
}
say();
say("| orbax2reg / TensorStore | measured | target | |");
say("|---|---:|---:|---|");
say(
  `| wall time (best runs) | ${fmt(ratios.wall)}x | <= ${fmt(TARGETS.wall, 1)}x | ${ratios.wall <= TARGETS.wall ? "met" : "**missed**"} |`,
);
say(
  `| CPU, user + sys (best runs) | ${fmt(ratios.cpu)}x | <= ${fmt(TARGETS.cpu, 1)}x | ${ratios.cpu <= TARGETS.cpu ? "met" : "**missed**"} |`,
);
say(
  `| peak RSS (max of ${RUNS} runs) | ${fmt(ratios.rss)}x | <= ${fmt(TARGETS.rss, 2)}x | ${ratios.rss <= TARGETS.rss ? "met" : "**missed**"} |`,
);
say();
say("| orbax2reg over HTTPS / over plain HTTP | measured | target | |");
say("|---|---:|---:|---|");
say(
  `| wall time (best runs) | ${fmt(tls.wall)}x | <= ${fmt(TLS_TARGETS.wall, 1)}x | ${tls.wall <= TLS_TARGETS.wall ? "met" : "**missed**"} |`,
);
say(`| CPU, user + sys (best runs) | ${fmt(tls.cpu)}x | (printed) | |`);
say(`| peak RSS (max of ${RUNS} runs) | ${fmt(tls.rss)}x | (printed) | |`);
say();

if (flag("--profile")) {
  // Both transports: plain HTTP is the one held to TensorStore's CPU, HTTPS the one GCS serves.
  for (const [name, endpoint, prefix] of [
    ["plain HTTP", PLAIN, "o2r"],
    ["HTTPS", GCS, "tls"],
  ]) {
    await deletePrefix(GCS, "dst", `${prefix}/`);
    const keep = resolve(GEN, `gcs-${prefix}.cpuprofile`);
    const { profile, wall } = cpuProfile([CLI, "convert", `gs://src/${SRC}`, `gs://dst/${prefix}`], keep, {
      ORBAX2REG_GCS_ENDPOINT: endpoint,
    });
    say(
      `## Profile of one \`orbax2reg convert\` gs:// -> gs:// over ${name} (node --cpu-prof, ${fmt(wall)} s wall; saved to ${relative(ROOT, keep)})`,
    );
    say();
    for (const l of profileSummary(profile, { top: 20 })) say(l);
    say();
  }
}

await deletePrefix(GCS, "dst", "");
stopEmulator(); // its folder is removed on exit (bench/fake-gcs.mjs)
