// import-hf: the round trip (a fuji tree written as a regular step, exported by export-hf, imported back: every
// array the source's, bit for bit in float32; the import exported again: the same shard bytes), and the layout
// AXLearn reads (index last, .zarray, one chunk per layer).
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { decompressExact } from "../../src/codecs/zstd.js";
import { exportHf } from "../../src/hf/export.js";
import { importHf } from "../../src/hf/import.js";
import { parseIndex } from "../../src/regular/index-file.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { chunkGrid, product } from "../../src/zarr/metadata.js";
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

const bytesOf = (a: HostArray) => new Uint8Array(a.data.buffer, a.data.byteOffset, a.data.byteLength);

/** A fuji tree as a regular step, exported by export-hf in `dtype`: the import's source. */
async function exported(dims: Dims, dtype: "float32" | "bfloat16", seed = 3) {
  const root = tempDir("imp");
  const arrays = fujiArrays(dims, seed);
  writeRegularStep(join(root, "fuji", "step_00000007"), arrays, (a) => [...a.shape]);
  const hf = join(root, "hf");
  await exportHf(join(root, "fuji", "step_00000007"), hf, { dtype, memoryBytes: 64 * 2 ** 20, tokenizer: "none" });
  return { root, arrays, hf };
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
