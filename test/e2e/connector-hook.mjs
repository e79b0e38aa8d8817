// Connector hook for the Workflows emulator (see hooks.yaml): reads {"connector", "args"} on stdin and does
// what the Google API would, against the local emulators. Exit 0 with the result as JSON on stdout, or
// exit 1 with the error map ({message, tags, code}) the real connector would raise.
//
// Cloud Run is played by local processes (the export job runs the phase its execution's args override names, as
// Cloud Run replaces a job's args with an override's): jobs.run with connector_params.skip_polling starts a detached
// "execution" (this file with --run) that runs `node dist/jobs/main.js <phase>` once per task and records its
// outcome in a state file; operations.get reads that state (holding the answer briefly while the execution
// runs, so polling loops do not spin); jobs.executions.cancel kills the execution's processes. Without
// skip_polling, jobs.run waits for the tasks itself, as the connector waits for the operation.
// The executions' state (run-state.mjs) counts tasks running / succeeded / failed / cancelled, so that
// run-api.mjs can serve the Run Admin API's executions.get and executions.cancel from it. The task processes get
// what Cloud Run and terraform set on a job: CLOUD_RUN_JOB/EXECUTION/TASK_*, ORBAX2REG_PROJECT and _REGION.
//
// Environment (set by the tests on the emulator, inherited here):
//   ORBAX2REG_GCS_ENDPOINT  fake-gcs-server      PUBSUB_EMULATOR_HOST  the Pub/Sub emulator
//   E2E_HOOK_LOG   one JSON line per call (what the tests assert retries, cancels and overlaps with)
//   E2E_JOB_LOG    the jobs' own output
//   E2E_RUN_STATE  directory for the executions' state (default: next to E2E_HOOK_LOG, else the temp dir)
//   E2E_PUBSUB_LOG when set, publish appends the messages to this file instead of using the Pub/Sub emulator
//   E2E_HANG_LIMIT_MS, E2E_POLL_HOLD_MS   how long a hung execution lasts (60 s), how long a poll is held (300 ms)
//   E2E_JOB_NODE_ARGS  JSON list: node's flags from the jobs' container command (jobs.tf), given to every task
//   E2E_TASK_MAX_RETRIES  the jobs' max_retries (jobs.tf): how often a task that exits non-zero is run again (default 0)
//   E2E_FAULTS     JSON file: a list of faults, each {"destination": "gs://...", ...}:
//                    {"group": 1}                       that group's executions fail without a report
//                    {"group": 1, "fault": "hang"}      its execution never finishes (gives up after 60 s)
//                    {"phase": "plan", "fault": "http", "code": 500}   jobs.run itself answers HTTP 500
//                    {"group": 1, "fault": "poll", "code": 403}  operations.get on its execution answers HTTP 403
//                    {"fault": "publish", "type": "conversion.succeeded", "code": 403}   publishing fails
//                    {"phase": "export-shards", "fault": "kill", "task": 1, "afterMs": 300}   task 1's first attempt
//                                                       is killed (SIGKILL) that long after it starts; Cloud Run retries it
//                    {"phase": "export-shards", "fault": "kill", "task": 1, "inShard": 2}   task 1's first attempt is
//                                                       killed while it writes its 2nd shard (kill-in-shard.mjs)
//                  "times": N applies a fault to the first N matching calls only.
import { spawn } from "node:child_process";
import { createHash } from "node:crypto";
import { appendFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import * as runState from "./run-state.mjs";

const THIS_FILE = fileURLToPath(import.meta.url);
const JOB_MAIN = fileURLToPath(new URL("../../dist/jobs/main.js", import.meta.url));
const KILL_IN_SHARD = fileURLToPath(new URL("./kill-in-shard.mjs", import.meta.url));
const NODE_ARGS = JSON.parse(process.env.E2E_JOB_NODE_ARGS ?? "[]");
// A hung execution gives up after this long; operations.get holds its answer this long while one runs (both
// may be changed by a test whose workflow waits on the emulator's clock, which needs neither).
const HANG_LIMIT_MS = Number(process.env.E2E_HANG_LIMIT_MS ?? 60_000);
const POLL_HOLD_MS = Number(process.env.E2E_POLL_HOLD_MS ?? 300);
const TASK_MAX_RETRIES = Number(process.env.E2E_TASK_MAX_RETRIES ?? 0);

const STATE_DIR = process.env.E2E_RUN_STATE ?? join(process.env.E2E_HOOK_LOG ? dirname(process.env.E2E_HOOK_LOG) : tmpdir(), "runs");
mkdirSync(STATE_DIR, { recursive: true });

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const readState = (id) => runState.readState(STATE_DIR, id);
const writeState = (id, state) => runState.writeState(STATE_DIR, id, state);
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

/**
 * Runs every task of a job execution as a local process; resolves to the number of failed tasks. `onSpawn(child, task)`.
 * As Cloud Run does, a task that exits non-zero is run again, up to the job's max_retries times (E2E_TASK_MAX_RETRIES,
 * jobs.tf's value: test/e2e/deployed.ts), with CLOUD_RUN_TASK_ATTEMPT counting the retries
 * (https://cloud.google.com/run/docs/jobs-retries, https://cloud.google.com/run/docs/container-contract#jobs-env-vars).
 * Each attempt is logged ("task": its job's phase, group, task, attempt and exit code).
 */
async function runTasks(phase, env, taskCount, execution, onSpawn = () => {}, jobKey = phase) {
  const runTask = async (task) => {
    for (let attempt = 0; ; attempt++) {
      const code = await runAttempt(phase, env, taskCount, execution, task, attempt, onSpawn, jobKey);
      record("task", {
        job: phase,
        group: env.ORBAX2REG_GROUP ?? null,
        destination: env.ORBAX2REG_DESTINATION,
        execution,
        task,
        attempt,
        code,
      });
      if (code === 0 || attempt >= TASK_MAX_RETRIES) return code;
    }
  };
  const codes = await Promise.all(Array.from({ length: taskCount }, (_, task) => runTask(task)));
  return codes.filter((c) => c !== 0).length;
}

/** One attempt of one task: its exit code. */
function runAttempt(phase, env, taskCount, execution, task, attempt, onSpawn, jobKey = phase) {
  const killed =
    attempt === 0 &&
    takeFault(
      (f) =>
        f.fault === "kill" &&
        String(f.task ?? 0) === String(task) &&
        faultMatches(f, { destination: env.ORBAX2REG_DESTINATION, phase, group: env.ORBAX2REG_GROUP ?? null }),
    );
  // Killed inside its Nth shard: kill-in-shard.mjs, preloaded into this attempt only, does it.
  const inShard = killed && killed.inShard !== undefined ? ["--import", KILL_IN_SHARD] : [];
  const child = spawn(process.execPath, [...NODE_ARGS, ...inShard, JOB_MAIN, phase], {
    env: {
      ...(inShard.length > 0 ? { E2E_KILL_IN_SHARD: String(killed.inShard) } : {}),
      ...process.env,
      // E2E_JOB_ENV, {phase: {NAME: VALUE}}: the job's own env (jobs.tf), under the execution's overrides, which
      // win: Cloud Run merges a job's env with an execution's container overrides.
      ...(process.env.E2E_JOB_ENV ? JSON.parse(process.env.E2E_JOB_ENV)[jobKey] : undefined),
      ...env,
      CLOUD_RUN_TASK_INDEX: String(task),
      CLOUD_RUN_TASK_COUNT: String(taskCount),
      CLOUD_RUN_TASK_ATTEMPT: String(attempt),
      CLOUD_RUN_EXECUTION: execution.split("/").at(-1),
      // projects/P/locations/R/jobs/J/executions/E: Cloud Run names the job; terraform sets project and region.
      CLOUD_RUN_JOB: execution.split("/")[5],
      ORBAX2REG_PROJECT: execution.split("/")[1],
      ORBAX2REG_REGION: execution.split("/")[3],
    },
    stdio: ["ignore", "pipe", "pipe"],
  });
  onSpawn(child, task);
  if (killed && inShard.length === 0) setTimeout(() => child.kill("SIGKILL"), killed.afterMs ?? 300);
  child.stdout.on("data", jobLog);
  child.stderr.on("data", jobLog);
  return new Promise((resolve) => child.on("close", (code) => resolve(code ?? 1)));
}

const executionResource = runState.executionResource;

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
  const overrides = args.body?.overrides ?? {};
  // The job's key in jobs.tf (its default phase argument); the export job's phase is its execution's args override.
  const jobKey =
    ["plan", "convert-group", "finalize"].find((p) => name.endsWith(`/jobs/orbax2reg-${p}`)) ??
    (name.endsWith("/jobs/orbax2reg-export") ? "export-shards" : undefined);
  if (jobKey === undefined)
    fail({ message: `HTTP server responded with error code 404: Job ${name} not found`, code: 404, tags: ["HttpError"] });
  const phase = overrides.containerOverrides?.[0]?.args?.[1] ?? jobKey;
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
    const failed = await runTasks(phase, env, taskCount, execution, undefined, jobKey);
    if (failed > 0)
      fail({ message: `The execution ${execution} failed: ${failed} of ${taskCount} tasks failed`, tags: ["OperationError"] });
    return executionResource({ execution, job: name, taskCount }, { succeeded: taskCount, failed: 0, cancelled: 0 });
  }

  const state = {
    operation: `projects/${project}/locations/${location}/operations/${id}`,
    execution,
    job: name,
    phase,
    jobKey,
    group,
    destination,
    taskCount,
    env,
    fault: fault?.fault ?? (fault ? "crash" : undefined),
    createTime: new Date().toISOString(),
    tasks: Array.from({ length: taskCount }, () => ({ state: "pending" })),
    done: false,
  };
  writeState(id, state);
  const runner = spawn(process.execPath, [THIS_FILE, "--run", id], { detached: true, stdio: "ignore", env: process.env });
  runner.unref();
  return operationOf(state);
}

/** Writes task 0's progress record as a job does when it starts (src/cloud/job/reports.ts), for a hung "task". */
async function reportRunning(s) {
  const { openStore } = await import("../../dist/src/store/open.js");
  const { progressKey } = await import("../../dist/src/convert/work-dir.js");
  const now = new Date().toISOString();
  const group = s.group === null ? null : Number(s.group);
  const record = {
    phase: s.phase,
    group,
    task: 0,
    taskCount: s.taskCount,
    attempt: s.env.ORBAX2REG_ATTEMPT ?? null,
    workflowExecution: s.env.ORBAX2REG_EXECUTION ?? null,
    execution: s.execution,
    state: "running",
    objects: null,
    objectsDone: 0,
    bytes: null,
    bytesDone: 0,
    startedAt: now,
    updatedAt: now,
    error: null,
  };
  const stepDir = `step_${String(s.env.ORBAX2REG_STEP).padStart(8, "0")}`;
  await (await openStore(s.destination)).write(
    `${stepDir}/${progressKey(s.phase, group, 0)}`,
    new TextEncoder().encode(JSON.stringify(record)),
  );
}

/** The detached execution: `node connector-hook.mjs --run <id>`. */
async function execute(id) {
  const s = readState(id);
  if (s.done) return; // cancelled before it started
  writeState(id, { ...s, runnerPid: process.pid });
  record("execution", {
    job: s.phase,
    group: s.group,
    destination: s.destination,
    execution: s.execution,
    event: "started",
    pid: process.pid,
  });
  const setTask = (task, state) => {
    const now = readState(id);
    now.tasks[task] = { ...now.tasks[task], state };
    writeState(id, now);
  };
  const setTasks = (state) => {
    const now = readState(id);
    writeState(id, { ...now, tasks: now.tasks.map((t) => ({ ...t, state })) });
  };
  const finish = (outcome) => {
    const now = readState(id);
    if (now.done) return; // cancelled meanwhile
    writeState(id, { ...now, done: true, completionTime: new Date().toISOString(), ...outcome });
    record("execution", { job: s.phase, group: s.group, destination: s.destination, execution: s.execution, event: "finished" });
  };
  if (s.fault === "crash") {
    // What a task killed without a word looks like: the execution failed, no failure report.
    setTasks("failed");
    finish({ error: { code: 2, message: `The execution ${s.execution} failed: task 0 was terminated (injected)` } });
    return;
  }
  if (s.fault === "hang") {
    setTasks("running");
    await reportRunning(s); // a task that wrote its first progress record, then hung
    await sleep(HANG_LIMIT_MS); // never finishes on its own within any test; bounded all the same
    finish({ error: { code: 4, message: `The execution ${s.execution} hung (injected) and gave up` } });
    return;
  }
  // Per-task state, so that executions.get counts running tasks (started and not finished).
  const failed = await runTasks(
    s.phase,
    s.env,
    s.taskCount,
    s.execution,
    (child, task) => {
      setTask(task, "running");
      child.on("close", (code) => setTask(task, code === 0 ? "succeeded" : "failed"));
    },
    s.jobKey ?? s.phase,
  );
  if (failed > 0) finish({ error: { code: 2, message: `The execution ${s.execution} failed: ${failed} of ${s.taskCount} tasks failed` } });
  else
    finish({
      response: executionResource(s, { succeeded: s.taskCount, failed: 0, cancelled: 0 }),
    });
}

const idOf = runState.idOf;

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

// googleapis.run.v2.projects.locations.jobs.executions.cancel (the connector waits until it is cancelled)
async function cancelExecution(args) {
  const id = idOf(args.name);
  const s = readState(id);
  if (s === undefined)
    fail({ message: `HTTP server responded with error code 404: execution ${args.name} not found`, code: 404, tags: ["HttpError"] });
  if (s.done)
    fail({ message: "HTTP server responded with error code 400: the execution has already finished", code: 400, tags: ["HttpError"] });
  const cancelled = await runState.killExecution(STATE_DIR, id); // shared with run-api.mjs
  record("googleapis.run.v2.projects.locations.jobs.executions.cancel", {
    job: s.phase,
    group: s.group,
    destination: s.destination,
    execution: s.execution,
  });
  return executionResource(cancelled);
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

// googleapis.storage.v1.objects.list: one page of the objects under a prefix. Only the arguments the connector's page
// lists are taken (https://cloud.google.com/workflows/docs/reference/googleapis/storage/v1/objects/list); anything else
// (a JSON API query parameter such as `fields`, which the page does not list) fails the call, as an argument the
// workflow cannot rely on.
const LIST_ARGS = new Set([
  "bucket",
  "delimiter",
  "endOffset",
  "includeFoldersAsPrefixes",
  "includeTrailingDelimiter",
  "matchGlob",
  "maxResults",
  "pageToken",
  "prefix",
  "projection",
  "softDeleted",
  "startOffset",
  "userProject",
  "versions",
]);
async function listObjects(args) {
  const unknown = Object.keys(args).filter((k) => !LIST_ARGS.has(k));
  if (unknown.length > 0)
    fail({ message: `objects.list: arguments the connector does not list: ${unknown.join(", ")}`, tags: ["TypeError"] });
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
