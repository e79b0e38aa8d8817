import { describe, expect, test } from "vitest";
import { type OutputTensor, planExport } from "../../src/hf/llama.js";
import type { SourceArray } from "../../src/hf/source.js";
import { type BandRequest, Cursors, PassReuse, produceInOrder, producePass } from "../../src/hf/stream.js";
import { zarrayText } from "../../src/regular/zarray.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { DTYPES } from "../../src/zarr/dtype.js";
import { parseZarrMetadata } from "../../src/zarr/metadata.js";
import { expectedTensors, fujiArrays, type HostArray, memoryArray, shardedChunks } from "./fuji-tree.js";

const F32 = DTYPES.find((d) => d.name === "float32") as never;

/** fsdp-style chunks: the model-dim axis of each weight split in 2 (as gen_fuji and fuji's mesh shard them), layers whole. */
function fsdpChunks(a: HostArray): number[] {
  const layerAxis = a.path.includes("/repeat/layer/") ? 1 : 0;
  if (a.path.endsWith("qkv_proj/weight")) return shardedChunks(a.shape, a.shape.length === 5 ? 2 : 1, 2);
  if (a.path.endsWith("linear2/weight")) return shardedChunks(a.shape, 2, 2);
  if (a.path.endsWith("/weight") && layerAxis === 1) return shardedChunks(a.shape, 1, 2);
  return [...a.shape];
}

async function produceAll(arrays: HostArray[], dtype: "F32" | "BF16", chunks: (a: HostArray) => number[], maxBand = 1 << 30) {
  const plan = planExport(arrays.map((a) => memoryArray(a, chunks(a))));
  const cursors = new Cursors();
  const out = new Map<string, Uint8Array>();
  for await (const piece of produceInOrder(plan.tensors, dtype, maxBand, cursors)) {
    out.set(piece.t.name, Buffer.concat([out.get(piece.t.name) ?? new Uint8Array(0), piece.bytes]));
  }
  await cursors.closeAll();
  return { out, reopened: cursors.reopened };
}

describe("the streaming engine", () => {
  for (const [label, dims] of [
    ["fused QKV, tied", { layers: 3, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 }],
    ["grouped QKV, lm_head", { layers: 2, dim: 16, heads: 4, kvHeads: 2, headDim: 4, ffn: 12, vocab: 10, lmHead: true }],
  ] as const) {
    test(`${label}: every tensor equals its plain computation, from chunks streamed in odd-sized pieces`, async () => {
      const arrays = fujiArrays(dims);
      const { out, reopened } = await produceAll(arrays, "F32", fsdpChunks);
      const want = expectedTensors(arrays, dims);
      expect([...out.keys()].sort()).toEqual([...want.keys()].sort());
      for (const [name, w] of want) expect(new Float32Array(new Uint8Array(out.get(name) as Uint8Array).buffer), name).toEqual(w.data);
      // In layer order (a grouped layer's q, k and v made together), each chunk is decoded once.
      expect(reopened).toBe(0);
    });
  }

  for (const [label, dims, chunks] of [
    [
      "fused QKV (three passes a layer), chunks spanning every layer",
      { layers: 4, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 },
      fsdpChunks,
    ],
    [
      "grouped QKV, lm_head, chunks spanning every layer",
      { layers: 3, dim: 16, heads: 4, kvHeads: 2, headDim: 4, ffn: 12, vocab: 10, lmHead: true },
      fsdpChunks,
    ],
    [
      "chunks of two layers (the walkers of the next chunk are made anew)",
      { layers: 4, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 },
      (a: HostArray) => a.shape.map((s, d) => (d === 0 ? 2 : Math.max(1, Math.ceil(s / 3)))),
    ],
  ] as const) {
    test(`passes re-made a layer on from the previous ones' walkers, re-based: the same bytes as passes made afresh (${label})`, async () => {
      const arrays = fujiArrays(dims);
      const plan = planExport(arrays.map((a) => memoryArray(a, chunks(a))));
      // The plan's passes in order: a grouped layer's q, k and v together, any other tensor alone.
      const passes: BandRequest[][] = [];
      for (const t of plan.tensors as OutputTensor[]) {
        const last = passes.at(-1);
        const request = { t, u0: 0, u1: t.extent[t.bandDim] as number };
        if (last !== undefined && t.pass !== undefined && last[0]?.t.pass === t.pass) last.push(request);
        else passes.push([request]);
      }
      const fresh = new Cursors();
      const reused = new Cursors();
      const reuse = new PassReuse();
      for (const requests of passes) {
        const want = await producePass(requests, "BF16", fresh);
        const got = await producePass(requests, "BF16", reused, reuse);
        for (const [i, w] of want.entries()) expect(Buffer.compare(got[i] as Uint8Array, w), requests[i]?.t.name).toBe(0);
      }
      await fresh.closeAll();
      await reused.closeAll();
      expect(reused.reopened).toBe(0);
      // Every stacked tensor after its array's first layer (or, chunked by two layers, after each chunk's first).
      expect(reuse.rebased).toBeGreaterThan(0);
    });
  }

  test("chunks that cut across layers and rows (edge chunks padded) give the same tensors", async () => {
    const dims = { layers: 3, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 };
    const arrays = fujiArrays(dims);
    const odd = (a: HostArray) => a.shape.map((s, d) => (d === 0 ? 2 : Math.max(1, Math.ceil(s / 3))));
    const { out } = await produceAll(arrays, "F32", odd);
    for (const [name, w] of expectedTensors(arrays, dims))
      expect(new Float32Array(new Uint8Array(out.get(name) as Uint8Array).buffer), name).toEqual(w.data);
  });

  test("bfloat16 is float32 rounded to nearest, ties to even (as castToBfloat16, checked against jax)", async () => {
    const dims = { layers: 1, dim: 8, heads: 1, headDim: 8, ffn: 8, vocab: 4 };
    const arrays = fujiArrays(dims);
    const emb = arrays[0] as HostArray;
    const bits = new Uint32Array(emb.data.buffer);
    // Halfway cases (to even: down from an even, up from an odd), just over half, NaN, infinities, a subnormal.
    bits.set([0x3f808000, 0x3f818000, 0x3f808001, 0x7fc00001, 0xff800000, 0x7f800000, 0x00018000, 0x80000000], 0);
    const { out } = await produceAll(arrays, "BF16", (a) => [...a.shape]);
    const got = new Uint16Array(new Uint8Array(out.get("model.embed_tokens.weight") as Uint8Array).buffer);
    expect([...got.slice(0, 8)].map((x) => x.toString(16))).toEqual(["3f80", "3f82", "3f81", "7fc0", "ff80", "7f80", "2", "8000"]);
    expect(got).toEqual(new Uint16Array(castToBfloat16(new Uint8Array(emb.data.buffer), F32).buffer));
  });

  test("a tensor over the band limit is made in bands with the same bytes; bands going back re-read their chunks", async () => {
    const dims = { layers: 2, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 };
    const arrays = fujiArrays(dims);
    const whole = await produceAll(arrays, "BF16", fsdpChunks);
    const banded = await produceAll(arrays, "BF16", fsdpChunks, 200);
    for (const [name, bytes] of whole.out) expect(banded.out.get(name), name).toEqual(bytes);
    expect(banded.reopened).toBeGreaterThan(0);
  });
});

describe("a bfloat16 source", () => {
  const BF16 = DTYPES.find((d) => d.name === "bfloat16") as never;
  /** The array stored as bfloat16 (its float32 values rounded), one chunk. */
  const bf16Array = (a: HostArray): SourceArray => {
    const f32 = memoryArray(a, a.shape);
    const meta = parseZarrMetadata(".zarray", new TextEncoder().encode(zarrayText({ shape: a.shape, chunkShape: a.shape, dtype: BF16 })), {
      path: a.path,
    });
    return {
      ...f32,
      meta,
      chunk: () =>
        (async function* () {
          yield castToBfloat16(new Uint8Array(a.data.buffer), F32);
        })(),
    };
  };

  test("exports as bfloat16 bit for bit, and as float32 widened exactly", async () => {
    const dims = { layers: 2, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 };
    const arrays = fujiArrays(dims);
    const fromF32 = await produceAll(arrays, "BF16", (a) => [...a.shape]);
    const make = async (dtype: "BF16" | "F32") => {
      const plan = planExport(arrays.map(bf16Array));
      const out = new Map<string, Uint8Array>();
      for await (const p of produceInOrder(plan.tensors, dtype, 1 << 30, new Cursors())) out.set(p.t.name, p.bytes);
      return out;
    };
    const bf = await make("BF16");
    const f32 = await make("F32");
    for (const [name, bytes] of fromF32.out) {
      expect(Buffer.compare(bf.get(name) as Uint8Array, bytes), name).toBe(0);
      const widened = new Uint32Array(new Uint16Array(new Uint8Array(bytes).buffer).length);
      new Uint16Array(new Uint8Array(bytes).buffer).forEach((b, i) => {
        widened[i] = (b << 16) >>> 0;
      });
      expect(f32.get(name), name).toEqual(new Uint8Array(widened.buffer));
    }
  });
});

test("with fewer decoders allowed open than one layer of an array covers, chunks are decoded again from their start, to the same bytes", async () => {
  const dims = { layers: 3, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 20 };
  const arrays = fujiArrays(dims);
  // Weights cut in 4 on their model axis: 4 chunks per layer of each array, 2 decoders allowed.
  const plan = planExport(
    arrays.map((a) =>
      memoryArray(
        a,
        a.path.includes("/repeat/layer/") && a.path.endsWith("/weight")
          ? shardedChunks(a.shape, a.path.endsWith("qkv_proj/weight") ? 2 : a.path.endsWith("linear2/weight") ? 2 : 1, 4)
          : [...a.shape],
      ),
    ),
  );
  const run = async (cursors: Cursors) => {
    const out: Uint8Array[] = [];
    for await (const p of produceInOrder(plan.tensors, "BF16", 1 << 30, cursors)) out.push(p.bytes);
    await cursors.closeAll();
    return { bytes: Buffer.concat(out), reopened: cursors.reopened, peakOpen: cursors.peakOpen };
  };
  const free = await run(new Cursors());
  const capped = await run(new Cursors(2));
  expect(Buffer.compare(capped.bytes, free.bytes)).toBe(0);
  expect(free.reopened).toBe(0);
  expect(capped.reopened).toBeGreaterThan(0);
  // The cap holds while chunks are read, not only after.
  expect(capped.peakOpen).toBeLessThanOrEqual(2);
});
