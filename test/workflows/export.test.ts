import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { DEFAULT_EXPORT_MEMORY, exportHf } from "../../src/hf/export.js";
import { INDEX_NAME } from "../../src/hf/shards.js";
import { writeFaults } from "../helpers/faults-file.js";
import { downloadDir, emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { expectSameFiles } from "../helpers/same-files.js";
import { fujiArrays, writeRegularStep } from "../hf/fuji-tree.js";
import { convertWorkflowSuite, PROJECT, runWorkflow } from "./emulator.js";

// workflows/convert.yaml's Hugging Face export (issue 45) on the Workflows emulator: the argument's "export" runs
// export-begin, one export-shards execution of as many tasks as it planned, and export-finalize, on the export job
// (its phase an args override), after the conversion or, with "convert": false, instead of it. Cloud Run, GCS and
// Pub/Sub are played by test/e2e/connector-hook.mjs: real job processes against fake-gcs-server. The step is the
// fuji v2-shaped example AXLearn saved; 1 kB shards make it 8 of them, which the export plans in 2 tasks however many
// are asked (its 32k-token embedding is most of its bytes: more tasks would not finish sooner). A regular fuji step of
// a 256-token vocabulary, 19 shards of 20 kB, is planned in 4.

const EXAMPLE = "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000";
const STEP = "runs/exp/checkpoints/step_00001000";
const TOPIC = `projects/${PROJECT}/topics/orbax2reg-events`;
const SHARD = 1000;

const { emulator, file, lines, stage } = convertWorkflowSuite("wf-export", { groups: 2, eventsTopic: TOPIC });
let work: string;
let reference: string;

beforeAll(async () => {
  work = file(".");
  // What `orbax2reg export-hf` writes for the same step and shard size: the pipeline's must be these bytes.
  reference = file("cli-export");
  await exportHf(EXAMPLE, reference, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: SHARD });
}, 120_000);

interface HookCall {
  connector: string;
  phase?: string;
  destination?: string;
  taskCount?: number;
  job?: string;
  task?: number;
  attempt?: number;
  code?: number;
}
const runs = (destination: string, phase: string) =>
  lines<HookCall>("hooks.jsonl").filter(
    (c) => c.connector === "googleapis.run.v2.projects.locations.jobs.run" && c.destination === destination && c.phase === phase,
  );
const events = (bucket: string) =>
  lines<{ event: { type: string; destination: string; bytes: number | null } }>("events.jsonl")
    .map((m) => m.event)
    .filter((e) => e.destination.startsWith(`gs://${bucket}/`));

async function setUp(faults: (destination: string) => unknown[] = () => []) {
  const staged = await stage("export", EXAMPLE, STEP, faults);
  // The example was saved without AXLearn's step commit marker, which the conversion's plan requires.
  await emulatorStorage().bucket(staged.bucket).file(`${STEP}/commit_success.txt`).save("", { resumable: false });
  return { ...staged, hf: `gs://${staged.bucket}/runs/exp/hf/step_00001000` };
}

const converted = async (bucket: string) =>
  (await emulatorStorage().bucket(bucket).file("runs/exp/regular/step_00001000/index").exists())[0];

describe("convert.yaml with an export", () => {
  test("converts the step, then exports it over the tasks its plan has: export-hf's files byte for byte, the index last", async () => {
    const { bucket, destination, hf, argument } = await setUp();
    const run = await runWorkflow(
      emulator,
      "convert",
      { ...argument, export: { destination: hf, max_shard_size: SHARD, tasks: 4 } },
      240_000,
    );
    expect(run.error).toBeUndefined();
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toMatchObject({ converted: true, export: { destination: hf, tasks: 2, shards: 8, already_exported: false } });
    expect(await converted(bucket)).toBe(true);
    expect(runs(destination, "export-begin").map((c) => c.taskCount)).toEqual([1]);
    expect(runs(destination, "export-shards").map((c) => c.taskCount)).toEqual([2]);
    expect(runs(destination, "export-finalize").map((c) => c.taskCount)).toEqual([1]);
    expectSameFiles(await downloadDir(bucket, "runs/exp/hf/step_00001000", join(work, `got-${bucket}`)), reference);
    expect(events(bucket).map((e) => [e.type, e.destination])).toEqual([
      ["conversion.succeeded", destination],
      ["export.succeeded", hf],
    ]);
  }, 300_000);

  test("a regular fuji step exported alone fans out over 4 tasks, one execution: export-hf's files byte for byte", async () => {
    const local = join(work, "regular", "step_00000100");
    writeRegularStep(
      local,
      fujiArrays({ layers: 4, dim: 64, heads: 4, kvHeads: 2, headDim: 16, ffn: 128, vocab: 256 }, 5),
      (a) => [...a.shape],
      100,
    );
    const want = join(work, "regular-cli-export");
    await exportHf(local, want, { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: 20e3 });
    const bucket = await newBucket("export");
    await uploadDir(local, bucket, "runs/reg/step_00000100");
    const destination = `gs://${bucket}/runs/reg/regular`;
    const hf = `gs://${bucket}/runs/reg/hf/step_00000100`;
    writeFaults(file("faults.json"), []);
    const run = await runWorkflow(
      emulator,
      "convert",
      {
        source: `gs://${bucket}/runs/reg/step_00000100`,
        destination,
        convert: false,
        export: { destination: hf, max_shard_size: 20e3, tasks: 4 },
      },
      240_000,
    );
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toMatchObject({ export: { tasks: 4, shards: 19 } });
    expect(runs(destination, "export-shards").map((c) => c.taskCount)).toEqual([4]);
    const tasks = lines<HookCall>("hooks.jsonl").filter(
      (c) => c.connector === "task" && c.job === "export-shards" && c.destination === destination,
    );
    expect(tasks.map((c) => c.task).sort()).toEqual([0, 1, 2, 3]);
    expectSameFiles(await downloadDir(bucket, "runs/reg/hf/step_00000100", join(work, `got-${bucket}`)), want);
  }, 300_000);

  test("convert false exports the step straight from its Orbax source and converts nothing", async () => {
    const { bucket, destination, hf, argument } = await setUp();
    const run = await runWorkflow(
      emulator,
      "convert",
      { ...argument, convert: false, export: { destination: hf, max_shard_size: SHARD, tasks: 2 } },
      240_000,
    );
    expect(run.state).toBe("SUCCEEDED");
    expect(run.result).toMatchObject({ converted: false, export: { tasks: 2, shards: 8 } });
    expect(runs(destination, "convert-group")).toEqual([]);
    expect(runs(destination, "finalize")).toEqual([]);
    expect(await converted(bucket)).toBe(false);
    expectSameFiles(await downloadDir(bucket, "runs/exp/hf/step_00001000", join(work, `got-${bucket}`)), reference);
    expect(events(bucket).map((e) => e.type)).toEqual(["export.succeeded"]);
  }, 300_000);

  test("a second run of an exported step finds it committed and writes no shard", async () => {
    const { destination, hf, argument } = await setUp();
    const asked = { ...argument, convert: false, export: { destination: hf, max_shard_size: SHARD, tasks: 2 } };
    expect((await runWorkflow(emulator, "convert", asked, 240_000)).state).toBe("SUCCEEDED");
    const again = await runWorkflow(emulator, "convert", asked, 240_000);
    expect(again.state).toBe("SUCCEEDED");
    expect(again.result).toMatchObject({ export: { already_exported: true } });
    expect(runs(destination, "export-begin")).toHaveLength(2);
    expect(runs(destination, "export-shards")).toHaveLength(1);
    expect(runs(destination, "export-finalize")).toHaveLength(1);
  }, 300_000);

  test("a task killed while it writes is run again by Cloud Run; the export is still export-hf's", async () => {
    const { bucket, destination, hf, argument } = await setUp((d) => [
      { destination: d, phase: "export-shards", fault: "kill", task: 1, afterMs: 300, times: 1 },
    ]);
    const run = await runWorkflow(
      emulator,
      "convert",
      { ...argument, convert: false, export: { destination: hf, max_shard_size: SHARD, tasks: 4 } },
      240_000,
    );
    expect(run.state).toBe("SUCCEEDED");
    const task1 = lines<HookCall>("hooks.jsonl").filter(
      (c) => c.connector === "task" && c.job === "export-shards" && c.destination === destination && c.task === 1,
    );
    expect(task1.map((c) => [c.attempt, c.code === 0])).toEqual([
      [0, false],
      [1, true],
    ]);
    expectSameFiles(await downloadDir(bucket, "runs/exp/hf/step_00001000", join(work, `got-${bucket}`)), reference);
  }, 300_000);

  test("a permanent failure fails the export once, with export.failed and no index", async () => {
    const { bucket, destination, hf, argument } = await setUp();
    // A tokenizer file that does not exist: export-begin reports it permanent, and the workflow does not retry.
    const run = await runWorkflow(
      emulator,
      "convert",
      {
        ...argument,
        convert: false,
        export: { destination: hf, max_shard_size: SHARD, tokenizer: `gs://${bucket}/nowhere/tokenizer.model` },
      },
      240_000,
    );
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["PermanentError"], message: expect.stringMatching(/^export begin: /) });
    expect(runs(destination, "export-begin")).toHaveLength(1);
    expect(runs(destination, "export-shards")).toEqual([]);
    expect(events(bucket).map((e) => e.type)).toEqual(["export.failed"]);
    expect((await emulatorStorage().bucket(bucket).file(`runs/exp/hf/step_00001000/${INDEX_NAME}`).exists())[0]).toBe(false);
  }, 300_000);

  test("an export alone whose plan job fails announces export.failed for the export's folder, not conversion.failed", async () => {
    const { bucket, destination, hf, argument } = await setUp();
    // A dtype the plan job refuses: it fails for good before export-begin runs.
    const run = await runWorkflow(
      emulator,
      "convert",
      { ...argument, convert: false, export: { destination: `${hf}/`, dtype: "int8" } },
      240_000,
    );
    expect(run.state).toBe("FAILED");
    expect(run.error).toMatchObject({ tags: ["PermanentError"], message: expect.stringMatching(/^plan: .*export\.dtype/) });
    expect(runs(destination, "export-begin")).toEqual([]);
    expect(events(bucket).map((e) => [e.type, e.destination])).toEqual([["export.failed", hf]]);
  }, 300_000);

  test("a run that converts and whose plan job fails still announces conversion.failed", async () => {
    const { bucket, destination, hf, argument } = await setUp();
    const run = await runWorkflow(emulator, "convert", { ...argument, export: { destination: hf, dtype: "int8" } }, 240_000);
    expect(run.state).toBe("FAILED");
    expect(events(bucket).map((e) => [e.type, e.destination])).toEqual([["conversion.failed", destination]]);
  }, 300_000);
});
