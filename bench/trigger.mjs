// How many events one instance of the trigger function dismisses per second: the real functions-framework serving
// the real handler (dist/functions/index.js), sent google.cloud.storage.object.v1.finalized CloudEvents in binary mode
// (as Eventarc delivers them) for objects that are no commit marker: the chunks, .zarray files and index a conversion
// writes into the watched bucket, the files a training job writes. Each is dismissed by classify()'s name test, with
// no I/O: what it costs is the HTTP request, express, the framework's CloudEvent parsing and the name test.
//
//   npm run build && node bench/trigger.mjs [--seconds 5] [--concurrency 1,8,80,250,1000]
//
// Per concurrency level (requests in flight, as max_instance_request_concurrency allows an instance), it prints the
// events/s the function answered and the CPU it used for them (user + system of its process, from /proc), so that
// the figure for one instance with one whole vCPU does not depend on how fast this machine's load generator is:
// events per CPU-second = events / CPU seconds the function process used. Every answer must be 204 (acknowledged).
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import http from "node:http";
import { createServer } from "node:net";
import { BUSY_WARN, cpuBusy, flag, flags, fmt, ROOT, requireBuilt, say } from "./lib.mjs";

const { seconds: SECONDS, concurrency: LEVELS } = flags(process.argv.slice(2), {
  "--seconds": flag.number(5, { metavar: "N" }),
  "--concurrency": flag.counts("1,8,80,250,1000"),
});
requireBuilt({ file: "dist/functions/index.js" });
process.chdir(ROOT);
const CLK_TCK = 100; // getconf CLK_TCK on Linux

const freePort = () =>
  new Promise((resolve) => {
    const s = createServer().listen(0, "127.0.0.1", () => {
      const { port } = s.address();
      s.close(() => resolve(port));
    });
  });

/** user + system CPU seconds of a process so far. */
function cpuSeconds(pid) {
  const fields = readFileSync(`/proc/${pid}/stat`, "utf8")
    .replace(/^.*\) /, "")
    .split(" ");
  return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
}

const port = await freePort();
const fn = spawn(
  process.execPath,
  [
    "node_modules/@google-cloud/functions-framework/build/src/main.js",
    "--target=onCheckpointFinalized",
    "--signature-type=cloudevent",
    `--port=${port}`,
    "--host=127.0.0.1",
    "--source=dist/functions/index.js",
  ],
  {
    // The deployed configuration's shape (function.tf); nothing is reached for a dismissed event.
    env: {
      ...process.env,
      ORBAX2REG_WORKFLOW: "projects/bench/locations/us-central1/workflows/orbax2reg-convert",
      ORBAX2REG_ROOT_PREFIXES: "",
      ORBAX2REG_DESTINATION_TEMPLATE: "gs://{bucket}/{root}/regular",
      ORBAX2REG_GROUPS: "8",
      ORBAX2REG_CLAIM_LEASE_SECONDS: "120",
      NODE_ENV: "production",
    },
    stdio: ["ignore", "pipe", "inherit"],
  },
);
let fnOut = "";
fn.stdout.on("data", (d) => {
  fnOut += d;
});
const stop = () => fn.kill("SIGTERM");
process.on("exit", stop);
for (const s of ["SIGINT", "SIGTERM"])
  process.on(s, () => {
    stop();
    process.exit(130);
  });

const agent = new http.Agent({ keepAlive: true, maxSockets: Math.max(...LEVELS) });
let seq = 0;
/** One finalize event for a chunk the conversion writes; resolves to the HTTP status. */
function deliver() {
  const n = seq++;
  const name = `runs/exp/regular/step_00000100/gda/learner/optimizer/1/0/mu/decoder/layer${n % 32}/w/${n}.0`;
  const body = JSON.stringify({
    kind: "storage#object",
    bucket: "ckpts",
    name,
    generation: String(1_700_000_000_000_000 + n),
    size: "4194304",
    contentType: "application/octet-stream",
  });
  return new Promise((resolve, reject) => {
    const req = http.request(
      {
        host: "127.0.0.1",
        port,
        method: "POST",
        path: "/",
        agent,
        headers: {
          "content-type": "application/json",
          "content-length": Buffer.byteLength(body),
          "ce-specversion": "1.0",
          "ce-id": String(n),
          "ce-type": "google.cloud.storage.object.v1.finalized",
          "ce-source": "//storage.googleapis.com/projects/_/buckets/ckpts",
          "ce-subject": `objects/${name}`,
          "ce-time": new Date().toISOString(),
        },
      },
      (res) => {
        res.resume();
        res.on("end", () => resolve(res.statusCode));
      },
    );
    req.on("error", reject);
    req.end(body);
  });
}

// Up when it answers.
for (let i = 0; ; i++) {
  try {
    await deliver();
    break;
  } catch (e) {
    if (i > 100) throw e;
    await new Promise((r) => setTimeout(r, 100));
  }
}

/** `concurrency` requests in flight for `seconds`: events answered, statuses, wall and function CPU seconds. */
async function run(concurrency, seconds) {
  const until = Date.now() + seconds * 1000;
  const statuses = new Map();
  let events = 0;
  const cpu0 = cpuSeconds(fn.pid);
  const t0 = process.hrtime.bigint();
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      while (Date.now() < until) {
        const status = await deliver();
        statuses.set(status, (statuses.get(status) ?? 0) + 1);
        events++;
      }
    }),
  );
  const wall = Number(process.hrtime.bigint() - t0) / 1e9;
  return { events, wall, cpu: cpuSeconds(fn.pid) - cpu0, statuses };
}

const busy = cpuBusy();
say(`trigger function, dismissing events for objects that are no commit marker (${SECONDS} s per level, ${fn.pid} is the function)`);
if (busy > BUSY_WARN) say(`WARNING: ${fmt(busy * 100, 0)} % of the CPUs were busy with other work before the run: figures are low`);
await run(8, 1); // warm-up: JIT, sockets
say("");
say("| concurrency | events | events/s (wall) | function CPU s | events per CPU-second | CPU µs per event | answers |");
say("|---:|---:|---:|---:|---:|---:|---|");
let failed = false;
const rows = [];
for (const c of LEVELS) {
  const r = await run(c, SECONDS);
  const perCpu = r.events / r.cpu;
  const answers = [...r.statuses].map(([s, n]) => `${n}× ${s}`).join(", ");
  if ([...r.statuses.keys()].some((s) => s !== 204)) failed = true;
  rows.push({ concurrency: c, eventsPerSecond: r.events / r.wall, eventsPerCpuSecond: perCpu });
  say(
    `| ${c} | ${r.events} | ${fmt(r.events / r.wall, 0)} | ${fmt(r.cpu, 2)} | ${fmt(perCpu, 0)} | ${fmt(1e6 / perCpu, 0)} | ${answers} |`,
  );
}
const best = Math.max(...rows.map((r) => r.eventsPerCpuSecond));
say("");
say(`one instance with one whole vCPU dismisses about ${fmt(best, 0)} events/s (best events per CPU-second above)`);
const lines = fnOut.split("\n").filter((l) => l.startsWith("{"));
if (lines.length > 0) say(`the function wrote ${lines.length} log lines (a dismissed event should write none)`);
say(JSON.stringify({ benchmark: "trigger", rows, bestEventsPerCpuSecond: best, logLines: lines.length }));
stop();
agent.destroy();
process.exit(failed ? 1 : 0);
