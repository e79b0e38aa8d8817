// Connector hook for the end-to-end test (see hooks.yaml): reads {"connector", "args"} on stdin and does
// what the Google API would, against the local emulators. Exit 0 with the result as JSON on stdout, or
// exit 1 with the error map ({message, tags, code}) the real connector would raise.
//
// Environment (set by test/e2e/pipeline.test.ts on the emulator, inherited here):
//   ORBAX2REG_GCS_ENDPOINT  fake-gcs-server      PUBSUB_EMULATOR_HOST  the Pub/Sub emulator
//   E2E_HOOK_LOG   one JSON line per call (what the test asserts retries with)
//   E2E_JOB_LOG    the jobs' own output
//   E2E_FAULTS     JSON file: [{"destination": "gs://...", "group": 1}] groups whose job "crashes"
import { spawn } from "node:child_process";
import { appendFileSync, existsSync, readFileSync } from "node:fs";
import { fileURLToPath } from "node:url";

const JOB_MAIN = fileURLToPath(new URL("../../dist/jobs/main.js", import.meta.url));

let input = "";
for await (const chunk of process.stdin) input += chunk;
const { connector, args } = JSON.parse(input);

const fail = (error) => {
  process.stdout.write(JSON.stringify(error));
  process.exit(1);
};
const record = (entry) => {
  if (process.env.E2E_HOOK_LOG) appendFileSync(process.env.E2E_HOOK_LOG, `${JSON.stringify({ connector, ...entry })}\n`);
};

// googleapis.run.v2.projects.locations.jobs.run: runs `node dist/jobs/main.js <phase>` once per task, like
// a Cloud Run job execution, and waits for it (the connector waits for the long-running operation).
async function runJob() {
  const name = args.name;
  const phase = ["plan", "convert-group", "finalize"].find((p) => name.endsWith(`/jobs/orbax2reg-${p}`));
  if (phase === undefined) fail({ message: `Job ${name} not found`, code: 404, tags: ["HttpError"] });
  const overrides = args.body?.overrides ?? {};
  const env = Object.fromEntries((overrides.containerOverrides?.[0]?.env ?? []).map((e) => [e.name, e.value]));
  const taskCount = overrides.taskCount ?? 1;
  const execution = `${name}/executions/${phase}-${Date.now().toString(36)}`;
  record({ phase, group: env.ORBAX2REG_GROUP ?? null, destination: env.ORBAX2REG_DESTINATION, taskCount });

  const faults =
    process.env.E2E_FAULTS && existsSync(process.env.E2E_FAULTS) ? JSON.parse(readFileSync(process.env.E2E_FAULTS, "utf8")) : [];
  if (faults.some((f) => f.destination === env.ORBAX2REG_DESTINATION && String(f.group) === env.ORBAX2REG_GROUP)) {
    // What a task killed without a word looks like: the execution failed, no failure report.
    fail({ message: `The execution ${execution} failed: task 0 was terminated (injected)`, tags: ["OperationError"] });
  }
  const codes = await Promise.all(
    Array.from({ length: taskCount }, (_, task) => {
      const child = spawn(process.execPath, [JOB_MAIN, phase], {
        env: {
          ...process.env,
          ...env,
          CLOUD_RUN_TASK_INDEX: String(task),
          CLOUD_RUN_TASK_COUNT: String(taskCount),
          CLOUD_RUN_EXECUTION: execution,
        },
        stdio: ["ignore", "pipe", "pipe"],
      });
      const log = (data) => process.env.E2E_JOB_LOG && appendFileSync(process.env.E2E_JOB_LOG, data);
      child.stdout.on("data", log);
      child.stderr.on("data", log);
      return new Promise((resolve) => child.on("close", (code) => resolve(code ?? 1)));
    }),
  );
  const failed = codes.filter((c) => c !== 0).length;
  if (failed > 0) fail({ message: `The execution ${execution} failed: ${failed} of ${taskCount} tasks failed`, tags: ["OperationError"] });
  return { name: execution, taskCount, succeededCount: taskCount, failedCount: 0, cancelledCount: 0 };
}

// googleapis.storage.v1.objects.get with alt=media: the object's bytes, as text.
async function getObject() {
  const url = `${process.env.ORBAX2REG_GCS_ENDPOINT}/storage/v1/b/${args.bucket}/o/${args.object}?alt=${args.alt ?? "json"}`;
  const response = await fetch(url);
  const body = await response.text();
  record({ object: decodeURIComponent(args.object), status: response.status });
  if (!response.ok)
    fail({ message: `HTTP server responded with error code ${response.status}`, code: response.status, tags: ["HttpError"], body });
  return args.alt === "media" ? body : JSON.parse(body);
}

// googleapis.pubsub.v1.projects.topics.publish: to the Pub/Sub emulator.
async function publish() {
  const { PubSub } = await import("@google-cloud/pubsub");
  const project = args.topic.split("/")[1];
  const topic = new PubSub({ projectId: project }).topic(args.topic);
  const messageIds = [];
  try {
    for (const m of args.body.messages) {
      messageIds.push(await topic.publishMessage({ data: Buffer.from(m.data ?? "", "base64"), attributes: m.attributes ?? {} }));
    }
  } catch (e) {
    // gRPC status -> the HTTP status the REST connector would see
    const code = { 3: 400, 4: 504, 5: 404, 7: 403, 8: 429, 14: 503 }[e.code] ?? 500;
    fail({ message: `HTTP server responded with error code ${code}: ${e.details ?? e.message}`, code, tags: ["HttpError"] });
  }
  record({ topic: args.topic, messages: args.body.messages.length });
  return { messageIds };
}

const handlers = {
  "googleapis.run.v2.projects.locations.jobs.run": runJob,
  "googleapis.storage.v1.objects.get": getObject,
  "googleapis.pubsub.v1.projects.topics.publish": publish,
};
const handler = handlers[connector];
if (handler === undefined) fail({ message: `no stand-in for ${connector}`, tags: ["SystemError"] });
process.stdout.write(JSON.stringify(await handler()));
// The Pub/Sub client keeps sockets open; the result is written, so leave now.
process.exit(0);
