// An export shared by several tasks (issue 45): beginExport plans runs of whole shards, exportShards writes a
// task's shards (any order, in any process, at once), finalizeExport checks every shard and commits. The shards
// are export-hf's own, byte for byte; a commit before every shard is written, or a task of an export that is no
// longer the one begun, is refused. On the fuji v2-shaped example step that AXLearn saved (shards of 1 kB: its
// 32k-token embedding is most of its bytes) and on a small fuji tree written as a regular step with each stacked
// weight in one chunk spanning every layer (shards of 20 kB, several within each stacked array).
import { spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { ConflictError, NotFoundError } from "../../src/errors.js";
import { beginExport, DEFAULT_EXPORT_MEMORY, exportHf, exportShards, finalizeExport } from "../../src/hf/export.js";
import { RECORD_NAME } from "../../src/hf/record.js";
import { INDEX_NAME, planTaskRuns } from "../../src/hf/shards.js";
import { tempDir } from "../helpers/tmp.js";
import { fujiArrays, writeRegularStep } from "./fuji-tree.js";

const EXAMPLE = "test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000";
const DIMS = { layers: 4, dim: 64, heads: 4, kvHeads: 2, headDim: 16, ffn: 128, vocab: 256 };
const OPTIONS = { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: 20e3 };
let SOURCE = "";

beforeAll(() => {
  SOURCE = join(tempDir("hf-fan-src"), "step_00000100");
  writeRegularStep(SOURCE, fujiArrays(DIMS, 5), (a) => [...a.shape], 100);
});

/** Every file of a folder, by name. */
function files(dir: string): Map<string, Buffer> {
  return new Map(
    readdirSync(dir)
      .sort()
      .map((n) => [n, readFileSync(join(dir, n))]),
  );
}

function expectSameFolder(got: string, want: string) {
  const g = files(got);
  const w = files(want);
  expect([...g.keys()]).toEqual([...w.keys()]);
  for (const [name, bytes] of w) expect(Buffer.compare(g.get(name) as Buffer, bytes), name).toBe(0);
}

/** The CLI's single-process export of the example step. */
async function reference(source = SOURCE, options = OPTIONS): Promise<string> {
  const dir = join(tempDir("hf-fan"), "one");
  await exportHf(source, dir, options);
  return dir;
}

describe("planTaskRuns", () => {
  test("cuts shards into contiguous runs whose largest is as small as can be", () => {
    expect(planTaskRuns([5, 5, 5, 5, 5, 1], 3)).toEqual([0, 2, 4]);
    expect(planTaskRuns([9, 1, 1, 1, 1, 1, 1, 1, 1, 1], 2)).toEqual([0, 1]);
  });

  test("gives every task a shard: fewer tasks when there are fewer shards", () => {
    expect(planTaskRuns([5, 5], 4)).toEqual([0, 1]);
    expect(planTaskRuns([1, 1, 1, 9], 4)).toEqual([0, 1, 2, 3]);
    expect(planTaskRuns([7], 1)).toEqual([0]);
  });
});

describe("an export fanned out over tasks", () => {
  for (const [what, source, options] of [
    ["the example step AXLearn saved", () => EXAMPLE, { ...OPTIONS, maxShardSize: 1000 }],
    ["a regular step", () => SOURCE, OPTIONS],
  ] as const) {
    test(`3 tasks, run in reverse order, then finalize: the same files as export-hf's, byte for byte (${what})`, async () => {
      const one = await reference(source(), options);
      const dest = join(tempDir("hf-fan"), "three");
      const began = await beginExport(source(), dest, { ...options, tasks: 3 });
      expect(began.shards).toBeGreaterThanOrEqual(6);
      expect(began.tasks).toHaveLength(3);
      expect(began.tasks.flatMap((t) => t.shards)).toEqual(readdirSync(one).filter((n) => n.endsWith(".safetensors")));
      expect(existsSync(join(dest, INDEX_NAME))).toBe(false);
      for (const task of [...began.tasks].reverse())
        expect(await exportShards(source(), dest, options, task.shards)).toMatchObject({
          written: task.shards,
          kept: [],
          bytes: task.bytes,
        });
      const result = await finalizeExport(source(), dest, options);
      expect(result).toMatchObject({ alreadyExported: false, totalSize: began.totalSize });
      expectSameFolder(dest, one);
    });
  }

  test("a task starting inside a stacked array counts the chunks it decodes again to reach its first layer", async () => {
    const dest = join(tempDir("hf-fan"), "rereads");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 3 });
    const rereads = [];
    for (const task of began.tasks) rereads.push((await exportShards(SOURCE, dest, OPTIONS, task.shards)).chunkRereads);
    // The first task starts at the first tensor; the others each inside one stacked array (one chunk each here).
    expect(rereads).toEqual([0, 1, 1]);
  });

  test("tasks at once in one process: the same files, and each task's bytes as planned", async () => {
    const one = await reference();
    const dest = join(tempDir("hf-fan"), "four");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 4 });
    const written = await Promise.all(began.tasks.map((t) => exportShards(SOURCE, dest, OPTIONS, t.shards)));
    expect(written.map((w) => w.bytes)).toEqual(began.tasks.map((t) => t.bytes));
    await finalizeExport(SOURCE, dest, OPTIONS);
    expectSameFolder(dest, one);
  });

  test("one task of the whole export reports no re-read chunk", async () => {
    const dest = join(tempDir("hf-fan"), "one-task");
    const [task] = (await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 1 })).tasks;
    expect((await exportShards(SOURCE, dest, OPTIONS, task?.shards ?? [])).chunkRereads).toBe(0);
  });

  test("finalize before every shard is written names the missing shard and writes no index", async () => {
    const dest = join(tempDir("hf-fan"), "partial");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 3 });
    await exportShards(SOURCE, dest, OPTIONS, began.tasks[0]?.shards ?? []);
    const missing = began.tasks[1]?.shards[0] as string;
    const e = await finalizeExport(SOURCE, dest, OPTIONS).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(NotFoundError);
    expect((e as NotFoundError).retryable).toBe(false);
    expect((e as Error).message).toContain(`shard ${missing} is missing`);
    expect(readdirSync(dest).filter((n) => n === INDEX_NAME || n === "config.json")).toEqual([]);
  });

  test("a shard of the wrong size is named, and nothing committed", async () => {
    const dest = join(tempDir("hf-fan"), "wrong");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 2 });
    for (const t of began.tasks) await exportShards(SOURCE, dest, OPTIONS, t.shards);
    const victim = began.tasks[1]?.shards[0] as string;
    writeFileSync(join(dest, victim), readFileSync(join(dest, victim)).subarray(0, 1000));
    const e = await finalizeExport(SOURCE, dest, OPTIONS).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConflictError);
    expect((e as Error).message).toContain(`shard ${victim} is not the planned one`);
    expect(existsSync(join(dest, INDEX_NAME))).toBe(false);
  });

  test("a task of an export no longer the one begun (another began since) is refused, nothing written", async () => {
    const dest = join(tempDir("hf-fan"), "stale");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 2 });
    // Another export (float32) begins at the destination while a bfloat16 task is still to run.
    await beginExport(SOURCE, dest, { ...OPTIONS, dtype: "float32", tasks: 2 });
    const e = await exportShards(SOURCE, dest, OPTIONS, began.tasks[0]?.shards ?? []).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConflictError);
    expect((e as Error).message).toContain("another export began here since");
    expect(readdirSync(dest).filter((n) => n.endsWith(".safetensors"))).toEqual([]);
  });

  test("a task with no export begun at the destination is refused", async () => {
    const dest = tempDir("hf-fan");
    const e = await exportShards(SOURCE, dest, OPTIONS, ["model-00001-of-00005.safetensors"]).catch((x: unknown) => x);
    expect(e).toBeInstanceOf(ConflictError);
    expect((e as Error).message).toContain(`${RECORD_NAME} is missing: no export was begun here`);
  });

  test("a killed task's temporary file does not survive its rerun, and the rerun writes its shards", async () => {
    const one = await reference();
    const dest = join(tempDir("hf-fan"), "killed");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 2 });
    const task = began.tasks[1]?.shards ?? [];
    // What a task killed mid-shard leaves: its shard's temporary file, named after a process now gone.
    const gone = spawnSync(process.execPath, ["-e", ""]).pid as number;
    const temp = `${task[0]}.tmp-${gone.toString(16).padStart(8, "0")}0001`;
    writeFileSync(join(dest, temp), "half a shard");
    expect((await exportShards(SOURCE, dest, OPTIONS, task)).written).toEqual(task);
    expect(existsSync(join(dest, temp))).toBe(false);
    await exportShards(SOURCE, dest, OPTIONS, began.tasks[0]?.shards ?? []);
    await finalizeExport(SOURCE, dest, OPTIONS);
    expectSameFolder(dest, one);
  });

  test("a task rerun keeps its shards in place; a finalize rerun commits nothing new", async () => {
    const dest = join(tempDir("hf-fan"), "rerun");
    const began = await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 2 });
    for (const t of began.tasks) await exportShards(SOURCE, dest, OPTIONS, t.shards);
    const again = await exportShards(SOURCE, dest, OPTIONS, began.tasks[0]?.shards ?? []);
    expect(again).toMatchObject({ written: [], kept: began.tasks[0]?.shards, bytes: 0 });
    expect((await finalizeExport(SOURCE, dest, OPTIONS)).alreadyExported).toBe(false);
    expect((await finalizeExport(SOURCE, dest, OPTIONS)).alreadyExported).toBe(true);
    expect((await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 2 })).alreadyExported).toBe(true);
  });
});
