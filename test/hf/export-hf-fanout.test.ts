// An export shared by several tasks (issue 45): beginExport plans runs of whole shards, exportShards writes a
// task's shards (any order, in any process, at once), finalizeExport checks every shard and commits. The shards
// are export-hf's own, byte for byte; a commit before every shard is written, or a task of an export that is no
// longer the one begun, is refused. On the fuji v2-shaped example step that AXLearn saved (shards of 1 kB: its
// 32k-token embedding is most of its bytes) and on a small fuji tree written as a regular step with each stacked
// weight in one chunk spanning every layer (shards of 20 kB, several within each stacked array).
import { spawn, spawnSync } from "node:child_process";
import { existsSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { ConflictError, NotFoundError } from "../../src/errors.js";
import { beginExport, DEFAULT_EXPORT_MEMORY, exportHf, exportShards, finalizeExport } from "../../src/hf/export.js";
import { RECORD_NAME } from "../../src/hf/record.js";
import { INDEX_NAME, planTaskRuns } from "../../src/hf/shards.js";
import { runBinAsync, runCli } from "../helpers/cli.js";
import { tempDir } from "../helpers/tmp.js";
import { fujiArrays, shardedChunks, writeRegularStep } from "./fuji-tree.js";

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

  test("no more runs than make the largest smaller: fewer tasks when there are fewer shards, or no gain", () => {
    expect(planTaskRuns([5, 5], 4)).toEqual([0, 1]);
    expect(planTaskRuns([1, 1, 1, 9], 4)).toEqual([0, 3]);
    expect(planTaskRuns([7], 1)).toEqual([0]);
  });

  test("counts what a run starting inside an array decodes again: cuts move to where an array starts", () => {
    // Shards 1-3 continue the array shard 0 starts (prefixes 4, 8, 12); shard 4 starts the next array.
    expect(planTaskRuns([4, 4, 4, 4, 4, 4], 2)).toEqual([0, 3]);
    expect(planTaskRuns([4, 4, 4, 4, 4, 4], 2, [0, 4, 8, 12, 0, 4])).toEqual([0, 4]);
  });
});

describe("an export fanned out over tasks", () => {
  for (const [what, source, options] of [
    ["the example step AXLearn saved", () => EXAMPLE, { ...OPTIONS, maxShardSize: 1000 }],
    ["a regular step", () => SOURCE, OPTIONS],
  ] as const) {
    test(`tasks (3 asked for), run in reverse order, then finalize: the same files as export-hf's, byte for byte (${what})`, async () => {
      const one = await reference(source(), options);
      const dest = join(tempDir("hf-fan"), "three");
      const began = await beginExport(source(), dest, { ...options, tasks: 3 });
      expect(began.shards).toBeGreaterThanOrEqual(6);
      // At most 3: the example's embedding is most of its bytes, so a third task would not finish sooner.
      expect(began.tasks.length).toBeGreaterThanOrEqual(2);
      expect(began.tasks.length).toBeLessThanOrEqual(3);
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

  test("tasks at once through the spill (weights cut in 64 chunks a layer, --memory 30): scratch apart, the same files, none left", async () => {
    const root = tempDir("hf-fan");
    const source = join(root, "step");
    writeRegularStep(source, fujiArrays({ layers: 4, dim: 64, heads: 4, headDim: 16, ffn: 128, vocab: 64 }, 11), (a) =>
      a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
        ? shardedChunks(a.shape, a.path.endsWith("qkv_proj/weight") || a.path.endsWith("linear2/weight") ? 2 : 1, 64)
        : [...a.shape],
    );
    const options = { memoryBytes: 30 * 2 ** 20, maxShardSize: 100e3 };
    const one = await reference(source, options);
    expect((await finalizeExport(source, one, options)).spilledArrays).toBe(5);
    const dest = join(root, "three");
    const began = await beginExport(source, dest, { ...options, tasks: 3 });
    await Promise.all(began.tasks.map((t) => exportShards(source, dest, options, t.shards)));
    await finalizeExport(source, dest, options);
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
    expect((e as Error).message).toContain(`${missing}: shard missing: its task has not written it`);
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
    expect((e as Error).message).toContain(`${victim}: shard not the planned one (1000 bytes`);
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

  test("a task process killed mid-shard leaves its temporary file, which its rerun removes; the export is export-hf's", async () => {
    const root = tempDir("hf-fan");
    const source = join(root, "step");
    // A 32k-token embedding of width 512: a 32 MiB shard, long enough to write to be killed in the middle.
    writeRegularStep(source, fujiArrays({ layers: 2, dim: 512, heads: 4, kvHeads: 2, headDim: 128, ffn: 1024, vocab: 32768 }, 13), (a) => [
      ...a.shape,
    ]);
    const options = { memoryBytes: DEFAULT_EXPORT_MEMORY, maxShardSize: 4e6 };
    const one = await reference(source, options);
    const dest = join(root, "killed");
    const [task] = (await beginExport(source, dest, { ...options, tasks: 1 })).tasks;
    const child = spawn(process.execPath, [
      "bin/orbax2reg.js",
      ...["export-hf", source, dest, "--max-shard-size", "4000000", "--task-index", "0", "--task-count", "1", "--no-progress"],
    ]);
    const exited = new Promise((done) => child.once("exit", done));
    let temp: string | undefined;
    for (let i = 0; i < 3000 && temp === undefined; i++) {
      temp = readdirSync(dest).find((n) => n.includes(".tmp-"));
      if (temp === undefined) await new Promise((r) => setTimeout(r, 5));
    }
    child.kill("SIGKILL");
    await exited;
    expect(temp, "a temporary file while the task wrote").toBeDefined();
    expect(existsSync(join(dest, temp as string))).toBe(true);
    expect((await exportShards(source, dest, options, task?.shards ?? [])).written.length).toBeGreaterThan(0);
    expect(readdirSync(dest).filter((n) => n.includes(".tmp-"))).toEqual([]);
    await finalizeExport(source, dest, options);
    expectSameFolder(dest, one);
  });

  test("a task stopped by its signal stops between bands with the signal's reason; its rerun finishes the shards", async () => {
    const dest = join(tempDir("hf-fan"), "stopped");
    const [task] = (await beginExport(SOURCE, dest, { ...OPTIONS, tasks: 1 })).tasks;
    const shards = task?.shards ?? [];
    const stop = new AbortController();
    const reason = new Error("told to stop");
    let tensors = 0;
    const e = await exportShards(
      SOURCE,
      dest,
      { ...OPTIONS, signal: stop.signal, onTensor: () => ++tensors === 12 && stop.abort(reason) },
      shards,
    ).catch((x: unknown) => x);
    expect(e).toBe(reason);
    const written = readdirSync(dest).filter((n) => n.endsWith(".safetensors"));
    expect(written.length).toBeGreaterThan(0);
    expect(written.length).toBeLessThan(shards.length);
    // The shard it was writing is not there, nor a part of it.
    expect(readdirSync(dest).filter((n) => n.includes(".tmp-"))).toEqual([]);
    const rerun = await exportShards(SOURCE, dest, OPTIONS, shards);
    expect(rerun.kept).toEqual(written);
    expect([...rerun.kept, ...rerun.written].sort()).toEqual([...shards]);
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

describe("export-hf --begin, --task-index, --finalize (an export shared by several machines)", () => {
  const cli = (dest: string, ...extra: string[]) => [
    "export-hf",
    SOURCE,
    dest,
    "--max-shard-size",
    String(OPTIONS.maxShardSize),
    "--no-progress",
    ...extra,
  ];

  test("--begin prints each task's shards; tasks as processes at once, then --finalize: export-hf's files", async () => {
    const one = await reference();
    const dest = join(tempDir("hf-fan"), "cli");
    const begun = await runCli(cli(dest, "--begin", "--task-count", "3"));
    expect(begun.code, begun.stderr).toBe(0);
    expect(begun.stdout).toMatch(/^begun: \d+ shard\(s\), .* in 3 task\(s\)\ntask 0: model-00001-of-\d+\.safetensors \.\. /);
    const tasks = await Promise.all(
      [0, 1, 2].map((i) => runBinAsync([...cli(dest, "--task-index", String(i), "--task-count", "3"), "--json"])),
    );
    for (const t of tasks) expect(t.code, t.stderr).toBe(0);
    expect(tasks.flatMap((t) => JSON.parse(t.stdout).written)).toEqual(readdirSync(one).filter((n) => n.endsWith(".safetensors")));
    expect(existsSync(join(dest, INDEX_NAME))).toBe(false);
    const done = await runCli(cli(dest, "--finalize"));
    expect(done.code, done.stderr).toBe(0);
    expect(done.stdout).toMatch(/^checked \d+ shard\(s\), .*\ncommitted .*model\.safetensors\.index\.json\n$/m);
    expectSameFolder(dest, one);
  });

  test("--task-index with no export begun is refused in one line (exit 2)", async () => {
    const dest = tempDir("hf-fan");
    const r = await runCli(cli(dest, "--task-index", "0", "--task-count", "2"));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/is missing: no export was begun here/);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
  });

  test("--finalize before every task is done names the missing shard (exit 2), no index", async () => {
    const dest = join(tempDir("hf-fan"), "early");
    expect((await runCli(cli(dest, "--begin", "--task-count", "2"))).code).toBe(0);
    expect((await runCli(cli(dest, "--task-index", "0", "--task-count", "2"))).code).toBe(0);
    const r = await runCli(cli(dest, "--finalize"));
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/model-\d+-of-\d+\.safetensors: shard missing/);
    expect(existsSync(join(dest, INDEX_NAME))).toBe(false);
  });

  for (const [flags, message] of [
    [["--task-index", "0"], "--task-index needs --task-count"],
    [["--begin"], "--begin needs --task-count"],
    [["--task-count", "2"], "--task-count goes with --begin or --task-index"],
    [["--task-index", "2", "--task-count", "2"], "--task-index 2 is not below --task-count 2"],
    [["--begin", "--finalize", "--task-count", "2"], "--begin and --finalize are steps of their own: give one"],
  ] as const) {
    test(`${flags.join(" ")} is refused: ${message}`, async () => {
      const dest = join(tempDir("hf-fan"), "flags");
      const r = await runCli(cli(dest, ...flags));
      expect(r.code).toBe(2);
      expect(r.stderr).toContain(message);
      expect(existsSync(dest)).toBe(false);
    });
  }
});
