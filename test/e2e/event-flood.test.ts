import { readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { type Message, PubSub } from "@google-cloud/pubsub";
import { Storage } from "@google-cloud/storage";
import { ExecutionsClient, type protos } from "@google-cloud/workflows";
import { PassThroughClient } from "google-auth-library";
import { afterAll, afterEach, beforeAll, describe, expect, test, vi } from "vitest";
import { removeScratch, scratch } from "../helpers/convert.js";
import { SETUP_CLIENT } from "../helpers/gcs.js";
import { MANY_CHUNKS_ROOT, TOOLS } from "../helpers/paths.js";
import { answers, freePort, need, type Running, serve } from "../helpers/servers.js";
import { testTls } from "../helpers/tls.mjs";
import { deployedSettings } from "./deployed.js";
import { printLogsOnFailure, startDeployedWorkflow, startFunction, startPubsub } from "./emulators.js";

// The event flood of a deployment that converts into the checkpoint bucket (the module's default, and the example's
// with convert_into_checkpoint_bucket = true; docs/operations.md, "Event cost"): the regular checkpoint is written into
// the watched checkpoint bucket itself, so every object the conversion writes is one more finalize event for the
// function. Here every object write makes an event, as in Cloud Storage: fake-gcs-server publishes a Cloud Storage
// notification (JSON_API_V1 payload, OBJECT_FINALIZE) to the Pub/Sub emulator for each object created in the bucket
// (its -event.* flags), and a relay turns each into the google.cloud.storage.object.v1.finalized CloudEvent Eventarc
// delivers to the function, acknowledging the message only on a 2xx answer (Eventarc's push: a failure is
// redelivered). The relay is the one stand-in (no Eventarc emulator exists); the function, the workflow, the jobs and
// the storage are the real ones the other e2e tests run. A step of 100 arrays x 64 chunks (6,400 chunk objects) is
// converted into the bucket; every delivery is counted with its answer.

// Slow: run alone (npx vitest run test/e2e/event-flood.test.ts).
vi.setConfig({ testTimeout: 1_500_000 });

type Execution = protos.google.cloud.workflows.executions.v1.IExecution;

const PROJECT = "test-project";
const BUCKET = "flood";
const STEP = "runs/exp/step_00000100";
const TOPIC = "gcs-notifications";
// Two groups at a time, not the default eight: fake-gcs-server's memory backend scans every object it holds, under
// one lock, on each write (internal/backend/memory.go, CreateObject), so each write's wait grows with the writes in
// flight. Eight tasks of 32 objects each against ~13,000 objects on 2 cores kept requests waiting past the jobs' 30 s
// stall limit, and the retries made it worse: the execution did not finish in 20 minutes. The events per object,
// which this test counts, do not depend on the fan-out; a user sets the same module variable.
// convert_into_checkpoint_bucket: the layout this test is about (the example writes to a bucket of its own by default).
const TFVARS = { project_id: PROJECT, checkpoint_bucket: BUCKET, convert_into_checkpoint_bucket: true };
const MODULE_ARGS = { max_parallel_groups: 2 };

let work: string;
let gcs: Running;
let pubsub: Running;
let workflows: Running;
let fn: Running;
let storage: Storage;
let executions: ExecutionsClient;
let WORKFLOW: string;
let closeRelay: () => Promise<void>;

/** One delivery of an object's finalize event: the object, its generation and the function's HTTP answer. */
interface Delivery {
  readonly id: string;
  readonly name: string;
  readonly generation: string;
  readonly status: number;
  /** When the function answered (ms since the epoch), and how long the delivery took (ms). */
  readonly at: number;
  readonly ms: number;
}
const deliveries: Delivery[] = [];

beforeAll(async () => {
  work = scratch("event-flood");
  process.env.METADATA_SERVER_DETECTION = "none";
  const deployed = await deployedSettings(TFVARS, MODULE_ARGS);
  WORKFLOW = deployed.functionEnv.ORBAX2REG_WORKFLOW as string;

  pubsub = await startPubsub(join(work, "pubsub.log"));
  const pubsubHost = `127.0.0.1:${pubsub.port}`;
  process.env.PUBSUB_EMULATOR_HOST = pubsubHost;
  const client = new PubSub({ projectId: PROJECT });
  const [notifications] = await client.createTopic(TOPIC);
  const [subscription] = await notifications.createSubscription("eventarc-stand-in");
  await client.createTopic(deployed.functionEnv.ORBAX2REG_EVENTS_TOPIC as string);

  // A fake-gcs-server of this test's own, publishing every object finalized in the bucket.
  const bin = `${TOOLS}/fake-gcs-server`;
  need(bin);
  const port = await freePort();
  // Over HTTPS with the test CA, as the suite's own emulator (test/setup/global.ts) and Cloud Storage serve.
  const { certFile, keyFile } = testTls();
  const args = ["-scheme", "https", "-cert-location", certFile, "-private-key-location", keyFile];
  args.push("-host", "127.0.0.1", "-port", String(port), "-backend", "memory", "-log-level", "error");
  args.push("-event.pubsub-project-id", PROJECT, "-event.pubsub-topic", TOPIC, "-event.bucket", BUCKET, "-event.list", "finalize");
  gcs = await serve("fake-gcs-server (events)", bin, args, port, {
    scheme: "https",
    env: { PUBSUB_EMULATOR_HOST: pubsubHost },
    logFile: join(work, "fake-gcs.log"),
    ready: answers("/storage/v1/b"),
  });
  storage = new Storage({ apiEndpoint: gcs.url, projectId: PROJECT, ...SETUP_CLIENT });
  await storage.createBucket(BUCKET);

  const emulators = {
    ORBAX2REG_GCS_ENDPOINT: gcs.url,
    PUBSUB_EMULATOR_HOST: pubsubHost,
    GOOGLE_CLOUD_PROJECT: PROJECT,
    METADATA_SERVER_DETECTION: "none",
  };
  workflows = await startDeployedWorkflow(work, deployed, emulators);
  fn = await startFunction(
    { ...deployed.functionEnv, ...emulators, ORBAX2REG_WORKFLOWS_ENDPOINT: workflows.url },
    join(work, "function.log"),
  );
  executions = new ExecutionsClient({
    fallback: true,
    protocol: "http",
    apiEndpoint: "127.0.0.1",
    port: workflows.port,
    authClient: new PassThroughClient(),
  } as unknown as ConstructorParameters<typeof ExecutionsClient>[0]);

  // Eventarc's stand-in: the notification becomes the CloudEvent Eventarc sends for it (binary mode; id, source,
  // subject and time from the notification), acknowledged only when the function answers 2xx.
  subscription.setOptions({ flowControl: { maxMessages: 200, allowExcessMessages: false } });
  subscription.on("message", (m: Message) => {
    void (async () => {
      const bucket = m.attributes.bucketId as string;
      const name = m.attributes.objectId as string;
      let status = 0;
      const sent = Date.now();
      try {
        const response = await fetch(fn.url, {
          method: "POST",
          headers: {
            "content-type": "application/json",
            "ce-specversion": "1.0",
            "ce-id": m.id,
            "ce-type": "google.cloud.storage.object.v1.finalized",
            "ce-source": `//storage.googleapis.com/projects/_/buckets/${bucket}`,
            "ce-subject": `objects/${name}`,
            "ce-time": m.attributes.eventTime ?? new Date().toISOString(),
          },
          body: m.data.toString("utf8"),
        });
        status = response.status;
      } catch {
        status = -1; // the function did not answer
      }
      const at = Date.now();
      deliveries.push({ id: m.id, name, generation: m.attributes.objectGeneration as string, status, at, ms: at - sent });
      if (status >= 200 && status < 300) m.ack();
      else m.nack();
    })();
  });
  closeRelay = () => subscription.close();
}, 180_000);

// A failed test prints the end of what the pipeline logged, so that a failure seen once in CI can be read.
afterEach((ctx) => {
  if (ctx.task.result?.state === "fail") process.stderr.write(`--- ${ctx.task.name}: ${deliveries.length} deliveries so far\n`);
});
printLogsOnFailure(() => work, ["hooks.jsonl", "jobs.jsonl", "workflows.log", "function.log", "fake-gcs.log"]);

afterAll(async () => {
  await closeRelay?.();
  await Promise.all([fn?.stop(), workflows?.stop(), gcs?.stop(), pubsub?.stop()]);
  removeScratch();
});

async function upload(localDir: string, prefix: string, keep: (key: string) => boolean): Promise<void> {
  const files = readdirSync(localDir, { recursive: true, withFileTypes: true })
    .filter((e) => !e.isDirectory())
    .map((e) => join(e.parentPath, e.name).slice(localDir.length + 1));
  await Promise.all(
    files.filter(keep).map((k) =>
      storage
        .bucket(BUCKET)
        .file(`${prefix}/${k}`)
        .save(readFileSync(join(localDir, k)), { resumable: false }),
    ),
  );
}

async function until(what: string, condition: () => Promise<boolean> | boolean, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (!(await condition())) {
    if (Date.now() > deadline) throw new Error(`${what}: not within ${timeoutMs / 1000} s`);
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** The function's JSON log lines. */
const functionLines = () =>
  readFileSync(join(work, "function.log"), "utf8")
    .split("\n")
    .filter((l) => l.startsWith("{"))
    .map((l) => JSON.parse(l) as Record<string, unknown>);

describe("a conversion written into the watched bucket (the default destination)", () => {
  test("wakes the function once per object it writes, and every one of those events is dismissed: acknowledged, no work, no line", async () => {
    const step = join(MANY_CHUNKS_ROOT, "step_00000100");
    // The training job's write, commit marker last (as Orbax does).
    await upload(step, STEP, (k) => k !== "commit_success.txt");
    await upload(step, STEP, (k) => k === "commit_success.txt");

    let execution: Execution | undefined;
    await until(
      "one execution started by the commit marker",
      async () => {
        const [all] = await executions.listExecutions({ parent: WORKFLOW });
        execution = all[0];
        return all.length > 0;
      },
      120_000,
    );
    await until(
      "the execution finished",
      async () => {
        const [e] = await executions.getExecution({ name: execution?.name as string });
        execution = e;
        return e.state !== "ACTIVE" && e.state !== "QUEUED";
      },
      // 6,400 objects through fake-gcs-server on a shared 2-core machine: minutes. A deadline, not a timing check.
      1_200_000,
    );
    expect(execution?.state).toBe("SUCCEEDED");
    expect(JSON.parse(execution?.result as string)).toMatchObject({ arrays: 100 });

    // Every object in the bucket now (source, regular checkpoint, the conversion's records) had its event delivered.
    const [files] = await storage.bucket(BUCKET).getFiles();
    const delivered = () => new Set(deliveries.map((d) => `${d.name}#${d.generation}`));
    await until("every object's event delivered", () => files.every((f) => delivered().has(`${f.name}#${f.metadata.generation}`)), 120_000);
    const regularChunks = files.filter((f) => /^runs\/exp\/regular\/step_00000100\/gda\/.+\/\d+(\.\d+)*$/.test(f.name));
    expect(regularChunks.length).toBe(6_400);

    // Every delivery acknowledged at once (204): none failed, so none was redelivered for a failure.
    expect([...new Set(deliveries.map((d) => d.status))]).toEqual([204]);
    const conversionsOwn = deliveries.filter((d) => d.name.startsWith("runs/exp/regular/"));
    expect(conversionsOwn.length).toBeGreaterThanOrEqual(6_400 + 100 + 1); // chunks, .zarray files, index
    const messages = new Set(deliveries.map((d) => d.id)).size;

    // Exactly one execution for the step, though every one of these events reached the function.
    const [all] = await executions.listExecutions({ parent: WORKFLOW });
    expect(all).toHaveLength(1);

    // Dismissed without work: no line about any event but the commit marker's (a dismissed event reads nothing,
    // claims nothing, logs nothing: src/cloud/trigger/classify.ts decides on the name alone).
    const marker = deliveries.filter((d) => d.name === `${STEP}/commit_success.txt`);
    expect(marker).toHaveLength(1);
    const aboutOthers = functionLines().filter((l) => l.eventId !== undefined && l.eventId !== marker[0]?.id);
    expect(aboutOthers).toEqual([]);
    // What the events were for: each kind of object, the deliveries and the distinct names (a record rewritten, or an
    // upload retried after a lost answer, is one more finalize event for the same name).
    const kind = (name: string) =>
      !name.startsWith("runs/exp/regular/")
        ? "source step"
        : name.includes("/.orbax2reg/")
          ? "the conversion's records (.orbax2reg/)"
          : name.endsWith("/.zarray")
            ? ".zarray"
            : name.endsWith("/index")
              ? "index"
              : "chunks";
    const kinds = new Map<string, { deliveries: number; names: Set<string> }>();
    for (const d of deliveries) {
      const k = kinds.get(kind(d.name)) ?? { deliveries: 0, names: new Set<string>() };
      k.deliveries++;
      k.names.add(d.name);
      kinds.set(kind(d.name), k);
    }
    console.log(
      `event flood by kind: ${[...kinds].map(([k, v]) => `${k}: ${v.deliveries} deliveries for ${v.names.size} names`).join("; ")}`,
    );
    console.log(
      `event flood: ${deliveries.length} deliveries of ${messages} events (${conversionsOwn.length} for objects under the ` +
        `regular checkpoint, ${deliveries.length - conversionsOwn.length} for the source step); ${files.length} objects ` +
        `in the bucket at the end; all answered 204; 1 execution; function log lines about other events: 0`,
    );
    // The rate the conversion's own events arrive at, against what the function can answer (docs/operations.md,
    // "Event cost"): the busiest second, the mean over the conversion, and how long a delivery took.
    const perSecond = new Map<number, number>();
    for (const d of conversionsOwn) perSecond.set(Math.floor(d.at / 1000), (perSecond.get(Math.floor(d.at / 1000)) ?? 0) + 1);
    const times = conversionsOwn.map((d) => d.at);
    const span = (Math.max(...times) - Math.min(...times)) / 1000;
    const ms = deliveries.map((d) => d.ms).sort((a, b) => a - b);
    const q = (f: number) => ms[Math.min(ms.length - 1, Math.floor(f * ms.length))];
    console.log(
      `event flood rate: the conversion's ${conversionsOwn.length} events over ${span.toFixed(0)} s, ` +
        `${(conversionsOwn.length / span).toFixed(0)}/s on average, ${Math.max(...perSecond.values())} in the busiest second; ` +
        `delivery answered in ${q(0.5)} ms (median), ${q(0.99)} ms (99th percentile), ${ms[ms.length - 1]} ms (slowest); ` +
        `the commit marker's in ${marker[0]?.ms} ms`,
    );
  });
});
