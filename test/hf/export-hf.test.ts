// export-hf end to end through the CLI: a fuji-shaped Orbax step written by the real orbax (bench/gen_fuji.py),
// exported, read back here and compared with the source read by the zarr reader and mapped the plain way
// (fuji-tree.ts); a regular step as source; grouped QKV with an lm_head; refusals; resume; a gs:// destination;
// verify.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, statSync, unlinkSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { beforeAll, describe, expect, test } from "vitest";
import { parseHeader } from "../../src/hf/safetensors.js";
import { listArrays, readArray } from "../../src/orbax/arrays.js";
import { openStep } from "../../src/orbax/step.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { runCli } from "../helpers/cli.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { PYTHON } from "../helpers/paths.js";
import { tempDir } from "../helpers/tmp.js";
import { type Dims, expectedTensors, F32, fujiArrays, type HostArray, shardedChunks, writeRegularStep } from "./fuji-tree.js";

const GEN_DIR = "test/.generated/fuji-hf";
const GEN_DIMS = { layers: 3, dim: 256, heads: 2, headDim: 64, ffn: 512, vocab: 512 };
const STEP = `${GEN_DIR}/ckpt/step_00001000`;
const missingPython = existsSync(PYTHON) ? undefined : `${PYTHON} is absent (scripts/install.sh makes it)`;

/** Every tensor of an export directory, by name: dtype, shape and bytes. */
function readExport(dir: string): Map<string, { dtype: string; shape: number[]; bytes: Uint8Array }> {
  const index = JSON.parse(readFileSync(join(dir, "model.safetensors.index.json"), "utf8")) as { weight_map: Record<string, string> };
  const out = new Map<string, { dtype: string; shape: number[]; bytes: Uint8Array }>();
  for (const file of new Set(Object.values(index.weight_map))) {
    const data = readFileSync(join(dir, file));
    const h = parseHeader(data, file);
    for (const t of h.tensors)
      out.set(t.name, { dtype: t.dtype, shape: t.shape as number[], bytes: data.subarray(h.dataStart + t.begin, h.dataStart + t.end) });
  }
  return out;
}

/** The expected tensors of `arrays` as `dtype` bytes. */
function expectedBytes(arrays: HostArray[], dims: Dims, dtype: "BF16" | "F32") {
  const out = new Map<string, { shape: number[]; bytes: Uint8Array }>();
  for (const [name, t] of expectedTensors(arrays, dims)) {
    const f32 = new Uint8Array(t.data.buffer, t.data.byteOffset, t.data.byteLength);
    out.set(name, { shape: t.shape, bytes: dtype === "F32" ? f32 : castToBfloat16(f32, F32 as never) });
  }
  return out;
}

function expectSameTensors(dir: string, want: Map<string, { shape: number[]; bytes: Uint8Array }>, dtype: string) {
  const got = readExport(dir);
  expect([...got.keys()].sort()).toEqual([...want.keys()].sort());
  for (const [name, w] of want) {
    const g = got.get(name);
    expect(g?.dtype, name).toBe(dtype);
    expect(g?.shape, name).toEqual(w.shape);
    expect(Buffer.compare(g?.bytes as Uint8Array, w.bytes), name).toBe(0);
  }
}

const json = (stdout: string) => JSON.parse(stdout) as Record<string, unknown> & { shards: { name: string; written: boolean }[] };

describe.skipIf(missingPython !== undefined)("export-hf of a real Orbax step (bench/gen_fuji.py)", () => {
  let sourceArrays: HostArray[];

  beforeAll(async () => {
    // Cached by its dimensions: a rerun does nothing.
    const dims = `dim=${GEN_DIMS.dim},layers=${GEN_DIMS.layers},heads=${GEN_DIMS.heads},head_dim=${GEN_DIMS.headDim},ffn=${GEN_DIMS.ffn},vocab=${GEN_DIMS.vocab}`;
    const gen = spawnSync(PYTHON, ["bench/gen_fuji.py", GEN_DIR, "--dims", dims], { encoding: "utf8" });
    if (gen.status !== 0) throw new Error(`bench/gen_fuji.py failed: ${gen.stderr}`);
    // The source read whole by the zarr reader: an independent path from the export's streaming.
    const step = await openStep(STEP);
    sourceArrays = [];
    for await (const a of listArrays(step)) {
      if (!a.leaf.path.startsWith("model/")) continue;
      const parts: Uint8Array[] = [];
      for await (const slab of readArray(step, a)) parts.push(slab);
      const bytes = Buffer.concat(parts);
      sourceArrays.push({
        path: a.leaf.path,
        shape: [...a.meta.shape],
        data: new Float32Array(bytes.buffer, bytes.byteOffset, bytes.length / 4),
      });
    }
  }, 600_000);

  test("every tensor is the source's, mapped and rounded to bfloat16; config.json says the shapes; the index is last", async () => {
    const dest = join(tempDir("hf"), "out");
    const r = await runCli(["export-hf", STEP, dest, "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const report = json(r.stdout);
    expect(report).toMatchObject({ tensors: 3 * 9 + 2, fujiVersion: "v2", dtype: "bfloat16", committed: true });
    expect(report.skipped).toContain("prng_key");
    expect((report.configSources as Record<string, string>).rope_theta).toMatch(/fuji v2.s \(fuji.py ROPE_THETA\)/);
    expectSameTensors(dest, expectedBytes(sourceArrays, GEN_DIMS, "BF16"), "BF16");
    const config = JSON.parse(readFileSync(join(dest, "config.json"), "utf8"));
    expect(config).toMatchObject({
      hidden_size: 256,
      num_hidden_layers: 3,
      num_attention_heads: 2,
      num_key_value_heads: 2,
      head_dim: 64,
      intermediate_size: 512,
      vocab_size: 512,
      tie_word_embeddings: true,
    });
    // No fuji vocabulary has 512 rows: fuji's sentencepiece ids (decoder.py), and no tokenizer files.
    expect(JSON.parse(readFileSync(join(dest, "generation_config.json"), "utf8"))).toEqual({
      _from_model_config: true,
      bos_token_id: 1,
      eos_token_id: 1,
      pad_token_id: 0,
    });
    expect(report.tokenizer).toMatchObject({
      line: expect.stringMatching(/^none: a vocabulary of 512 is no fuji tokenizer's; add one with --tokenizer FILE/),
      files: [],
    });
    // The index was written after every shard (the commit marker).
    const mtime = (f: string) => statSync(join(dest, f)).mtimeMs;
    expect(mtime("model.safetensors.index.json")).toBeGreaterThanOrEqual(mtime("model-00001-of-00001.safetensors"));
  });

  test("float32 keeps the source's bits", async () => {
    const dest = join(tempDir("hf"), "out");
    const r = await runCli(["export-hf", STEP, dest, "--dtype", "float32", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    expectSameTensors(dest, expectedBytes(sourceArrays, GEN_DIMS, "F32"), "F32");
  });

  test("a regular step converted from it exports to the same bytes", async () => {
    const root = tempDir("hf");
    const conv = await runCli(["convert", STEP, join(root, "regular"), "--params-only", "--no-progress"]);
    expect(conv.code, conv.stderr).toBe(0);
    const [a, b] = [join(root, "a"), join(root, "b")];
    expect((await runCli(["export-hf", STEP, a, "--no-progress", "--max-shard-size", "2MB"])).code).toBe(0);
    const r = await runCli(["export-hf", join(root, "regular", "step_00001000"), b, "--no-progress", "--max-shard-size", "2MB"]);
    expect(r.code, r.stderr).toBe(0);
    const files = readdirSync(a).filter((f) => !f.startsWith(".") && (f.endsWith(".safetensors") || f.endsWith(".json")));
    expect(files.length).toBeGreaterThan(3);
    for (const f of files) expect(readFileSync(join(b, f)).equals(readFileSync(join(a, f))), f).toBe(true);
  });

  test("shards of at most --max-shard-size, named as transformers names them, every tensor listed once", async () => {
    const dest = join(tempDir("hf"), "out");
    expect((await runCli(["export-hf", STEP, dest, "--no-progress", "--max-shard-size", "1MB"])).code).toBe(0);
    const index = JSON.parse(readFileSync(join(dest, "model.safetensors.index.json"), "utf8"));
    const shards = readdirSync(dest).filter((f) => f.endsWith(".safetensors"));
    const n = shards.length;
    expect(shards.sort()).toEqual(
      Array.from({ length: n }, (_, i) => `model-${String(i + 1).padStart(5, "0")}-of-${String(n).padStart(5, "0")}.safetensors`),
    );
    const sizes = new Map<string, number>();
    for (const [name, t] of readExport(dest)) sizes.set(index.weight_map[name], (sizes.get(index.weight_map[name]) ?? 0) + t.bytes.length);
    // The embedding (512 x 256 bf16 = 256 KiB) and each gate/up/down (256 KiB) fit; no shard's tensors pass 1 MB.
    for (const [file, bytes] of sizes) expect(bytes, file).toBeLessThanOrEqual(1e6);
    expect(index.metadata.total_size).toBe([...sizes.values()].reduce((x, y) => x + y, 0));
  });

  test("a rerun after an interruption keeps the finished shards and writes the rest", async () => {
    const dest = join(tempDir("hf"), "out");
    expect((await runCli(["export-hf", STEP, dest, "--no-progress", "--max-shard-size", "1MB"])).code).toBe(0);
    // What a kill leaves: whole shards (each written atomically), some missing, and no index.
    const shards = readdirSync(dest)
      .filter((f) => f.endsWith(".safetensors"))
      .sort();
    unlinkSync(join(dest, "model.safetensors.index.json"));
    unlinkSync(join(dest, shards.at(-1) as string));
    const kept = statSync(join(dest, shards[0] as string)).mtimeMs;
    const r = await runCli(["export-hf", STEP, dest, "--no-progress", "--max-shard-size", "1MB", "--json"]);
    expect(r.code, r.stderr).toBe(0);
    const report = json(r.stdout);
    expect(report.resumed).toBe(true);
    expect(report.shards.filter((s) => s.written).map((s) => s.name)).toEqual([shards.at(-1)]);
    expect(statSync(join(dest, shards[0] as string)).mtimeMs).toBe(kept);
    expectSameTensors(dest, expectedBytes(sourceArrays, GEN_DIMS, "BF16"), "BF16");
    // Run again: nothing to do.
    const again = json((await runCli(["export-hf", STEP, dest, "--no-progress", "--max-shard-size", "1MB", "--json"])).stdout);
    expect(again.alreadyExported).toBe(true);
  });

  test("another export committed at the destination is replaced only with --force", async () => {
    const dest = join(tempDir("hf"), "out");
    expect((await runCli(["export-hf", STEP, dest, "--no-progress"])).code).toBe(0);
    const other = await runCli(["export-hf", STEP, dest, "--no-progress", "--dtype", "float32"]);
    expect(other.code).toBe(2);
    expect(other.stderr).toMatch(/holds another export.*--force/);
    const forced = await runCli(["export-hf", STEP, dest, "--no-progress", "--dtype", "float32", "--force"]);
    expect(forced.code, forced.stderr).toBe(0);
    expect(readExport(dest).get("model.norm.weight")?.dtype).toBe("F32");
  });

  test("verify passes an export, and names the tensor of a changed byte (exit 4)", async () => {
    const dest = join(tempDir("hf"), "out");
    expect((await runCli(["export-hf", STEP, dest, "--no-progress"])).code).toBe(0);
    const ok = await runCli(["verify", STEP, dest, "--no-progress"]);
    expect(ok.code, ok.stdout + ok.stderr).toBe(0);
    expect(ok.stdout).toMatch(/ 0 failed/);
    const file = join(dest, "model-00001-of-00001.safetensors");
    const data = readFileSync(file);
    const h = parseHeader(data, file);
    const t = h.tensors.find((x) => x.name === "model.layers.1.mlp.up_proj.weight") as { begin: number };
    data[h.dataStart + t.begin + 10] = (data[h.dataStart + t.begin + 10] as number) ^ 1;
    writeFileSync(file, data);
    const bad = await runCli(["verify", STEP, dest, "--no-progress"]);
    expect(bad.code).toBe(4);
    expect(bad.stdout).toMatch(/FAIL model\.layers\.1\.mlp\.up_proj\.weight: differs from the source \(BF16 byte 10 /);
  });

  test("a gs:// source exports to the same bytes as the local step", async () => {
    const bucket = await newBucket("hfsrc");
    await uploadDir(STEP, bucket, "ckpt/step_00001000");
    const root = tempDir("hf");
    expect((await runCli(["export-hf", STEP, join(root, "local"), "--no-progress"])).code).toBe(0);
    const r = await runCli(["export-hf", `gs://${bucket}/ckpt`, join(root, "remote"), "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const shard = "model-00001-of-00001.safetensors";
    expect(readFileSync(join(root, "remote", shard)).equals(readFileSync(join(root, "local", shard)))).toBe(true);
  });

  test("a gs:// destination: shards uploaded, the index last, verify reads it back", async () => {
    const bucket = await newBucket("hf");
    const dest = `gs://${bucket}/exports/fuji`;
    const r = await runCli(["export-hf", STEP, dest, "--no-progress", "--max-shard-size", "1MB"]);
    expect(r.code, r.stderr).toBe(0);
    const [files] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "exports/fuji/" });
    const names = files.map((f) => f.name.slice("exports/fuji/".length));
    expect(names).toContain("model.safetensors.index.json");
    expect(names).toContain("config.json");
    expect(names.filter((n) => n.endsWith(".safetensors")).length).toBeGreaterThan(1);
    const v = await runCli(["verify", STEP, dest, "--no-progress"]);
    expect(v.code, v.stdout + v.stderr).toBe(0);
  });
});

describe("export-hf of grouped-QKV trees and trees that are not fuji's", () => {
  const V3 = { layers: 2, dim: 32, heads: 4, kvHeads: 2, headDim: 8, ffn: 48, vocab: 40, lmHead: true };
  /** fsdp-like chunks: weights split in 4 on their model-dim axis (which spans all layers), the rest whole. */
  const chunks = (a: HostArray) =>
    a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
      ? shardedChunks(a.shape, a.path.endsWith("linear2/weight") ? 2 : 1, 4)
      : [...a.shape];

  test("a grouped-QKV step with its own lm_head: q/k/v split at [H, H + K], untied, every value the source's", async () => {
    const root = tempDir("hf");
    const arrays = fujiArrays(V3, 5);
    writeRegularStep(join(root, "step_00000007"), arrays, chunks);
    const dest = join(root, "hf");
    const r = await runCli(["export-hf", root, dest, "--dtype", "float32", "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    expect(json(r.stdout)).toMatchObject({ sourceKind: "regular", step: 7, fujiVersion: "v3" });
    expectSameTensors(dest, expectedBytes(arrays, V3, "F32"), "F32");
    expect(JSON.parse(readFileSync(join(dest, "config.json"), "utf8"))).toMatchObject({
      num_attention_heads: 4,
      num_key_value_heads: 2,
      tie_word_embeddings: false,
      rope_theta: 5e5,
    });
  });

  test("a weight cut in 64 chunks per layer (as a large fsdp mesh cuts it): one array's decoders open at a time, no chunk decoded twice", async () => {
    const root = tempDir("hf");
    const dims = { layers: 4, dim: 64, heads: 4, headDim: 16, ffn: 128, vocab: 64 };
    const arrays = fujiArrays(dims, 9);
    // Every layer weight cut in 64 on its model axis: 5 arrays x 64 chunks, each chunk spanning the 4 layers.
    writeRegularStep(join(root, "step"), arrays, (a) =>
      a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
        ? shardedChunks(a.shape, a.path.endsWith("qkv_proj/weight") || a.path.endsWith("linear2/weight") ? 2 : 1, 64)
        : [...a.shape],
    );
    const dest = join(root, "hf");
    // 130 MiB: 65 decoders (all but 16 MiB, 1.75 MiB each). Made layer by layer across the five weights, the
    // 320 chunks would all be open at once, and over the cap re-read from their start layer after layer.
    const r = await runCli([
      "export-hf",
      join(root, "step"),
      dest,
      "--memory",
      "130",
      "--max-shard-size",
      "100KB",
      "--json",
      "--no-progress",
    ]);
    expect(r.code, r.stderr).toBe(0);
    const report = json(r.stdout);
    expect(report).toMatchObject({ decodersNeeded: 64, openDecoders: 64, chunkRereads: 0 });
    expect(report.peakOpenDecoders as number).toBeLessThanOrEqual(64);
    expect(r.stderr).toBe("");
    expectSameTensors(dest, expectedBytes(arrays, dims, "BF16"), "BF16");
    // Shards hold runs of one array's layers; transformers finds each tensor through the index.
    expect(report.shards.length).toBeGreaterThan(3);
    const v = await runCli(["verify", join(root, "step"), dest, "--no-progress"]);
    expect(v.code, v.stdout + v.stderr).toBe(0);
  });

  describe("a weight cut in more chunks per layer than --memory keeps decoders for", () => {
    const dims = { layers: 4, dim: 64, heads: 4, headDim: 16, ffn: 128, vocab: 64 };
    const arrays = fujiArrays(dims, 11);
    const step = (root: string) => {
      writeRegularStep(join(root, "step"), arrays, (a) =>
        a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
          ? shardedChunks(a.shape, a.path.endsWith("qkv_proj/weight") || a.path.endsWith("linear2/weight") ? 2 : 1, 64)
          : [...a.shape],
      );
      return join(root, "step");
    };
    // 30 MiB, the least: the streaming engine's plan keeps 8 decoders; the spill's one group holds all 64 chunks a
    // layer, each 2 KiB decoded whole (spill.test.ts has groups of fewer chunks, put together from scratch objects).
    const args = ["--memory", "30", "--max-shard-size", "100KB", "--json", "--no-progress"];

    test("is exported through the spill, straight from its small chunks all open at once: the same bytes, no chunk decoded twice, no warning, no scratch left", async () => {
      const root = tempDir("hf");
      const dest = join(root, "hf");
      const r = await runCli(["export-hf", step(root), dest, ...args]);
      expect(r.code, r.stderr).toBe(0);
      expect(r.stderr).toBe("");
      const report = json(r.stdout);
      expect(report).toMatchObject({ decodersNeeded: 64, openDecoders: 64, spilledArrays: 5, chunkRereads: 0 });
      expect(report.peakOpenDecoders as number).toBeLessThanOrEqual(64);
      expectSameTensors(dest, expectedBytes(arrays, dims, "BF16"), "BF16");
      expect(readdirSync(dest).filter((n) => n.includes("spill") || n.includes(".tmp-"))).toEqual([]);
    });

    test("says what its open chunks hold at their decoded size, within --memory (not 64 decoders of 1.75 MiB)", async () => {
      const root = tempDir("hf");
      const r = await runCli(["export-hf", step(root), join(root, "hf"), ...args]);
      expect(r.code, r.stderr).toBe(0);
      const held = json(r.stdout).decoderBytes as number;
      expect(held).toBeGreaterThan(0);
      expect(held).toBeLessThanOrEqual(30 * 2 ** 20);
    });

    test("to a gs:// destination: scratch objects under it, none left; the shards are the local export's", async () => {
      const root = tempDir("hf");
      const source = step(root);
      expect((await runCli(["export-hf", source, join(root, "local"), ...args])).code).toBe(0);
      const bucket = await newBucket("hfspill");
      const r = await runCli(["export-hf", source, `gs://${bucket}/hf`, ...args]);
      expect(r.code, r.stderr).toBe(0);
      expect(json(r.stdout)).toMatchObject({ spilledArrays: 5, chunkRereads: 0 });
      const [files] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "hf/" });
      const names = files.map((f) => f.name.slice("hf/".length));
      expect(names.filter((n) => n.includes("spill"))).toEqual([]);
      for (const f of files.filter((x) => x.name.endsWith(".safetensors"))) {
        const [bytes] = await f.download();
        expect(bytes.equals(readFileSync(join(root, "local", f.name.slice("hf/".length)))), f.name).toBe(true);
      }
    });

    for (const [how, memory] of [
      ["spilling too", "30"],
      ["not spilling (all decoders fit)", "336"],
    ] as const) {
      test(`scratch objects an interrupted export left are removed by the next, ${how}`, async () => {
        const root = tempDir("hf");
        const dest = join(root, "hf");
        mkdirSync(dest, { recursive: true });
        writeFileSync(join(dest, ".orbax2reg-spill.0.3"), "left by a killed export");
        const r = await runCli(["export-hf", step(root), dest, "--memory", memory, "--json", "--no-progress"]);
        expect(r.code, r.stderr).toBe(0);
        expect(json(r.stdout).spilledArrays).toBe(memory === "30" ? 5 : 0);
        expect(readdirSync(dest).filter((n) => n.includes("spill"))).toEqual([]);
      });
    }
  });

  test("--memory below what export-hf needs is refused with one line (exit 2), nothing written", async () => {
    const root = tempDir("hf");
    writeRegularStep(join(root, "step"), fujiArrays({ layers: 1, dim: 8, heads: 1, headDim: 8, ffn: 8, vocab: 4 }), (a) => [...a.shape]);
    const r = await runCli(["export-hf", join(root, "step"), join(root, "hf"), "--memory", "1", "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr.trim().split("\n")).toHaveLength(1);
    expect(r.stderr).toMatch(/--memory 1\.0 MiB is below the 30 MiB export-hf needs/);
    expect(existsSync(join(root, "hf"))).toBe(false);
  });

  for (const [what, change, message] of [
    [
      "an unknown leaf under model/",
      (a: HostArray[]) => [
        ...a,
        { path: "model/decoder/transformer/repeat/layer/feed_forward/linear2/bias", shape: [2, 32], data: new Float32Array(64) },
      ],
      /linear2\/bias: unknown leaf/,
    ],
    [
      "a missing leaf",
      (a: HostArray[]) => a.filter((x) => !x.path.endsWith("feed_forward/norm/scale")),
      /feed_forward\/norm\/scale: missing/,
    ],
    [
      "a shape that does not fit",
      (a: HostArray[]) => a.map((x) => (x.path.endsWith("output_norm/scale") ? { ...x, shape: [31], data: new Float32Array(31) } : x)),
      /output_norm\/scale: shape \[31\] does not fit \[hidden\] \[32\]/,
    ],
  ] as const) {
    test(`${what} is refused with one line naming it (exit 2), nothing written`, async () => {
      const root = tempDir("hf");
      writeRegularStep(join(root, "step"), change(fujiArrays(V3)), (a) => [...a.shape]);
      const dest = join(root, "hf");
      const r = await runCli(["export-hf", join(root, "step"), dest, "--no-progress"]);
      expect(r.code).toBe(2);
      expect(r.stderr.trim().split("\n")).toHaveLength(1);
      expect(r.stderr).toMatch(message);
      expect(existsSync(dest)).toBe(false);
    });
  }
});
