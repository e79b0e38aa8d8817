// import-hf: the round trip (a fuji tree written as a regular step, exported by export-hf, imported back: every
// array the source's, bit for bit in float32; the import exported again: the same shard bytes), and the layout
// AXLearn reads (index last, .zarray, one chunk per layer).
import { spawn } from "node:child_process";
import { randomBytes } from "node:crypto";
import { existsSync, mkdirSync, readdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { decompressExact } from "../../src/codecs/zstd.js";
import { exportHf } from "../../src/hf/export.js";
import { importHf, toF32Bits } from "../../src/hf/import.js";
import { parseHeader } from "../../src/hf/safetensors.js";
import { parseIndex } from "../../src/regular/index-file.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { chunkGrid, product } from "../../src/zarr/metadata.js";
import { runCli } from "../helpers/cli.js";
import { emulatorStorage, newBucket, uploadDir } from "../helpers/gcs.js";
import { tempDir } from "../helpers/tmp.js";
import { type Dims, F32, fujiArrays, type HostArray, writeRegularStep } from "./fuji-tree.js";

const MHA: Dims = { layers: 3, dim: 32, heads: 4, headDim: 8, ffn: 48, vocab: 40 };
const GQA: Dims = { layers: 2, dim: 32, heads: 4, kvHeads: 2, headDim: 8, ffn: 40, vocab: 24, lmHead: true };

/** A regular array's elements (C order, `itemSize` bytes each), its chunks put together, edge padding dropped. */
export function readRegularArray(stepDir: string, path: string): { dtype: string; shape: number[]; bytes: Uint8Array } {
  const dir = join(stepDir, "gda", path);
  const z = JSON.parse(readFileSync(join(dir, ".zarray"), "utf8")) as { shape: number[]; chunks: number[]; dtype: string };
  const item = z.dtype === "<f4" ? 4 : 2;
  const out = new Uint8Array(product(z.shape) * item);
  const grid = chunkGrid({ shape: z.shape, chunkShape: z.chunks });
  const r = z.shape.length;
  for (let g = 0; g < product(grid); g++) {
    const index: number[] = [];
    for (let d = r - 1, rem = g; d >= 0; d--) {
      index[d] = rem % (grid[d] as number);
      rem = Math.floor(rem / (grid[d] as number));
    }
    const chunk = decompressExact(readFileSync(join(dir, index.join("."))), product(z.chunks) * item, path);
    for (let e = 0; e < product(z.chunks); e++) {
      let src = 0;
      let inside = true;
      for (let d = 0, rem = e, stride = product(z.chunks); d < r; d++) {
        stride /= z.chunks[d] as number;
        const c = (index[d] as number) * (z.chunks[d] as number) + Math.floor(rem / stride);
        rem %= stride;
        if (c >= (z.shape[d] as number)) inside = false;
        src = src * (z.shape[d] as number) + c;
      }
      if (inside) out.set(chunk.subarray(e * item, (e + 1) * item), src * item);
    }
  }
  return { dtype: z.dtype, shape: z.shape, bytes: out };
}

/** How many bytes of a regular array's edge chunks lie outside the array (its padding) and are not zero. */
function nonzeroPadding(stepDir: string, path: string): number {
  const dir = join(stepDir, "gda", path);
  const z = JSON.parse(readFileSync(join(dir, ".zarray"), "utf8")) as { shape: number[]; chunks: number[]; dtype: string };
  const item = z.dtype === "<f4" ? 4 : 2;
  const grid = chunkGrid({ shape: z.shape, chunkShape: z.chunks });
  let nonzero = 0;
  for (let g = 0; g < product(grid); g++) {
    const index: number[] = [];
    for (let d = z.shape.length - 1, rem = g; d >= 0; d--) {
      index[d] = rem % (grid[d] as number);
      rem = Math.floor(rem / (grid[d] as number));
    }
    const chunk = decompressExact(readFileSync(join(dir, index.join("."))), product(z.chunks) * item, path);
    for (let e = 0; e < product(z.chunks); e++) {
      let inside = true;
      for (let d = 0, rem = e, stride = product(z.chunks); d < z.shape.length; d++) {
        stride /= z.chunks[d] as number;
        if ((index[d] as number) * (z.chunks[d] as number) + Math.floor(rem / stride) >= (z.shape[d] as number)) inside = false;
        rem %= stride;
      }
      if (!inside) for (let k = 0; k < item; k++) if (chunk[e * item + k] !== 0) nonzero++;
    }
  }
  return nonzero;
}

/** The .zarray of a stacked layer array of an imported step. */
const zarray = (step: string, leaf: string) =>
  JSON.parse(readFileSync(join(step, "gda/model/decoder/transformer/repeat/layer", leaf, ".zarray"), "utf8")) as { chunks: number[] };

const bytesOf = (a: HostArray) => new Uint8Array(a.data.buffer, a.data.byteOffset, a.data.byteLength);

/** A fuji tree as a regular step, exported by export-hf in `dtype`: the import's source. */
async function exported(dims: Dims, dtype: "float32" | "bfloat16", seed = 3, maxShardSize?: number) {
  const root = tempDir("imp");
  const arrays = fujiArrays(dims, seed);
  writeRegularStep(join(root, "fuji", "step_00000007"), arrays, (a) => [...a.shape]);
  const hf = join(root, "hf");
  await exportHf(join(root, "fuji", "step_00000007"), hf, {
    dtype,
    memoryBytes: 64 * 2 ** 20,
    tokenizer: "none",
    ...(maxShardSize === undefined ? {} : { maxShardSize }),
  });
  return { root, arrays, hf };
}

/** Every tensor of a safetensors folder, by name. */
function readTensors(dir: string): Map<string, { dtype: string; shape: number[]; bytes: Uint8Array }> {
  const out = new Map<string, { dtype: string; shape: number[]; bytes: Uint8Array }>();
  for (const file of readdirSync(dir).filter((f) => f.endsWith(".safetensors"))) {
    const data = readFileSync(join(dir, file));
    const h = parseHeader(data, file, ["F32", "BF16", "F16"]);
    for (const t of h.tensors)
      out.set(t.name, { dtype: t.dtype, shape: [...t.shape], bytes: data.subarray(h.dataStart + t.begin, h.dataStart + t.end) });
  }
  return out;
}

/** float16 bits as the float32 they are, the plain way. */
function f16Value(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const e = (h >> 10) & 0x1f;
  const m = h & 0x3ff;
  return sign * (e === 0 ? m * 2 ** -24 : (1 + m / 1024) * 2 ** (e - 15));
}

function expectArraysEqual(stepDir: string, arrays: readonly HostArray[], dtype: "float32" | "bfloat16") {
  const index = parseIndex(readFileSync(join(stepDir, "index"), "utf8"), "index");
  expect(index.entries.map(([p]) => p).sort()).toEqual(arrays.map((a) => a.path).sort());
  for (const a of arrays) {
    const got = readRegularArray(stepDir, a.path);
    expect(got.shape, a.path).toEqual(a.shape);
    const want = dtype === "float32" ? bytesOf(a) : castToBfloat16(bytesOf(a), F32 as never);
    expect(Buffer.compare(got.bytes, want), a.path).toBe(0);
  }
}

describe("import-hf of an export-hf export gives back the fuji tree", () => {
  for (const [name, dims] of [
    ["multi-head, tied", MHA],
    ["grouped, untied", GQA],
  ] as const)
    test(`${name}: every array bit-exact in float32`, async () => {
      const { root, arrays, hf } = await exported(dims, "float32");
      const r = await importHf(hf, join(root, "ckpt"), {});
      expect(r.dims).toMatchObject({ layers: dims.layers, heads: dims.heads, kvHeads: dims.kvHeads ?? dims.heads, tied: !dims.lmHead });
      expectArraysEqual(join(root, "ckpt", "step_00000000"), arrays, "float32");
    });

  test("multi-head, cut in chunks of at most 100 elements (edge chunks padded): every array bit-exact", async () => {
    const { root, arrays, hf } = await exported(MHA, "float32", 8);
    const r = await importHf(hf, join(root, "ckpt"), { maxChunkElements: 100 });
    expect(r.chunks).toBeGreaterThan(100);
    const step = join(root, "ckpt", "step_00000000");
    // linear1_0's 48 rows of 32 in 16 chunks of 3; each head of q, k and v (32 x 8) a chunk.
    expect(zarray(step, "feed_forward/linear1_0/weight").chunks).toEqual([1, 32, 3]);
    expect(zarray(step, "self_attention/attention/i_proj/i_proj/qkv_proj/weight").chunks).toEqual([1, 1, 32, 1, 8]);
    expectArraysEqual(step, arrays, "float32");
  });

  test("grouped, chunks of 3 heads across the q/k and k/v boundaries (4 q, 2 k, 2 v heads): every array bit-exact", async () => {
    const { root, arrays, hf } = await exported(GQA, "float32", 9);
    await importHf(hf, join(root, "ckpt"), { maxChunkElements: 700 });
    const step = join(root, "ckpt", "step_00000000");
    expect(zarray(step, "self_attention/attention/i_proj/i_proj/qkv_proj/weight").chunks).toEqual([1, 32, 3, 8]);
    expectArraysEqual(step, arrays, "float32");
  });

  test("edge chunks are padded with zeros, though each is made in a buffer an earlier chunk filled", async () => {
    const { root, arrays, hf } = await exported(GQA, "float32", 10);
    await importHf(hf, join(root, "ckpt"), { maxChunkElements: 700 });
    const step = join(root, "ckpt", "step_00000000");
    // 8 heads of q, k and v in chunks of 3: the last of each layer holds 2; the feed-forward's 40 rows in 21s.
    expect(zarray(step, "self_attention/attention/i_proj/i_proj/qkv_proj/weight").chunks).toEqual([1, 32, 3, 8]);
    for (const a of arrays) expect(nonzeroPadding(step, a.path), a.path).toBe(0);
  });

  test("a bfloat16 export imported as bfloat16 is the source cast", async () => {
    const { root, arrays, hf } = await exported(GQA, "bfloat16");
    await importHf(hf, join(root, "ckpt"), { dtype: "bfloat16", step: 5 });
    expectArraysEqual(join(root, "ckpt", "step_00000005"), arrays, "bfloat16");
  });

  test("export-hf of the import writes the same shard bytes as the first export", async () => {
    const { root, hf } = await exported(GQA, "bfloat16");
    await importHf(hf, join(root, "ckpt"), { dtype: "bfloat16" });
    const again = join(root, "hf2");
    await exportHf(join(root, "ckpt", "step_00000000"), again, { dtype: "bfloat16", memoryBytes: 64 * 2 ** 20, tokenizer: "none" });
    for (const f of readdirSync(hf).filter((n) => n.endsWith(".safetensors") || n === "model.safetensors.index.json"))
      expect(Buffer.compare(readFileSync(join(hf, f)), readFileSync(join(again, f))), f).toBe(0);
  });
});

describe("the step AXLearn reads", () => {
  test("model/ leaves only, index in jax's flatten order, stacked arrays chunked one layer a chunk", async () => {
    const { root, hf } = await exported(MHA, "float32");
    await importHf(hf, join(root, "ckpt"), {});
    const step = join(root, "ckpt", "step_00000000");
    const text = readFileSync(join(step, "index"), "utf8");
    const { step: n, entries } = parseIndex(text, "index");
    expect(n).toBe(0);
    const paths = entries.map(([p]) => p);
    expect(paths.every((p) => p.startsWith("model/"))).toBe(true);
    expect(paths).toEqual([...paths].sort());
    const z = JSON.parse(
      readFileSync(join(step, "gda/model/decoder/transformer/repeat/layer/feed_forward/linear1_0/weight/.zarray"), "utf8"),
    );
    expect(z).toEqual({
      chunks: [1, 32, 48],
      compressor: { id: "zstd", level: 1 },
      dimension_separator: ".",
      dtype: "<f4",
      fill_value: null,
      filters: null,
      order: "C",
      shape: [3, 32, 48],
      zarr_format: 2,
    });
    expect(existsSync(join(step, "gda/model/decoder/transformer/repeat/layer/feed_forward/linear1_0/weight/2.0.0"))).toBe(true);
  });
});

describe("sources", () => {
  test("elements at any byte offset (a Buffer view into a pool, as a read may return) convert as aligned ones", () => {
    const f32 = new Float32Array([1.5, -2.25, 3e-40]);
    const pool = Buffer.alloc(64);
    pool.set(new Uint8Array(f32.buffer), 7);
    expect([...new Float32Array(toF32Bits(pool.subarray(7, 19), "F32").buffer)]).toEqual([...f32]);
    const bf16 = Buffer.from([0, 0xc0, 0x3f, 0x80, 0xbf]); // 1.5, -1.0 behind one byte
    expect([...new Float32Array(toF32Bits(bf16.subarray(1, 5), "BF16").buffer)]).toEqual([1.5, -1]);
  });

  test("a bfloat16 source imported as bfloat16 keeps every bit, NaN payloads and infinities too", async () => {
    const { root, hf } = await exported(GQA, "bfloat16");
    // Odd values in the embedding (its layout is the same on both sides): signalling and quiet NaNs with payloads,
    // both infinities, a subnormal.
    const odd = [0x7f81, 0xffc1, 0x7fff, 0x7f80, 0xff80, 0x0001];
    const file = readdirSync(hf).find((f) => f.endsWith(".safetensors")) as string;
    const data = readFileSync(join(hf, file));
    const h = parseHeader(data, file, ["BF16"]);
    const emb = h.tensors.find((t) => t.name === "model.embed_tokens.weight");
    if (emb === undefined) throw new Error(`no embedding in ${file}`);
    for (const [i, v] of odd.entries()) data.writeUInt16LE(v, h.dataStart + emb.begin + 2 * (3 * i + 1));
    writeFileSync(join(hf, file), data);
    await importHf(hf, join(root, "ckpt"), { dtype: "bfloat16" });
    const got = readRegularArray(join(root, "ckpt", "step_00000000"), "model/decoder/emb/token_emb/weight");
    const bits = new Uint16Array(got.bytes.buffer, got.bytes.byteOffset, got.bytes.length >>> 1);
    expect(odd.map((_, i) => bits[3 * i + 1])).toEqual(odd);
    expect(Buffer.compare(Buffer.from(got.bytes), data.subarray(h.dataStart + emb.begin, h.dataStart + emb.end))).toBe(0);
  });

  test("float16 tensors: every value exactly its float32 (subnormals too), through the same mapping", async () => {
    const { root, hf } = await exported(GQA, "float32");
    // The export's tensors rewritten as float16 of random finite bits (exponents up to 15: no inf or NaN).
    const tensors = readTensors(hf);
    let s = 7;
    const f16 = new Map<string, Uint16Array>();
    const header: Record<string, unknown> = {};
    let at = 0;
    for (const [name, t] of tensors) {
      const bits = new Uint16Array(t.bytes.length / 4);
      for (let i = 0; i < bits.length; i++) {
        s = (Math.imul(s, 1103515245) + 12345) >>> 0;
        bits[i] = (s >>> 16) & 0xbfff;
      }
      f16.set(name, bits);
      header[name] = { dtype: "F16", shape: t.shape, data_offsets: [at, at + bits.byteLength] };
      at += bits.byteLength;
    }
    const src = join(root, "f16");
    mkdirSync(src);
    const json = Buffer.from(JSON.stringify(header));
    const len = Buffer.alloc(8);
    len.writeBigUInt64LE(BigInt(json.length));
    writeFileSync(join(src, "model.safetensors"), Buffer.concat([len, json, ...[...f16.values()].map((b) => Buffer.from(b.buffer))]));
    writeFileSync(join(src, "config.json"), readFileSync(join(hf, "config.json")));
    await importHf(src, join(root, "ckpt"), {});
    const back = join(root, "back");
    await exportHf(join(root, "ckpt", "step_00000000"), back, { dtype: "float32", memoryBytes: 64 * 2 ** 20, tokenizer: "none" });
    for (const [name, t] of readTensors(back)) {
      const got = new Float32Array(new Uint8Array(t.bytes).buffer);
      const want = Float32Array.from(f16.get(name) as Uint16Array, f16Value);
      const bad = got.findIndex((v, i) => !Object.is(v, want[i]));
      expect(bad < 0 ? "" : `${bad}: ${got[bad]} vs ${want[bad]} (bits ${(f16.get(name) as Uint16Array)[bad]?.toString(16)})`, name).toBe(
        "",
      );
    }
  });

  test("a sharded source on gs:// imports to the same step as from the local folder, and into gs://", async () => {
    const { root, hf } = await exported(GQA, "bfloat16", 3, 4000);
    expect(readdirSync(hf).filter((f) => f.endsWith(".safetensors")).length).toBeGreaterThan(3);
    const bucket = await newBucket("imphf");
    await uploadDir(hf, bucket, "models/llama");
    await importHf(hf, join(root, "local"), {});
    const r = await runCli(["import-hf", `gs://${bucket}/models/llama`, join(root, "remote"), "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const files = (dir: string) => readdirSync(dir, { recursive: true, withFileTypes: true }).filter((e) => e.isFile());
    const local = join(root, "local", "step_00000000");
    const remote = join(root, "remote", "step_00000000");
    const names = files(local).map((e) => join(e.parentPath, e.name).slice(local.length));
    expect(files(remote).length).toBe(names.length);
    for (const n of names.filter((x) => !x.includes(".orbax2reg")))
      expect(Buffer.compare(readFileSync(local + n), readFileSync(remote + n)), n).toBe(0);
    const g = await runCli(["import-hf", `gs://${bucket}/models/llama`, `gs://${bucket}/ckpt`, "--no-progress"]);
    expect(g.code, g.stderr).toBe(0);
    const [objects] = await emulatorStorage().bucket(bucket).getFiles({ prefix: "ckpt/step_00000000/" });
    const keys = objects.map((o) => o.name.slice("ckpt/step_00000000/".length));
    expect(keys).toContain("index");
    expect(keys.length).toBe(names.length);
  });
});

/** A Llama folder of random float32 bits (NaNs included: they are copied as bits), one file, `layers` layers. */
function randomLlama(dir: string, layers: number): void {
  const D = 512;
  const F = 2048;
  const V = 8192;
  const shapes: [string, number[]][] = [["model.embed_tokens.weight", [V, D]]];
  for (let i = 0; i < layers; i++) {
    const p = `model.layers.${i}.`;
    // 8 heads of 64, 2 key/value heads.
    for (const [n, rows] of [
      ["q", D],
      ["k", 128],
      ["v", 128],
      ["o", D],
    ] as const)
      shapes.push([`${p}self_attn.${n}_proj.weight`, [rows, D]]);
    shapes.push([`${p}mlp.gate_proj.weight`, [F, D]], [`${p}mlp.up_proj.weight`, [F, D]], [`${p}mlp.down_proj.weight`, [D, F]]);
    shapes.push([`${p}input_layernorm.weight`, [D]], [`${p}post_attention_layernorm.weight`, [D]]);
  }
  shapes.push(["model.norm.weight", [D]], ["lm_head.weight", [V, D]]);
  const header: Record<string, unknown> = {};
  let at = 0;
  for (const [name, shape] of shapes) {
    const n = shape.reduce((a, b) => a * b, 1) * 4;
    header[name] = { dtype: "F32", shape, data_offsets: [at, at + n] };
    at += n;
  }
  mkdirSync(dir, { recursive: true });
  const json = Buffer.from(JSON.stringify(header));
  const len = Buffer.alloc(8);
  len.writeBigUInt64LE(BigInt(json.length));
  writeFileSync(join(dir, "model.safetensors"), Buffer.concat([len, json, randomBytes(at)]));
  writeFileSync(
    join(dir, "config.json"),
    JSON.stringify({
      model_type: "llama",
      hidden_size: D,
      intermediate_size: F,
      num_hidden_layers: layers,
      num_attention_heads: 8,
      num_key_value_heads: 2,
      vocab_size: V,
    }),
  );
}

/** The files under a step's gda/ but the .zarray files (chunks, and temporary files of writes), relative paths. */
const chunkFiles = (step: string) =>
  existsSync(join(step, "gda"))
    ? readdirSync(join(step, "gda"), { recursive: true, withFileTypes: true })
        .filter((e) => e.isFile() && e.name !== ".zarray")
        .map((e) => join(e.parentPath, e.name).slice(step.length))
    : [];

describe("commit and resume", () => {
  test("killed (SIGKILL) part way, the import leaves no index; the rerun keeps the chunks there and gives the same step", async () => {
    const root = tempDir("impkill");
    randomLlama(join(root, "hf"), 6);
    const dest = join(root, "ckpt");
    const step = join(dest, "step_00000000");
    const child = spawn(process.execPath, ["bin/orbax2reg.js", "import-hf", join(root, "hf"), dest, "--no-progress", "--memory", "64"], {
      stdio: "ignore",
    });
    const exited = new Promise<void>((resolve) => child.on("exit", () => resolve()));
    const done = () => chunkFiles(step).filter((f) => /\/[0-9.]+$/.test(f)).length;
    while (done() < 5 && child.exitCode === null) await new Promise((r) => setTimeout(r, 5));
    const killed = child.kill("SIGKILL");
    await exited;
    expect(killed && child.signalCode === "SIGKILL").toBe(true);
    expect(existsSync(join(step, "index"))).toBe(false);
    const kept = done();
    const r = await runCli(["import-hf", join(root, "hf"), dest, "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const j = JSON.parse(r.stdout);
    expect({ resumed: j.resumed, chunksWritten: j.chunksWritten, chunks: j.chunks, kept }).toEqual({
      resumed: true,
      chunksWritten: j.chunks - kept,
      chunks: j.chunks,
      kept,
    });
    // The same files as an import that was never stopped, byte for byte (temporary files of the killed writer gone).
    await importHf(join(root, "hf"), join(root, "clean"), {});
    const clean = join(root, "clean", "step_00000000");
    const names = chunkFiles(clean).sort();
    expect(chunkFiles(step).sort()).toEqual(names);
    for (const n of names) expect(Buffer.compare(readFileSync(step + n), readFileSync(clean + n)), n).toBe(0);
  });

  test("an import stopped part way leaves no index; the rerun keeps its chunks and writes only the rest", async () => {
    const { root, arrays, hf } = await exported(MHA, "float32");
    const dest = join(root, "ckpt");
    let made = 0;
    const stop = new Error("stopped");
    await expect(
      importHf(hf, dest, {
        onChunk: () => {
          if (++made === 6) throw stop;
        },
      }),
    ).rejects.toBe(stop);
    expect(existsSync(join(dest, "step_00000000", "index"))).toBe(false);
    const kept = readdirSync(join(dest, "step_00000000", "gda"), { recursive: true, withFileTypes: true }).filter(
      (e) => e.isFile() && e.name !== ".zarray",
    ).length;
    expect(kept).toBeGreaterThanOrEqual(6);
    const r = await importHf(hf, dest, {});
    expect(r.resumed).toBe(true);
    expect(r.chunksWritten).toBe(r.chunks - kept);
    expectArraysEqual(join(dest, "step_00000000"), arrays, "float32");
  });

  test("the same import again writes nothing", async () => {
    const { root, hf } = await exported(MHA, "float32");
    await importHf(hf, join(root, "ckpt"), {});
    const r = await importHf(hf, join(root, "ckpt"), {});
    expect(r).toMatchObject({ alreadyImported: true, chunksWritten: 0 });
  });

  test("another model committed at the step is refused without --force, replaced with it", async () => {
    const a = await exported(MHA, "float32");
    const b = await exported(GQA, "float32");
    const dest = join(a.root, "ckpt");
    await importHf(a.hf, dest, {});
    const r = await runCli(["import-hf", b.hf, dest, "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/step_00000000.*holds a committed checkpoint this import did not write.*--force replaces it/);
    expectArraysEqual(join(dest, "step_00000000"), a.arrays, "float32");
    const f = await runCli(["import-hf", b.hf, dest, "--force", "--no-progress"]);
    expect(f.code, f.stderr).toBe(0);
    expectArraysEqual(join(dest, "step_00000000"), b.arrays, "float32");
    // Nothing of the first import is left (its arrays' directories included).
    expect(
      existsSync(
        join(
          dest,
          "step_00000000",
          "gda/model/decoder/transformer/repeat/layer/self_attention/attention/i_proj/i_proj/qkv_proj/weight/0.0.0.0.0",
        ),
      ),
    ).toBe(false);
  });

  test("files of another writer at the step (no index: an interrupted save) are refused without --force", async () => {
    const { root, hf } = await exported(MHA, "float32");
    const stray = join(root, "ckpt", "step_00000000", "gda", "x");
    mkdirSync(stray, { recursive: true });
    writeFileSync(join(stray, ".zarray"), "{}");
    const r = await runCli(["import-hf", hf, join(root, "ckpt"), "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/holds files this import did not write/);
    expect((await runCli(["import-hf", hf, join(root, "ckpt"), "--force", "--no-progress"])).code).toBe(0);
    expect(existsSync(join(stray, ".zarray"))).toBe(false);
  });
});

describe("the CLI", () => {
  test("--json: the summary, the fuji config and the AXLearn settings that restore it", async () => {
    const { root, hf } = await exported(GQA, "float32");
    const r = await runCli(["import-hf", hf, join(root, "ckpt"), "--step", "3", "--dtype", "bfloat16", "--json", "--no-progress"]);
    expect(r.code, r.stderr).toBe(0);
    const j = JSON.parse(r.stdout);
    expect(j).toMatchObject({ step: 3, dtype: "bfloat16", committed: true, dims: { layers: 2, heads: 4, kvHeads: 2, tied: false } });
    expect(j.restore.modelConfig).toBe(
      "fuji.model_config(num_layers=2, hidden_dim=32, num_heads=4, num_kv_heads=2, vocab_size=24, rope_theta=500000.0, shared_lm_head=False, ffn_dim=40)",
    );
    expect(j.restore.initStateBuilder).toContain("validation=CheckpointValidationType.EXACT_UP_TO_DTYPE");
  });

  test("verify compares the import with the folder it came from, tensor by tensor", async () => {
    const { root, hf } = await exported(GQA, "bfloat16", 5, 4000);
    await importHf(hf, join(root, "ckpt"), {});
    const v = await runCli(["verify", join(root, "ckpt", "step_00000000"), hf, "--no-progress"]);
    expect(v.code, v.stdout + v.stderr).toBe(0);
    expect(v.stdout).toMatch(/ 0 failed/);
  });

  test("--memory below what the largest chunk needs in flight is refused before anything is written", async () => {
    const root = tempDir("impmem");
    randomLlama(join(root, "hf"), 1);
    const r = await runCli(["import-hf", join(root, "hf"), join(root, "ckpt"), "--memory", "4", "--no-progress"]);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/--memory 4\.0 MiB is below the \d+ MiB the largest chunk needs in flight/);
    expect(existsSync(join(root, "ckpt"))).toBe(false);
  });
});
