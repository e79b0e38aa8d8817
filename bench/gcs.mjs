#!/usr/bin/env node
// GCS benchmark: the ~2 GB fuji-7B-v2-shaped step (bench/gen_fuji.py) in fake-gcs-server (filesystem backend,
// loopback), converted gs:// -> gs:// by (1) `orbax2reg convert` and (2) TensorStore's C++ GCS client doing the
// same raw chunk passthrough (bench/tensorstore_gcs_route.py), interleaved, best of 3: wall time, CPU
// (user + sys) and peak RSS of each, and the ratios. See bench/README.md.
//
//   npm run bench:gcs                 # = npm run build && node bench/gcs.mjs
//   node bench/gcs.mjs [--runs N] [--profile] [--no-verify]
//
// One emulator serves every run (the source is uploaded once); before each run the destination's objects are
// deleted. --profile adds one `node --cpu-prof` orbax2reg run and prints where its main thread's time goes.
import { spawn, spawnSync } from "node:child_process";
import { createReadStream, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, statSync } from "node:fs";
import { request } from "node:http";
import { createServer } from "node:net";
import os from "node:os";
import { join, relative, resolve } from "node:path";
import { fileURLToPath } from "node:url";

const ROOT = resolve(fileURLToPath(import.meta.url), "../..");
process.chdir(ROOT);
const PYTHON = ".venv/bin/python";
const FAKE_GCS = ".tools/bin/fake-gcs-server";
const GEN = "bench/.generated";
const FS_ROOT = resolve(GEN, "gcs-fs");
const CLI = "bin/orbax2reg.js";
const TARGETS = { wall: 1.0, cpu: 1.0, rss: 0.1 };

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

const say = (line = "") => console.log(line);
const sh = (cmd, argv, opts = {}) => spawnSync(cmd, argv, { encoding: "utf8", maxBuffer: 64 << 20, ...opts });
const fmt = (x, digits = 2) => x.toFixed(digits);
const mb = (bytes) => bytes / 1e6;
const sum = (xs) => xs.reduce((a, b) => a + b, 0);

function must(r, what) {
  if (r.status !== 0) {
    console.error(`${what} failed (exit ${r.status}):\n${(r.stderr ?? "").slice(-4000)}`);
    process.exit(1);
  }
  return r;
}

function filesUnder(dir) {
  return readdirSync(dir, { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile())
    .map((e) => join(e.parentPath, e.name))
    .sort();
}

// ---------------------------------------------------------------------------------------------------
// Timed runs (as in bench/convert.mjs): wall time here, CPU and peak RSS from GNU time -v (children included),
// or peak RSS from polling VmHWM of the process tree without it.

const GNU_TIME = existsSync("/usr/bin/time") && sh("/usr/bin/time", ["-v", "true"]).status === 0;

function vmHwmKiB(pid) {
  try {
    return Number((readFileSync(`/proc/${pid}/status`, "utf8").match(/^VmHWM:\s*(\d+)/m) ?? [])[1] ?? 0);
  } catch {
    return 0;
  }
}

function descendants(pid) {
  const out = [pid];
  for (let i = 0; i < out.length; i++) {
    try {
      for (const tid of readdirSync(`/proc/${out[i]}/task`)) {
        const kids = readFileSync(`/proc/${out[i]}/task/${tid}/children`, "utf8").trim();
        if (kids) out.push(...kids.split(" ").map(Number));
      }
    } catch {}
  }
  return out;
}

function timed(cmd, argv, env) {
  const timeFile = resolve(GEN, ".gcs-time");
  const [c, a] = GNU_TIME ? ["/usr/bin/time", ["-v", "-o", timeFile, cmd, ...argv]] : [cmd, argv];
  return new Promise((done, fail) => {
    const t0 = performance.now();
    const child = spawn(c, a, { stdio: ["ignore", "pipe", "pipe"], env: { ...process.env, ...env } });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d) => {
      stdout += d;
    });
    child.stderr.on("data", (d) => {
      stderr += d;
    });
    let polled = 0;
    const poll = GNU_TIME
      ? undefined
      : setInterval(() => {
          for (const pid of descendants(child.pid)) polled = Math.max(polled, vmHwmKiB(pid));
        }, 20);
    child.on("error", fail);
    child.on("close", (status) => {
      const seconds = (performance.now() - t0) / 1000;
      if (poll) clearInterval(poll);
      let rssKiB = polled;
      let cpu = Number.NaN;
      if (GNU_TIME) {
        const t = readFileSync(timeFile, "utf8");
        rssKiB = Number((t.match(/Maximum resident set size \(kbytes\): (\d+)/) ?? [])[1] ?? Number.NaN);
        cpu = ["User", "System"].reduce(
          (acc, k) => acc + Number((t.match(new RegExp(`${k} time \\(seconds\\): ([\\d.]+)`)) ?? [])[1] ?? Number.NaN),
          0,
        );
        rmSync(timeFile, { force: true });
      }
      done({ seconds, rssKiB, cpu, stdout, stderr, status });
    });
  });
}

/** Fraction of all CPUs busy over `ms` (from /proc/stat), sampled while the benchmark itself is idle. */
function cpuBusy(ms = 500) {
  const read = () => {
    const f = readFileSync("/proc/stat", "utf8").split("\n")[0].trim().split(/\s+/).slice(1).map(Number);
    return { idle: (f[3] ?? 0) + (f[4] ?? 0), total: sum(f.slice(0, 8)) };
  };
  const a = read();
  Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, ms);
  const b = read();
  return b.total === a.total ? 0 : 1 - (b.idle - a.idle) / (b.total - a.total);
}
const BUSY_WARN = 0.2;

// ---------------------------------------------------------------------------------------------------
// The emulator: fake-gcs-server on loopback with its filesystem backend, spoken to through its JSON API.

async function freePort() {
  return new Promise((done, fail) => {
    const srv = createServer();
    srv.listen(0, "127.0.0.1", () => {
      const { port } = srv.address();
      srv.close(() => done(port));
    });
    srv.on("error", fail);
  });
}

async function startEmulator() {
  rmSync(FS_ROOT, { recursive: true, force: true });
  mkdirSync(FS_ROOT, { recursive: true });
  const port = await freePort();
  const child = spawn(
    FAKE_GCS,
    [
      "-scheme",
      "http",
      "-host",
      "127.0.0.1",
      "-port",
      String(port),
      "-backend",
      "filesystem",
      "-filesystem-root",
      FS_ROOT,
      "-log-level",
      "error",
    ],
    { stdio: ["ignore", "ignore", "inherit"] },
  );
  const url = `http://127.0.0.1:${port}`;
  for (let i = 0; i < 300; i++) {
    try {
      if ((await fetch(`${url}/storage/v1/b`)).ok) return { url, child };
    } catch {}
    await new Promise((r) => setTimeout(r, 100));
  }
  child.kill("SIGKILL");
  throw new Error("fake-gcs-server did not answer within 30 s");
}

async function api(url, init = {}) {
  const r = await fetch(url, init);
  if (!r.ok && r.status !== 404) throw new Error(`${init.method ?? "GET"} ${url}: HTTP ${r.status} ${await r.text()}`);
  return r.status === 204 || r.status === 404 ? undefined : r.json();
}

const createBucket = (gcs, name) =>
  api(`${gcs}/storage/v1/b?project=bench`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ name }),
  });

/** Streams a file into an object (uploadType=media, so the benchmark itself holds no object in memory). */
function uploadFile(gcs, bucket, name, file) {
  return new Promise((done, fail) => {
    const u = new URL(`${gcs}/upload/storage/v1/b/${bucket}/o?uploadType=media&name=${encodeURIComponent(name)}`);
    const req = request(
      {
        host: u.hostname,
        port: u.port,
        method: "POST",
        path: `${u.pathname}${u.search}`,
        headers: { "content-type": "application/octet-stream", "content-length": statSync(file).size },
      },
      (res) => {
        res.resume();
        res.on("end", () => (res.statusCode === 200 ? done() : fail(new Error(`upload of ${name}: HTTP ${res.statusCode}`))));
      },
    );
    req.on("error", fail);
    createReadStream(file).pipe(req);
  });
}

async function listObjects(gcs, bucket, prefix) {
  const out = [];
  let pageToken;
  do {
    const q = new URLSearchParams({ prefix, maxResults: "1000", ...(pageToken ? { pageToken } : {}) });
    const page = await api(`${gcs}/storage/v1/b/${bucket}/o?${q}`);
    out.push(...(page?.items ?? []));
    pageToken = page?.nextPageToken;
  } while (pageToken);
  return out;
}

async function deletePrefix(gcs, bucket, prefix) {
  const objects = await listObjects(gcs, bucket, prefix);
  for (let i = 0; i < objects.length; i += 16) {
    await Promise.all(
      objects.slice(i, i + 16).map((o) => api(`${gcs}/storage/v1/b/${bucket}/o/${encodeURIComponent(o.name)}`, { method: "DELETE" })),
    );
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

say("Source: generating or reusing bench/.generated/fuji-mini (bench/gen_fuji.py) ...");
const gen = must(sh(PYTHON, ["bench/gen_fuji.py"], { stdio: ["ignore", "pipe", "inherit"] }), "bench/gen_fuji.py");
const info = JSON.parse(gen.stdout.trim().split("\n").pop());
const STEP = resolve(info.step_dir);
const STEP_NAME = STEP.split("/").pop();
const sourceFiles = filesUnder(STEP);
const SOURCE_BYTES = sum(sourceFiles.map((f) => statSync(f).size));
const largest = Math.max(...sourceFiles.map((f) => statSync(f).size));
say(
  `  ${info.step_dir}: ${info.arrays} arrays, ${sourceFiles.length} files, ${SOURCE_BYTES.toLocaleString("en-US")} B (largest object ${fmt(mb(largest), 0)} MB)`,
);

const { url: GCS, child: emulator } = await startEmulator();
const stopEmulator = () => emulator.exitCode === null && emulator.kill("SIGTERM");
process.on("exit", stopEmulator);
const SRC = `ckpt/${STEP_NAME}`;
await createBucket(GCS, "src");
await createBucket(GCS, "dst");
{
  const t0 = performance.now();
  for (const f of sourceFiles) await uploadFile(GCS, "src", `${SRC}/${relative(STEP, f)}`, f);
  say(
    `  uploaded to gs://src/${SRC} on fake-gcs-server (filesystem backend under ${relative(ROOT, FS_ROOT)}) in ${fmt((performance.now() - t0) / 1000, 1)} s`,
  );
}
say();

const TS_ENV = { TENSORSTORE_GCS_HTTP_URL: GCS, TENSORSTORE_GCS_HTTP_VERSION: "1.1", GOOGLE_AUTH_TOKEN_FOR_TESTING: "bench" };
const ROUTES = {
  orbax2reg: {
    label: "`orbax2reg convert` gs:// -> gs://",
    dest: "o2r",
    cmd: [process.execPath, [CLI, "convert", `gs://src/${SRC}`, "gs://dst/o2r", "--json"], { ORBAX2REG_GCS_ENDPOINT: GCS }],
  },
  tensorstore: {
    label: "TensorStore C++ GCS client, raw chunk passthrough",
    dest: "ts",
    cmd: [PYTHON, ["bench/tensorstore_gcs_route.py", "src", SRC, "dst", `ts/${STEP_NAME}`], TS_ENV],
  },
};
const results = { orbax2reg: [], tensorstore: [] };
say(`Runs (interleaved, best of ${RUNS}; the destination's objects deleted before each run):`);
for (let round = 1; round <= RUNS; round++) {
  for (const [name, route] of Object.entries(ROUTES)) {
    await deletePrefix(GCS, "dst", `${route.dest}/`);
    const background = cpuBusy();
    const r = must(await timed(...route.cmd), name);
    r.background = background;
    results[name].push(r);
    const inside =
      name === "orbax2reg"
        ? `${JSON.parse(r.stdout).written} objects written`
        : `${JSON.parse(r.stdout.trim().split("\n").pop()).keys} keys copied`;
    say(
      `  ${round}. ${name.padEnd(11)} ${fmt(r.seconds).padStart(7)} s  ${fmt(mb(SOURCE_BYTES) / r.seconds, 0).padStart(4)} MB/s  CPU ${fmt(r.cpu).padStart(6)} s  ` +
        `peak RSS ${fmt(r.rssKiB / 1024, 0).padStart(5)} MiB  (others ${fmt(100 * background, 0)} % CPU before); ${inside}`,
    );
  }
}
say();

// The two outputs carry the same chunk bytes (CRC-32C of every gda/ chunk object); orbax2reg's also verifies.
{
  const chunks = async (prefix) =>
    new Map(
      (await listObjects(GCS, "dst", prefix))
        .filter((o) => o.name.includes("/gda/") && !o.name.endsWith("/.zarray"))
        .map((o) => [o.name.slice(o.name.indexOf("/gda/")), o.crc32c]),
    );
  const [a, b] = [await chunks(`o2r/${STEP_NAME}/`), await chunks(`ts/${STEP_NAME}/`)];
  const same = a.size === b.size && [...a].every(([k, v]) => b.get(k) === v);
  say(`Same chunks: ${same ? "yes" : "NO"} (${a.size} chunk objects from orbax2reg, ${b.size} from TensorStore, compared by CRC-32C)`);
  if (!same) process.exitCode = 1;
  if (!flag("--no-verify")) {
    const t0 = performance.now();
    const v = sh(process.execPath, [CLI, "verify", `gs://src/${SRC}`, `gs://dst/o2r/${STEP_NAME}`, "--json"], {
      env: { ...process.env, ORBAX2REG_GCS_ENDPOINT: GCS },
    });
    const j = v.status === 0 || v.status === 1 ? JSON.parse(v.stdout) : { passed: 0, failed: 1 };
    say(`verify of orbax2reg's output, through GCS: ${j.passed} passed, ${j.failed} failed (${fmt((performance.now() - t0) / 1000, 1)} s)`);
    if (j.failed !== 0 || v.status !== 0) process.exitCode = 1;
  }
}
say();

const best = (name) => results[name].reduce((a, b) => (b.seconds < a.seconds ? b : a));
const peak = (name) => Math.max(...results[name].map((r) => r.rssKiB)) / 1024;
const [O, T] = [best("orbax2reg"), best("tensorstore")];
const ratios = { wall: O.seconds / T.seconds, cpu: O.cpu / T.cpu, rss: peak("orbax2reg") / peak("tensorstore") };
const bestDisturbed = Object.keys(results).filter((n) => best(n).background > BUSY_WARN);
if (bestDisturbed.length > 0)
  say(`WARNING: the best run of ${bestDisturbed.join(", ")} started while other processes kept the CPUs busy; rerun on an idle machine.`);
say("## Results (markdown for bench/README.md)");
say();
say(
  `Source: the ${info.arrays}-array fuji-7B-v2-shaped step of bench/gen_fuji.py, ${fmt(mb(SOURCE_BYTES), 0)} MB in ${sourceFiles.length} objects (largest ${fmt(mb(largest), 0)} MB), ` +
    `in fake-gcs-server ${fakeGcsVersion} (filesystem backend) on loopback; ${os.cpus().length} CPUs. Best of ${RUNS}, interleaved; MB/s = source bytes / wall time.`,
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
  `| peak RSS (max of ${RUNS} runs) | ${fmt(ratios.rss)}x | <= ${fmt(TARGETS.rss, 1)}x | ${ratios.rss <= TARGETS.rss ? "met" : "**missed**"} |`,
);
say();

if (flag("--profile")) {
  const dir = resolve(GEN, "gcs-profile");
  rmSync(dir, { recursive: true, force: true });
  await deletePrefix(GCS, "dst", "o2r/");
  const t0 = performance.now();
  must(
    sh(process.execPath, ["--cpu-prof", `--cpu-prof-dir=${dir}`, CLI, "convert", `gs://src/${SRC}`, "gs://dst/o2r"], {
      env: { ...process.env, ORBAX2REG_GCS_ENDPOINT: GCS },
    }),
    "profiled convert",
  );
  const wall = (performance.now() - t0) / 1000;
  const file = readdirSync(dir).find((n) => n.endsWith(".cpuprofile"));
  const keep = resolve(GEN, "gcs.cpuprofile");
  rmSync(keep, { force: true });
  sh("cp", [join(dir, file), keep]);
  rmSync(dir, { recursive: true, force: true });
  say(`## Profile of one \`orbax2reg convert\` gs:// -> gs:// (node --cpu-prof, ${fmt(wall)} s wall; saved to ${relative(ROOT, keep)})`);
  say();
  for (const l of profileSummary(JSON.parse(readFileSync(keep, "utf8")))) say(l);
  say();
}

await deletePrefix(GCS, "dst", "");
stopEmulator();
rmSync(FS_ROOT, { recursive: true, force: true });

/** Main-thread self time by function and by category (what the GCS path spends its CPU on). */
function profileSummary(p) {
  const byId = new Map(p.nodes.map((n) => [n.id, n]));
  const self = new Map();
  let total = 0;
  const where = (cf) => {
    const url = cf.url.replace(/^.*\/(dist\/src\/|node_modules\/)/, "$1").replace(/^file:\/\//, "");
    return `${cf.functionName || "(anonymous)"}${url ? ` ${url}:${cf.lineNumber + 1}` : ""}`;
  };
  for (let i = 0; i < p.samples.length; i++) {
    const us = p.timeDeltas[i] ?? 0;
    total += us;
    const key = where(byId.get(p.samples[i]).callFrame);
    self.set(key, (self.get(key) ?? 0) + us);
  }
  const ms = (us) => `${fmt(us / 1000, 0).padStart(6)} ms ${fmt((100 * us) / total, 1).padStart(5)} %`;
  const byCategory = new Map();
  for (const [k, us] of self) byCategory.set(category(k), (byCategory.get(category(k)) ?? 0) + us);
  const out = [`main thread sampled ${fmt(total / 1e6)} s; self time by category:`];
  for (const [k, us] of [...byCategory].sort((a, b) => b[1] - a[1])) out.push(`  ${ms(us)}  ${k}`);
  out.push("", "top self time:");
  for (const [k, us] of [...self].sort((a, b) => b[1] - a[1]).slice(0, 20)) out.push(`  ${ms(us)}  ${k}`);
  return out;
}

/** What a profiled frame is spending time on, for the summary. */
function category(frame) {
  if (frame.startsWith("(idle)")) return "idle (waiting for the network or the emulator)";
  if (frame.startsWith("(garbage collector)")) return "garbage collection";
  if (/^crc32c /.test(frame)) return "CRC-32C";
  if (/^(FastBuffer|cloneAsUint8Array|transferArrayBuffer|concat|copy|from|fromArrayLike|allocate) /.test(frame))
    return "buffer copies and allocations";
  if (/^(writev|writeBuffer|writeGeneric|onStreamRead|readStop|readStart)\b/.test(frame)) return "socket reads and writes (syscalls)";
  if (/undici|webstreams/.test(frame)) return "fetch and web streams (undici): HTTP framing, stream plumbing";
  if (/dist\/src\//.test(frame)) return "orbax2reg's own code";
  return "other (microtasks, timers, events, the runtime)";
}
