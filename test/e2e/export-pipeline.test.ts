import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { PubSub } from "@google-cloud/pubsub";
import { ExecutionsClient, type protos } from "@google-cloud/workflows";
import { PassThroughClient } from "google-auth-library";
import { afterAll, beforeAll, describe, expect, inject, test, vi } from "vitest";
import type { ConversionEvent } from "../../src/cloud/api/events.js";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../src/hf/export.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import type { Running } from "../helpers/servers.js";
import { type Deployed, deployedSettings } from "./deployed.js";
import { printLogsOnFailure, startDeployedWorkflow, startFunction, startPubsub } from "./emulators.js";

vi.setConfig({ testTimeout: 300_000 });

// Issue 45 end to end on loopback, as pipeline.test.ts runs the conversion: terraform's hf_export evaluated from the
// module (test/e2e/deployed.ts: the function's environment, the export job's), a fuji-shaped step committed to a
// fake-gcs-server bucket, its commit event delivered to the real function (three times, two at once), which starts
// one workflow execution; the workflow converts the step, then exports it on the export job over its tasks (the job
// entry point as local processes, test/e2e/connector-hook.mjs) and publishes export.succeeded to the Pub/Sub emulator.
// The export is the CLI's byte for byte, and transformers loads it with the logits the CLI's export gives.

type Execution = protos.google.cloud.workflows.executions.v1.IExecution;

const PROJECT = "test-project";
const EXAMPLE = "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000";
const STEP = "runs/exp/step_00001000";
const HF_PYTHON = ".venv-hf/bin/python";
const TFVARS = { project_id: PROJECT, checkpoint_bucket: "ckpts", convert_into_checkpoint_bucket: true };
const HF_EXPORT = { steps: [1000], destination_template: "gs://{bucket}/{root}/hf/{step}", max_shard_size: "1000", tasks: 4 };

let work: string;
let pubsub: Running;
let workflows: Running;
let fn: Running;
let deployed: Deployed;
let executions: ExecutionsClient;
let reference: string;
const events: ConversionEvent[] = [];
let closeSubscription: () => Promise<void>;

beforeAll(async () => {
  work = scratch("e2e-export");
  process.env.METADATA_SERVER_DETECTION = "none";
  deployed = await deployedSettings(TFVARS, { hf_export: HF_EXPORT });
  pubsub = await startPubsub(join(work, "pubsub.log"));
  process.env.PUBSUB_EMULATOR_HOST = `127.0.0.1:${pubsub.port}`;
  const [topic] = await new PubSub({ projectId: PROJECT }).createTopic(deployed.functionEnv.ORBAX2REG_EVENTS_TOPIC as string);
  const [subscription] = await topic.createSubscription("e2e-export");
  subscription.on("message", (m) => {
    events.push(JSON.parse(m.data.toString()));
    m.ack();
  });
  closeSubscription = () => subscription.close();
  const emulators = {
    ORBAX2REG_GCS_ENDPOINT: inject("gcsEndpoint"),
    PUBSUB_EMULATOR_HOST: `127.0.0.1:${pubsub.port}`,
    GOOGLE_CLOUD_PROJECT: PROJECT,
    METADATA_SERVER_DETECTION: "none",
  };
  writeFileSync(join(work, "faults.json"), "[]");
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
  reference = join(work, "cli-export");
  await exportHf(EXAMPLE, reference, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: 1000 });
}, 240_000);

printLogsOnFailure(() => work, ["hooks.jsonl", "jobs.jsonl", "workflows.log", "function.log"]);

afterAll(async () => {
  await closeSubscription?.();
  await Promise.all([fn?.stop(), workflows?.stop(), pubsub?.stop()]);
  removeScratch();
});

/** POSTs the finalize event of an object, as Eventarc does (binary mode); the status. */
async function finalized(bucket: string, name: string): Promise<number> {
  const [metadata] = await emulatorStorage().bucket(bucket).file(name).getMetadata();
  const response = await fetch(fn.url, {
    method: "POST",
    headers: {
      "content-type": "application/json",
      "ce-specversion": "1.0",
      "ce-id": `${name}#${metadata.generation}`,
      "ce-type": "google.cloud.storage.object.v1.finalized",
      "ce-source": `//storage.googleapis.com/projects/_/buckets/${bucket}`,
      "ce-subject": `objects/${name}`,
      "ce-time": new Date().toISOString(),
    },
    body: JSON.stringify({ ...metadata, bucket, name }),
  });
  return response.status;
}

async function executionsOf(bucket: string): Promise<Execution[]> {
  const [all] = await executions.listExecutions({ parent: deployed.functionEnv.ORBAX2REG_WORKFLOW as string, view: "FULL" });
  return all.filter((e) => (JSON.parse(e.argument ?? "{}").source as string | undefined)?.startsWith(`gs://${bucket}/`));
}

async function finished(execution: Execution): Promise<Execution> {
  const deadline = Date.now() + 240_000;
  for (;;) {
    const [e] = await executions.getExecution({ name: execution.name as string });
    if (e.state !== "ACTIVE") return e;
    if (Date.now() > deadline) throw new Error(`${execution.name} still ACTIVE after 240 s`);
    await new Promise((r) => setTimeout(r, 250));
  }
}

async function download(bucket: string, prefix: string, dir: string): Promise<string> {
  mkdirSync(dir, { recursive: true });
  const [found] = await emulatorStorage()
    .bucket(bucket)
    .getFiles({ prefix: `${prefix}/` });
  for (const f of found) writeFileSync(join(dir, f.name.slice(prefix.length + 1)), (await f.download())[0]);
  return dir;
}

/** The float32 logits LlamaForCausalLM gives for a few tokens, loaded from each folder, and what loading left out. */
function logitsOf(dirs: string[]): { missing: number; unexpected: number; mismatched: number; maxAbsDiff: number }[] {
  const script = `
import json, sys, torch, transformers
tokens = torch.tensor([[1, 5, 9, 42, 300, 7]])
first = None
out = []
for d in sys.argv[1:]:
    m, info = transformers.LlamaForCausalLM.from_pretrained(d, dtype=torch.float32, output_loading_info=True)
    with torch.no_grad():
        logits = m(tokens).logits
    first = logits if first is None else first
    out.append({"missing": len(info["missing_keys"]), "unexpected": len(info["unexpected_keys"]),
                "mismatched": len(info["mismatched_keys"]), "maxAbsDiff": float((logits - first).abs().max())})
print(json.dumps(out))
`;
  const r = spawnSync(HF_PYTHON, ["-c", script, ...dirs], {
    encoding: "utf8",
    env: { ...process.env, HF_HUB_OFFLINE: "1", CUDA_VISIBLE_DEVICES: "", TRANSFORMERS_VERBOSITY: "error" },
  });
  if (r.status !== 0) throw new Error(r.stderr);
  return JSON.parse(r.stdout.trim().split("\n").at(-1) as string);
}

describe("the pipeline with hf_export", () => {
  test("a committed fuji step is converted and exported once, fanned out, under duplicate events: the CLI's export, byte for byte", async () => {
    const bucket = await newBucket("hf-train");
    await uploadDir(EXAMPLE, bucket, STEP);
    // AXLearn's step commit marker, last, as Orbax writes it (the example was saved without one).
    const marker = `${STEP}/commit_success.txt`;
    await emulatorStorage().bucket(bucket).file(marker).save("", { resumable: false });
    expect(await Promise.all([finalized(bucket, marker), finalized(bucket, marker)])).toEqual([204, 204]);
    expect(await finalized(bucket, marker)).toBe(204);

    const started = await executionsOf(bucket);
    expect(started).toHaveLength(1);
    const hf = `gs://${bucket}/runs/exp/hf/step_00001000`;
    expect(JSON.parse(started[0]?.argument as string)).toMatchObject({
      step: 1000,
      export: { destination: hf, tasks: 4, max_shard_size: "1000" },
    });
    const done = await finished(started[0] as Execution);
    expect(done.error?.payload ?? null).toBeNull();
    expect(done.state).toBe("SUCCEEDED");
    // 4 tasks asked, 2 planned: the example's 32k-token embedding is most of its bytes, and more would not finish sooner.
    expect(JSON.parse(done.result as string)).toMatchObject({ converted: true, export: { destination: hf, tasks: 2, shards: 8 } });

    const got = await download(bucket, "runs/exp/hf/step_00001000", join(work, "pipeline-export"));
    const names = readdirSync(reference).sort();
    expect(readdirSync(got).sort()).toEqual(names);
    for (const n of names) expect(Buffer.compare(readFileSync(join(got, n)), readFileSync(join(reference, n))), n).toBe(0);

    const deadline = Date.now() + 10_000;
    while (!events.some((e) => e.type === "export.succeeded" && e.destination === hf) && Date.now() < deadline)
      await new Promise((r) => setTimeout(r, 100));
    expect(events.filter((e) => e.destination === hf).map((e) => e.type)).toEqual(["export.succeeded"]);

    if (existsSync(HF_PYTHON)) {
      const [cli, pipeline] = logitsOf([reference, got]);
      expect(cli).toEqual({ missing: 0, unexpected: 0, mismatched: 0, maxAbsDiff: 0 });
      expect(pipeline).toEqual({ missing: 0, unexpected: 0, mismatched: 0, maxAbsDiff: 0 });
    }
  });
});
