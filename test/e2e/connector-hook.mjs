// Connector hook for the Workflows emulator (see hooks.yaml): reads {"connector", "args"} on stdin and does
// what the Google API would, against the local emulators. Exit 0 with the result as JSON on stdout, or
// exit 1 with the error map ({message, tags, code}) the real connector would raise.
//
// Cloud Run is played by local processes: jobs.run with connector_params.skip_polling starts a detached
// "execution" (this file with --run) that runs `node dist/jobs/main.js <phase>` once per task and records its
// outcome in a state file; operations.get reads that state (holding the answer briefly while the execution
// runs, so polling loops do not spin); jobs.executions.cancel kills the execution's processes. Without
// skip_polling, jobs.run waits for the tasks itself, as the connector waits for the operation.
//
// Environment (set by the tests on the emulator, inherited here):
//   ORBAX2REG_GCS_ENDPOINT  fake-gcs-server      PUBSUB_EMULATOR_HOST  the Pub/Sub emulator
//   E2E_HOOK_LOG   one JSON line per call (what the tests assert retries, cancels and overlaps with)
//   E2E_JOB_LOG    the jobs' own output
//   E2E_RUN_STATE  directory for the executions' state (default: next to E2E_HOOK_LOG, else the temp dir)
//   E2E_PUBSUB_LOG when set, publish appends the messages to this file instead of using the Pub/Sub emulator
//   E2E_FAULTS     JSON file: a list of faults, each {"destination": "gs://...", ...}:
//                    {"group": 1}                       that group's executions fail without a report
//                    {"group": 1, "fault": "hang"}      its execution never finishes (gives up after 60 s)
//                    {"phase": "plan", "fault": "http", "code": 500}   jobs.run itself answers HTTP 500
//                    {"group": 1, "fault": "poll", "code": 403}  operations.get on its execution answers HTTP 403
//                    {"fault": "publish", "type": "conversion.succeeded", "code": 403}   publishing fails
//                  "times": N applies a fault to the first N matching calls only.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { appendFileSync, existsSync, mkdirSync, readFileSync, renameSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const THIS_FILE = fileURLToPath(import.meta.url);
const JOB_MAIN = fileURLToPath(new URL("../../dist/jobs/main.js", import.meta.url));
const HANG_LIMIT_MS = 60_000;
const POLL_HOLD_MS = 300;

const STATE_DIR = process.env.E2E_RUN_STATE ?? join(process.env.E2E_HOOK_LOG ? dirname(process.env.E2E_HOOK_LOG) : tmpdir(), "runs");
mkdirSync(STATE_DIR, { recursive: true });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const stateFile = (id) => join(STATE_DIR, `${id}.json`);
const readState = (id) => (existsSync(stateFile(id)) ? JSON.parse(readFileSync(stateFile(id), "utf8")) : undefined);
function writeState(id, state) {
  const tmp = `${stateFile(id)}.${process.pid}.tmp`;
  writeFileSync(tmp, JSON.stringify(state));
  renameSync(tmp, stateFile(id));
}
const record = (connector, entry) => {
  if (process.env.E2E_HOOK_LOG) appendFileSync(process.env.E2E_HOOK_LOG, `${JSON.stringify({ connector, at: Date.now(), ...entry })}\n`);
};
const jobLog = (data) => process.env.E2E_JOB_LOG && appendFileSync(process.env.E2E_JOB_LOG, data);

/** Whether a fault names this job execution (destination, and phase or group when it gives them). */
const faultMatches = (f, s) =>
  f.destination === s.destination &&
  (f.phase === undefined || f.phase === s.phase) &&
  (f.group === undefined || String(f.group) === s.group);

/** The first fault matching `test` that still applies ("times" counted across hook processes). */
function takeFault(test) {
  const file = process.env.E2E_FAULTS;
  const faults = file && existsSync(file) ? JSON.parse(readFileSync(file, "utf8")) : [];
  for (const f of faults) {
    if (!test(f)) continue;
    if (f.times === undefined) return f;
    const key = createHash("sha256").update(JSON.stringify(f)).digest("hex").slice(0, 16);
    for (let n = 0; n < f.times; n++) {
      try {
        writeFileSync(join(STATE_DIR, `fault-${key}-${n}`), "", { flag: "wx" }); // one caller wins each use
        return f;
      } catch {}
    }
  }
  return undefined;
}

// ---------------------------------------------------------------------------------------------- Cloud Run

/** Runs every task of a job execution as a local process; resolves to the number of failed tasks. */
async function runTasks(phase, env, taskCount, execution, onSpawn = () => {}) {
  const codes = await Promise.all(
    Array.from({ length: taskCount }, (_, task) => {
      const child = spawn(process.execPath, [JOB_MAIN, phase], {
        env: {
          ...process.env,
          ...env,
          CLOUD_RUN_TASK_INDEX: String(task),
          CLOUD_RUN_TASK_COUNT: String(taskCount),
          CLOUD_RUN_TASK_ATTEMPT: "0",
          CLOUD_RUN_EXECUTION: execution.split("/").at(-1),
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      onSpawn(child);
      child.stdout.on("data", jobLog);
      child.stderr.on("data", jobLog);
      return new Promise((resolve) => child.on("close", (code) => resolve(code ?? 1)));
    }),
  );
  return codes.filter((c) => c !== 0).length;
}

const executionResource = (s, counts) => ({
  name: s.execution,
  job: s.job,
  taskCount: s.taskCount,
  succeededCount: counts.succeeded,
  failedCount: counts.failed,
  cancelledCount: counts.cancelled,
});

function operationOf(s) {
  const op = {
    name: s.operation,
    metadata: { "@type": "type.googleapis.com/google.cloud.run.v2.Execution", name: s.execution, job: s.job, taskCount: s.taskCount },
  };
  if (!s.done) return op; // proto3 JSON leaves `done: false` out
  return { ...op, done: true, ...(s.error ? { error: s.error } : { response: s.response }) };
}

// googleapis.run.v2.projects.locations.jobs.run
async function runJob(args) {
  const name = args.name;
  const phase = ["plan", "convert-group", "finalize"].find((p) => name.endsWith(`/jobs/orbax2reg-${p}`));
  if (phase === undefined)
    fail({ message: `HTTP server responded with error code 404: Job ${name} not found`, code: 404, tags: ["HttpError"] });
  const overrides = args.body?.overrides ?? {};
  const env = Object.fromEntries((overrides.containerOverrides?.[0]?.env ?? []).map((e) => [e.name, e.value]));
  const taskCount = overrides.taskCount ?? 1;
  const group = env.ORBAX2REG_GROUP ?? null;
  const destination = env.ORBAX2REG_DESTINATION;
  const id = `${phase}-${Date.now().toString(36)}${Math.random().toString(36).slice(2, 8)}`;
  const [project, location] = [name.split("/")[1], name.split("/")[3]];
  const execution = `${name}/executions/${id}`;
  const matches = (f) => faultMatches(f, { destination, phase, group });

  const refused = takeFault((f) => f.fault === "http" && matches(f));
  record("googleapis.run.v2.projects.locations.jobs.run", { phase, group, destination, taskCount, execution, refused: refused?.code });
  if (refused)
    fail({ message: `HTTP server responded with error code ${refused.code} (injected)`, code: refused.code, tags: ["HttpError"] });
  const fault = takeFault((f) => (f.fault === undefined || f.fault === "crash" || f.fault === "hang") && matches(f));

  if (args.connector_params?.skip_polling !== true) {
    // Blocking form: the connector waits for the operation and raises OperationError if it fails.
    if (fault) fail({ message: `The execution ${execution} failed: task 0 was terminated (injected)`, tags: ["OperationError"] });
    const failed = await runTasks(phase, env, taskCount, execution);
    if (failed > 0)
      fail({ message: `The execution ${execution} failed: ${failed} of ${taskCount} tasks failed`, tags: ["OperationError"] });
    return executionResource({ execution, job: name, taskCount }, { succeeded: taskCount, failed: 0, cancelled: 0 });
  }

  const state = {
    operation: `projects/${project}/locations/${location}/operations/${id}`,
    execution,
    job: name,
    phase,
    group,
    destination,
    taskCount,
    env,
    fault: fault?.fault ?? (fault ? "crash" : undefined),
    done: false,
  };
  writeState(id, state);
  const runner = spawn(process.execPath, [THIS_FILE, "--run", id], { detached: true, stdio: "ignore", env: process.env });
  runner.unref();
  return operationOf(state);
}

/** The detached execution: `node connector-hook.mjs --run <id>`. */
async function execute(id) {
  const s = readState(id);
  writeState(id, { ...s, runnerPid: process.pid });
  record("execution", {
    job: s.phase,
    group: s.group,
    destination: s.destination,
    execution: s.execution,
    event: "started",
    pid: process.pid,
  });
  const finish = (outcome) => {
    const now = readState(id);
    if (now.done) return; // cancelled meanwhile
    writeState(id, { ...now, done: true, ...outcome });
    record("execution", { job: s.phase, group: s.group, destination: s.destination, execution: s.execution, event: "finished" });
  };
  if (s.fault === "crash") {
    // What a task killed without a word looks like: the execution failed, no failure report.
    finish({ error: { code: 2, message: `The execution ${s.execution} failed: task 0 was terminated (injected)` } });
    return;
  }
  if (s.fault === "hang") {
    await sleep(HANG_LIMIT_MS); // never finishes on its own within any test; bounded all the same
    finish({ error: { code: 4, message: `The execution ${s.execution} hung (injected) and gave up` } });
    return;
  }
  const failed = await runTasks(s.phase, s.env, s.taskCount, s.execution);
  if (failed > 0) finish({ error: { code: 2, message: `The execution ${s.execution} failed: ${failed} of ${s.taskCount} tasks failed` } });
  else
    finish({
      response: executionResource(s, { succeeded: s.taskCount, failed: 0, cancelled: 0 }),
    });
}

const idOf = (name) => name.split("/").at(-1);

// googleapis.run.v2.projects.locations.operations.get
async function getOperation(args) {
  const id = idOf(args.name);
  const deadline = Date.now() + POLL_HOLD_MS;
  const state = readState(id);
  const refused = state && takeFault((f) => f.fault === "poll" && faultMatches(f, state));
  if (refused) {
    record("googleapis.run.v2.projects.locations.operations.get", {
      execution: state.execution,
      destination: state.destination,
      refused: refused.code,
    });
    fail({ message: `HTTP server responded with error code ${refused.code} (injected)`, code: refused.code, tags: ["HttpError"] });
  }
  for (;;) {
    const s = readState(id);
    if (s === undefined)
      fail({ message: `HTTP server responded with error code 404: operation ${args.name} not found`, code: 404, tags: ["HttpError"] });
    if (s.done || Date.now() >= deadline) return operationOf(s);
    await sleep(50);
  }
}

function alive(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

// googleapis.run.v2.projects.locations.jobs.executions.cancel (the connector waits until it is cancelled)
async function cancelExecution(args) {
  const id = idOf(args.name);
  const s = readState(id);
  if (s === undefined)
    fail({ message: `HTTP server responded with error code 404: execution ${args.name} not found`, code: 404, tags: ["HttpError"] });
  if (s.done)
    fail({ message: "HTTP server responded with error code 400: the execution has already finished", code: 400, tags: ["HttpError"] });
  // The runner writes its pid as it starts; give it a moment if the cancel comes first.
  let pid = s.runnerPid;
  for (let i = 0; pid === undefined && i < 50; i++) {
    await sleep(20);
    pid = readState(id)?.runnerPid;
  }
  if (pid !== undefined) {
    try {
      process.kill(-pid, "SIGKILL"); // the runner and its tasks: one process group
    } catch {}
    while (alive(pid)) await sleep(20);
  }
  const cancelled = { ...readState(id), done: true, error: { code: 1, message: `The execution ${s.execution} was cancelled` } };
  writeState(id, cancelled);
  record("googleapis.run.v2.projects.locations.jobs.executions.cancel", {
    job: s.phase,
    group: s.group,
    destination: s.destination,
    execution: s.execution,
  });
  return executionResource(s, { succeeded: 0, failed: 0, cancelled: s.taskCount });
}

// ------------------------------------------------------------------------------------------ Cloud Storage

// googleapis.storage.v1.objects.get with alt=media: the object's bytes, as text.
async function getObject(args) {
  const url = `${process.env.ORBAX2REG_GCS_ENDPOINT}/storage/v1/b/${args.bucket}/o/${args.object}?alt=${args.alt ?? "json"}`;
  const response = await fetch(url);
  const body = await response.text();
  record("googleapis.storage.v1.objects.get", { object: decodeURIComponent(args.object), status: response.status });
  if (!response.ok)
    fail({ message: `HTTP server responded with error code ${response.status}`, code: response.status, tags: ["HttpError"], body });
  return args.alt === "media" ? body : JSON.parse(body);
}

// googleapis.storage.v1.objects.list: one page of the objects under a prefix.
async function listObjects(args) {
  const query = new URLSearchParams({ prefix: args.prefix ?? "", ...(args.maxResults ? { maxResults: String(args.maxResults) } : {}) });
  const response = await fetch(`${process.env.ORBAX2REG_GCS_ENDPOINT}/storage/v1/b/${args.bucket}/o?${query}`);
  const body = await response.text();
  record("googleapis.storage.v1.objects.list", { prefix: args.prefix, status: response.status });
  if (!response.ok)
    fail({ message: `HTTP server responded with error code ${response.status}`, code: response.status, tags: ["HttpError"], body });
  const page = JSON.parse(body);
  return { kind: "storage#objects", ...(page.items?.length ? { items: page.items } : {}) };
}

// -------------------------------------------------------------------------------------------------- Pub/Sub

// googleapis.pubsub.v1.projects.topics.publish: to the Pub/Sub emulator (or a file).
async function publish(args) {
  const messages = args.body.messages.map((m) => ({
    attributes: m.attributes ?? {},
    event: JSON.parse(Buffer.from(m.data ?? "", "base64").toString()),
  }));
  const refused = takeFault(
    (f) =>
      f.fault === "publish" &&
      messages.some((m) => m.event.destination === f.destination && (f.type === undefined || f.type === m.event.type)),
  );
  if (refused) {
    record("googleapis.pubsub.v1.projects.topics.publish", {
      topic: args.topic,
      refused: refused.code,
      types: messages.map((m) => m.event.type),
    });
    fail({ message: `HTTP server responded with error code ${refused.code} (injected)`, code: refused.code, tags: ["HttpError"] });
  }
  const messageIds = [];
  if (process.env.E2E_PUBSUB_LOG) {
    for (const m of messages) {
      appendFileSync(process.env.E2E_PUBSUB_LOG, `${JSON.stringify(m)}\n`);
      messageIds.push(String(messageIds.length));
    }
  } else {
    const { PubSub } = await import("@google-cloud/pubsub");
    const project = args.topic.split("/")[1];
    const topic = new PubSub({ projectId: project }).topic(args.topic);
    try {
      for (const m of args.body.messages) {
        messageIds.push(await topic.publishMessage({ data: Buffer.from(m.data ?? "", "base64"), attributes: m.attributes ?? {} }));
      }
    } catch (e) {
      // gRPC status -> the HTTP status the REST connector would see
      const code = { 3: 400, 4: 504, 5: 404, 7: 403, 8: 429, 14: 503 }[e.code] ?? 500;
      fail({ message: `HTTP server responded with error code ${code}: ${e.details ?? e.message}`, code, tags: ["HttpError"] });
    }
  }
  record("googleapis.pubsub.v1.projects.topics.publish", {
    topic: args.topic,
    messages: messages.length,
    types: messages.map((m) => m.event.type),
  });
  return { messageIds };
}

// ------------------------------------------------------------------------------------------------- dispatch

function fail(error) {
  process.stdout.write(JSON.stringify(error));
  process.exit(1);
}

if (process.argv[2] === "--run") {
  await execute(process.argv[3]);
  process.exit(0);
}

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { connector, args } = JSON.parse(input);
const handlers = {
  "googleapis.run.v2.projects.locations.jobs.run": runJob,
  "googleapis.run.v2.projects.locations.operations.get": getOperation,
  "googleapis.run.v2.projects.locations.jobs.executions.cancel": cancelExecution,
  "googleapis.storage.v1.objects.get": getObject,
  "googleapis.storage.v1.objects.list": listObjects,
  "googleapis.pubsub.v1.projects.topics.publish": publish,
};
const handler = handlers[connector];
if (handler === undefined) fail({ message: `no stand-in for ${connector}`, tags: ["SystemError"] });
process.stdout.write(JSON.stringify(await handler(args)));
// The Pub/Sub client keeps sockets open; the result is written, so leave now.
process.exit(0);
