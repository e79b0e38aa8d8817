import { spawnSync } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, test, vi } from "vitest";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../src/hf/export.js";
import { INDEX_NAME } from "../../src/hf/shards.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { moduleDashboard } from "../helpers/dashboard-json.js";
import { downloadDir, emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { AXLEARN_FUJI_ROOT, HF_PYTHON } from "../helpers/paths.js";
import { expectSameFiles } from "../helpers/same-files.js";
import type { Running } from "../helpers/servers.js";
import { deployedSettings } from "./deployed.js";
import { printLogsOnFailure, startFunction } from "./emulators.js";
import { type Execution, type Pipeline, PROJECT, startPipeline } from "./pipeline-harness.js";

vi.setConfig({ testTimeout: 300_000 });

// Issue 45 end to end on loopback, as pipeline.test.ts runs the conversion (the same harness: pipeline-harness.ts):
// terraform's hf_export evaluated from the module (test/e2e/deployed.ts: the function's environment, the export job's),
// a step committed to a fake-gcs-server bucket over TLS, its commit event delivered to the real function, which starts
// one workflow execution on the Workflows emulator; the workflow converts the step when convert_every_n_steps asks for
// it, then exports it on the export job over its tasks (the job entry point as local processes, connector-hook.mjs,
// Cloud Run's task retries included) and publishes export.succeeded or export.failed to the Pub/Sub emulator.
//
// Two deployments share the emulators, told apart by their function (the workflow's and the jobs' settings are the
// same, checked below): the example's, which exports step 1000 alone (convert_every_n_steps = 3000) in 1 kB shards,
// and the fuji step's, which converts and exports it in 50 kB shards; both keep the last 2 exports and, of the older
// ones, one every 300 steps. What test/workflows/export.test.ts proves on the workflow alone is not repeated here.

const EXAMPLE = "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000";
// A fuji v3-shaped LM (grouped-query attention, untied head) saved by AXLearn's own OrbaxCheckpointer as a trainer
// saves a step, optimizer state included (test/fixtures-gen/axlearn_fuji.py); only where AXLearn is installed.
const FUJI = `${AXLEARN_FUJI_ROOT}/grouped-untied/checkpoints/step_00001000`;
const STEP = "runs/exp/step_00001000";
const HF = "runs/exp/hf";
const TFVARS = { project_id: PROJECT, checkpoint_bucket: "ckpts", convert_into_checkpoint_bucket: true };
const HF_EXPORT = {
  steps: [1000],
  destination_template: "gs://{bucket}/{root}/hf/{step}",
  tasks: 4,
  keep_last_n: 2,
  keep_every_n_steps: 300,
};
const EXAMPLE_SHARD = 1000;
const FUJI_SHARD = 50_000;

let work: string;
let p: Pipeline;
/** The function of the deployment that converts and exports the fuji step. */
let fujiFn: Running;
/** What `orbax2reg export-hf` writes for the example and for the fuji step, at their deployments' shard sizes. */
let reference: string;
let fujiReference: string | undefined;

beforeAll(async () => {
  work = scratch("e2e-export");
  const deployed = await deployedSettings(
    { ...TFVARS, convert_every_n_steps: 3000 },
    { hf_export: { ...HF_EXPORT, max_shard_size: String(EXAMPLE_SHARD) } },
  );
  const fujiDeployed = await deployedSettings(TFVARS, { hf_export: { ...HF_EXPORT, max_shard_size: String(FUJI_SHARD) } });
  // One workflow and one set of jobs serve both: only what the function asks for differs.
  expect(fujiDeployed.workflowEnv).toEqual(deployed.workflowEnv);
  expect(fujiDeployed.jobEnv).toEqual(deployed.jobEnv);
  p = await startPipeline(work, deployed, "e2e-export");
  fujiFn = await startFunction({ ...fujiDeployed.functionEnv, ...p.endpoints }, join(work, "function-fuji.log"));
  reference = join(work, "cli-export");
  await exportHf(EXAMPLE, reference, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: EXAMPLE_SHARD });
  if (existsSync(FUJI)) {
    fujiReference = join(work, "cli-export-fuji");
    await exportHf(FUJI, fujiReference, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: FUJI_SHARD });
  }
}, 240_000);

printLogsOnFailure(() => work, ["hooks.jsonl", "jobs.jsonl", "workflows.log", "function.log", "function-fuji.log"]);

afterAll(async () => {
  await Promise.all([fujiFn?.stop(), p?.stop()]);
  removeScratch();
});

/** Uploads a step to runs/exp/step_00001000 of a new bucket, then AXLearn's commit marker (the saves have none). */
async function committed(source: string): Promise<{ bucket: string; marker: string; destination: string; hf: string }> {
  const bucket = await newBucket("hf-train");
  await uploadDir(source, bucket, STEP);
  const marker = `${STEP}/commit_success.txt`;
  await emulatorStorage().bucket(bucket).file(marker).save("", { resumable: false });
  return { bucket, marker, destination: `gs://${bucket}/runs/exp/regular`, hf: `gs://${bucket}/${HF}/step_00001000` };
}

/** The one execution the step's commit event started, once it has ended. */
async function theExecution(bucket: string): Promise<Execution> {
  const started = await p.executionsOf(bucket);
  expect(started).toHaveLength(1);
  return p.finished(started[0] as Execution, 240_000);
}

async function names(bucket: string, prefix: string): Promise<string[]> {
  const [found] = await emulatorStorage().bucket(bucket).getFiles({ prefix });
  return found.map((f) => f.name).sort();
}

const exportEvents = (hf: string) => p.events.filter((e) => e.event.destination === hf).map((e) => e.event.type);

async function waitForExportEvent(hf: string): Promise<void> {
  const deadline = Date.now() + 10_000;
  while (!p.events.some((e) => e.event.destination === hf && e.event.type.startsWith("export.")) && Date.now() < deadline)
    await new Promise((r) => setTimeout(r, 100));
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
  test.skipIf(!existsSync(FUJI))(
    "a fuji step committed during training is converted and exported once under duplicate events, fanned out over 4 tasks: the CLI's export byte for byte, the same logits in transformers",
    async () => {
      const { bucket, marker, hf } = await committed(FUJI);
      const deliveries = [p.finalized(bucket, marker, fujiFn.url), p.finalized(bucket, marker, fujiFn.url)];
      expect(await Promise.all(deliveries)).toEqual([204, 204]);
      expect(await p.finalized(bucket, marker, fujiFn.url)).toBe(204);

      const [started] = await p.executionsOf(bucket);
      expect(JSON.parse(started?.argument as string)).toMatchObject({
        step: 1000,
        export: { destination: hf, tasks: 4, max_shard_size: String(FUJI_SHARD) },
      });
      const done = await theExecution(bucket);
      expect(done.error?.payload ?? null).toBeNull();
      expect(done.state).toBe("SUCCEEDED");
      // 4 tasks asked, 4 planned: the weights are spread over the layers, the vocabulary small.
      expect(JSON.parse(done.result as string)).toMatchObject({ converted: true, export: { destination: hf, tasks: 4, shards: 17 } });
      const tasks = p
        .hookCalls(JSON.parse(started?.argument as string).destination)
        .filter((c) => c.connector === "task" && c.job === "export-shards");
      expect(tasks.map((c) => c.task).sort()).toEqual([0, 1, 2, 3]);

      const got = await downloadDir(bucket, `${HF}/step_00001000`, join(work, "pipeline-export-fuji"));
      expectSameFiles(got, fujiReference as string);
      await waitForExportEvent(hf);
      expect(exportEvents(hf)).toEqual(["export.succeeded"]);

      if (existsSync(HF_PYTHON)) {
        const [cli, pipeline] = logitsOf([fujiReference as string, got]);
        expect(cli).toEqual({ missing: 0, unexpected: 0, mismatched: 0, maxAbsDiff: 0 });
        expect(pipeline).toEqual({ missing: 0, unexpected: 0, mismatched: 0, maxAbsDiff: 0 });
      }
    },
  );

  test("a task killed while it writes a shard is run again: it keeps the shards written, writes the rest, leaves no partial object; the CLI's export byte for byte", async () => {
    const { bucket, marker, destination, hf } = await committed(EXAMPLE);
    // Task 1 of 2 writes shards 2-8; its first attempt dies inside its third, model-00004-of-00008.
    p.setFaults([{ destination, phase: "export-shards", fault: "kill", task: 1, inShard: 3, times: 1 }]);
    try {
      expect(await p.finalized(bucket, marker)).toBe(204);
      const done = await theExecution(bucket);
      expect(done.error?.payload ?? null).toBeNull();
      expect(JSON.parse(done.result as string)).toMatchObject({ converted: false, export: { tasks: 2, shards: 8 } });
    } finally {
      p.setFaults([]);
    }
    const attempts = p.hookCalls(destination).filter((c) => c.connector === "task" && c.job === "export-shards" && c.task === 1);
    expect(attempts.map((c) => [c.attempt, c.code === 0])).toEqual([
      [0, false],
      [1, true],
    ]);
    expect(p.jobLines().filter((l) => l.message === "killed while writing a shard (injected)")).toEqual([
      expect.objectContaining({ shard: "model-00004-of-00008.safetensors" }),
    ]);
    const retried = p.jobLines().filter((l) => l.message === "shards written" && l.export === hf && l.task === 1);
    expect(retried).toEqual([expect.objectContaining({ written: 5, kept: 2 })]);
    expectSameFiles(await downloadDir(bucket, `${HF}/step_00001000`, join(work, "pipeline-export-killed")), reference);
    await waitForExportEvent(hf);
    expect(exportEvents(hf)).toEqual(["export.succeeded"]);
  });

  test("an export that fails for good fails once: one export.failed, the permanent ERROR line the alert matches, no index, no retry", async () => {
    const { bucket, marker, destination, hf } = await committed(EXAMPLE);
    // The step's largest data file cut short after the commit: the shards reading it find a short read.
    const damaged = `${STEP}/state/ocdbt.process_0/d/9287c370f2fbcb5e16264b31a3771849`;
    const file = emulatorStorage().bucket(bucket).file(damaged);
    await file.save((await file.download())[0].subarray(0, 1000), { resumable: false });

    expect(await p.finalized(bucket, marker)).toBe(204);
    const done = await theExecution(bucket);
    expect(done.state).toBe("FAILED");
    const message = new RegExp(`gs://${bucket}/${damaged}.*short read`);
    expect(JSON.parse(done.error?.payload as string)).toMatchObject({ tags: ["PermanentError"], message: expect.stringMatching(message) });
    const runs = p.hookCalls(destination).filter((c) => c.connector === "googleapis.run.v2.projects.locations.jobs.run");
    expect(runs.map((c) => c.phase)).toEqual(["plan", "export-begin", "export-shards"]);
    // Each task ran once: a failing one reported its failure and exited 0, so Cloud Run did not run it again.
    const attempts = p.hookCalls(destination).filter((c) => c.connector === "task" && c.job === "export-shards");
    expect(attempts.map((a) => [a.task, a.attempt, a.code]).sort()).toEqual([
      [0, 0, 0],
      [1, 0, 0],
    ]);
    const errors = p.jobLines().filter((l) => l.severity === "ERROR" && String(l.message).includes(`gs://${bucket}/`));
    expect(errors.length).toBeGreaterThan(0);
    await waitForExportEvent(hf);
    expect(exportEvents(hf)).toEqual(["export.failed"]);
    expect(p.events.find((e) => e.event.destination === hf)?.event.error).toMatch(message);
    expect(await names(bucket, `${HF}/step_00001000/${INDEX_NAME}`)).toEqual([]);

    // The lines alerts.tf's export alert matches as they arrive: every term of its query on the job's payload holds.
    const { alertPolicies } = await moduleDashboard(['hf_export={steps = [1000], destination_template = "gs://regular/{root}/hf/{step}"}']);
    const query = alertPolicies.export_failed?.log_match as string;
    const payloadTerms = [...query.matchAll(/jsonPayload\.(\w+)=("[^"]*"|true|false)/g)].map((m) => [
      m[1] as string,
      JSON.parse(m[2] as string),
    ]);
    // A bool field compares with "true"/"false" in any letter case (the Logging query language's "Values and
    // conversions": https://cloud.google.com/logging/docs/view/logging-query-language).
    expect(payloadTerms).toEqual(expect.arrayContaining([["permanent", "true"]]));
    expect(query).toContain("severity>=ERROR");
    const holds = (field: unknown, v: unknown) => (typeof field === "boolean" ? String(field) === String(v).toLowerCase() : field === v);
    for (const e of errors) {
      for (const [k, v] of payloadTerms) expect(holds(e[k], v), `${k}=${JSON.stringify(v)} of ${JSON.stringify(e)}`).toBe(true);
      expect(e).toMatchObject({ phase: "export-shards", message: expect.stringMatching(message) });
    }
  });

  test("export retention deletes the older exports the rule drops once a new one commits, keeps the last 2 and one every 300 steps, never a conversion's output or an uncommitted export", async () => {
    const { bucket, marker, hf } = await committed(EXAMPLE);
    // Exports of earlier steps as the pipeline leaves them (the CLI's, byte for byte), one not committed yet (no
    // index), and a converted step beside them.
    for (const step of ["step_00000100", "step_00000200", "step_00000300", "step_00000400"])
      await uploadDir(reference, bucket, `${HF}/${step}`);
    await uploadDir(reference, bucket, `${HF}/step_00000500`, (k) => k === INDEX_NAME);
    await uploadDir("test/fixtures/axlearn-regular-sample/step_00000100", bucket, "runs/exp/regular/step_00000100");
    // A converted step among the exports too (a destination_template pointing there): by its number the rule would
    // drop it, but it is no export (no model.safetensors.index.json).
    await uploadDir("test/fixtures/axlearn-regular-sample/step_00000100", bucket, `${HF}/step_00000150`);
    const regular = await names(bucket, "runs/exp/regular/");
    const convertedAmongExports = await names(bucket, `${HF}/step_00000150/`);
    const uncommitted = await names(bucket, `${HF}/step_00000500/`);

    expect(await p.finalized(bucket, marker)).toBe(204);
    const done = await theExecution(bucket);
    expect(done.state).toBe("SUCCEEDED");
    // keep_last_n = 2 keeps 1000 and 400; keep_every_n_steps = 300 walks the older ones from the oldest (AXLearn's
    // rule, src/cloud/job/retention.ts): 100 kept, 200 and 300 less than 300 steps after it, deleted.
    const folders = new Set((await names(bucket, `${HF}/`)).map((n) => n.slice(HF.length + 1).split("/")[0]));
    expect([...folders].sort()).toEqual(["step_00000100", "step_00000150", "step_00000400", "step_00000500", "step_00001000"]);
    expect(await names(bucket, `${HF}/step_00000500/`)).toEqual(uncommitted);
    expect(await names(bucket, `${HF}/step_00000150/`)).toEqual(convertedAmongExports);
    expect(await names(bucket, "runs/exp/regular/")).toEqual(expect.arrayContaining(regular));
    expect(p.jobLines().filter((l) => l.message === "export retention applied" && l.export === hf)).toEqual([
      expect.objectContaining({ pruned: [200, 300] }),
    ]);
  });
});
