import { readdirSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { DECODER_BYTES } from "../../src/hf/export.js";
import { type OutputTensor, planExport } from "../../src/hf/llama.js";
import type { SourceArray } from "../../src/hf/source.js";
import { chunkCost, chunkTiles, planSpill, Spill, splittable } from "../../src/hf/spill.js";
import { bands, Cursors, produceInOrder } from "../../src/hf/stream.js";
import { openStore } from "../../src/store/open.js";
import { tempDir } from "../helpers/tmp.js";
import { type Dims, fujiArrays, type HostArray, memoryArray, shardedChunks } from "./fuji-tree.js";

const MiB = 2 ** 20;

/** Every layer weight cut in `parts` on its model axis (each chunk spanning every layer), the rest whole. */
const cut = (parts: number) => (a: HostArray) =>
  a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
    ? shardedChunks(
        a.shape,
        a.path.endsWith("linear2/weight") || (a.path.endsWith("qkv_proj/weight") && a.shape.length === 5) ? 2 : 1,
        parts,
      )
    : [...a.shape];

/** The source's arrays, counting how many times each chunk's stream is opened. */
function counted(arrays: HostArray[], chunks: (a: HostArray) => number[]) {
  const opened = new Map<string, number>();
  const sources = arrays.map((a): SourceArray => {
    const m = memoryArray(a, chunks(a), 1031);
    return {
      ...m,
      chunk: (index, window) => {
        const key = `${a.path}|${index.join(",")}`;
        opened.set(key, (opened.get(key) ?? 0) + 1);
        return m.chunk(index, window);
      },
    };
  });
  return { plan: planExport(sources), opened };
}

/** Every tensor's bytes as the streaming engine makes them from few chunks (each decoded once). */
async function streamed(arrays: HostArray[], dtype: "BF16" | "F32") {
  const { plan } = counted(arrays, cut(2));
  const out = new Map<string, Uint8Array>();
  const cursors = new Cursors();
  for await (const piece of produceInOrder(plan.tensors, dtype, 1 << 30, cursors))
    out.set(piece.t.name, Buffer.concat([out.get(piece.t.name) ?? new Uint8Array(0), piece.bytes]));
  await cursors.closeAll();
  return out;
}

describe("the spill of chunk groups", () => {
  for (const [label, dims] of [
    ["fused QKV", { layers: 3, dim: 64, heads: 2, headDim: 8, ffn: 96, vocab: 16 }],
    ["grouped QKV", { layers: 2, dim: 64, heads: 4, kvHeads: 2, headDim: 4, ffn: 80, vocab: 16, lmHead: true }],
  ] as [string, Dims][]) {
    test(`${label}: weights cut in 64 chunks, groups of 8: the same bytes as a few-chunk export, every chunk decoded once, nothing left behind`, async () => {
      const arrays = fujiArrays(dims, 3);
      const want = await streamed(arrays, "BF16");
      const { plan, opened } = counted(arrays, cut(64));
      const dir = tempDir("spill");
      const store = await openStore(dir);
      const spill = new Spill(store, "BF16", 1 << 16, 0);
      const stacked = new Map<SourceArray, OutputTensor[]>();
      for (const t of plan.tensors)
        if (t.array.path.includes("/repeat/layer/") && t.array.path.endsWith("/weight"))
          stacked.set(t.array, [...(stacked.get(t.array) ?? []), t]);
      expect(stacked.size).toBe(5);
      for (const [array, tensors] of stacked) {
        await spill.spill(array, tensors, 8);
        for (const t of tensors) {
          // Small bands: a band is put together from every group's rows.
          const parts: Uint8Array[] = [];
          for (const [u0, u1] of bands(t, "BF16", 300)) parts.push(await spill.band(t, u0, u1));
          expect(Buffer.compare(Buffer.concat(parts), want.get(t.name) as Uint8Array), t.name).toBe(0);
        }
        await spill.done(array);
      }
      expect(spill.reopened).toBe(0);
      expect(spill.peakOpen).toBeLessThanOrEqual(8);
      const weightChunks = [...opened].filter(([k]) => k.includes("/repeat/layer/") && k.split("|")[0]?.endsWith("/weight"));
      expect(weightChunks.length).toBe(5 * 64);
      expect(weightChunks.every(([, n]) => n === 1)).toBe(true);
      expect(readdirSync(dir)).toEqual([]);
    });
  }

  test("an array whose chunks all fit in one group is made straight from them: the same bytes, each chunk decoded once, no scratch object", async () => {
    const dims: Dims = { layers: 3, dim: 64, heads: 2, headDim: 8, ffn: 96, vocab: 16 };
    const arrays = fujiArrays(dims, 3);
    const want = await streamed(arrays, "BF16");
    const { plan, opened } = counted(arrays, cut(64));
    const dir = tempDir("spill-direct");
    const spill = new Spill(await openStore(dir), "BF16", 1 << 16, 0);
    const stacked = new Map<SourceArray, OutputTensor[]>();
    for (const t of plan.tensors)
      if (t.array.path.includes("/repeat/layer/") && t.array.path.endsWith("/weight"))
        stacked.set(t.array, [...(stacked.get(t.array) ?? []), t]);
    for (const [array, tensors] of stacked) {
      await spill.spill(array, tensors, 64);
      for (const t of tensors) {
        const parts: Uint8Array[] = [];
        for (const [u0, u1] of bands(t, "BF16", 300)) parts.push(await spill.band(t, u0, u1));
        expect(Buffer.compare(Buffer.concat(parts), want.get(t.name) as Uint8Array), t.name).toBe(0);
        expect(readdirSync(dir)).toEqual([]);
      }
      await spill.done(array);
    }
    expect(spill.reopened).toBe(0);
    expect(spill.peakOpen).toBe(64);
    const weightChunks = [...opened].filter(([k]) => k.includes("/repeat/layer/") && k.split("|")[0]?.endsWith("/weight"));
    expect(weightChunks.length).toBe(5 * 64);
    expect(weightChunks.every(([, n]) => n === 1)).toBe(true);
  });

  test("chunks decoded whole count their decoded bytes and a quarter, not a decoder's: a group holds more of them", () => {
    const { plan } = counted(fujiArrays({ layers: 2, dim: 64, heads: 2, headDim: 8, ffn: 96, vocab: 8 }), cut(64));
    const whole = plan.tensors.map((t) => ({ ...t, array: { ...t.array, wholeChunks: true } }));
    // One array object per path, as a source gives.
    const byPath = new Map(whole.map((t) => [t.array.path, t.array]));
    const tensors = whole.map((t) => ({ ...t, array: byPath.get(t.array.path) as SourceArray }));
    const streamedPlan = { maxOpen: 8, maxBand: 16 * MiB };
    const groups = planSpill(tensors, "BF16", 30 * MiB, streamedPlan, DECODER_BYTES, 0).groupSize;
    expect(groups.size).toBe(5);
    // linear1's chunk: 2 layers x 1 x 96 float32 = 768 bytes, counted 960: all 64 of a layer fit in one group.
    expect([...groups.values()].every((k) => k === 64)).toBe(true);
    expect(
      chunkCost(byPath.get(tensors.find((t) => t.array.path.endsWith("linear1_0/weight"))?.array.path ?? "") as SourceArray, DECODER_BYTES),
    ).toBe(960);
  });

  test("groups are tiles of the chunk grid of at most k chunks a layer, every layer in each", () => {
    const a = memoryArray({ path: "x", shape: [4, 64, 30], data: new Float32Array(4 * 64 * 30) }, [4, 1, 30]);
    const tiles = chunkTiles(a, 8, false);
    expect(tiles.length).toBe(8);
    expect(tiles.every((b) => b.extent[0] === 4 && b.extent[1] === 8 && b.extent[2] === 30)).toBe(true);
    expect(tiles.map((b) => b.origin[1])).toEqual([0, 8, 16, 24, 32, 40, 48, 56]);
  });

  test("every fuji tensor is a transposed, reshaped box, so a group's part of it is a block of its rows and columns", () => {
    const { plan } = counted(fujiArrays({ layers: 2, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 8 }), cut(4));
    expect(plan.tensors.every(splittable)).toBe(true);
  });

  test("only arrays the streaming engine would re-decode are spilled, with groups as large as --memory allows", () => {
    const { plan } = counted(fujiArrays({ layers: 2, dim: 64, heads: 2, headDim: 8, ffn: 96, vocab: 8 }), cut(64));
    const none = planSpill(plan.tensors, "BF16", 336 * MiB, { maxOpen: 64, maxBand: 16 * MiB }, DECODER_BYTES, 0);
    expect(none.groupSize.size).toBe(0);
    const some = planSpill(plan.tensors, "BF16", 30 * MiB, { maxOpen: 8, maxBand: 16 * MiB }, DECODER_BYTES, 0);
    expect(some.groupSize.size).toBe(5);
    expect([...some.groupSize.values()].every((k) => k === 17)).toBe(true);
    expect(some.memoryWithoutRereads).toBeUndefined();
  });

  test("a layer's tensor of one chunk larger than --memory cannot be spilled: the --memory that avoids re-reading is said", () => {
    const { plan } = counted(fujiArrays({ layers: 2, dim: 64, heads: 2, headDim: 8, ffn: 96, vocab: 8 }), (a) => [...a.shape]);
    const r = planSpill(plan.tensors, "BF16", 10_000, { maxOpen: 8, maxBand: 5_000 }, 1_000, 0);
    expect(r.groupSize.size).toBe(0);
    // linear1's gate_proj: 96 x 64 bfloat16 = 12,288 bytes, one chunk: one decoder and the whole tensor.
    expect(r.memoryWithoutRereads).toBe(1_000 + 12_288);
  });
});
