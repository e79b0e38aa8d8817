import { describe, expect, it } from "vitest";
import binding from "zstd-napi/binding.js";
import { compress, decompressExact, WEIGHT_PARAMS } from "../../src/codecs/zstd.js";
import { CompressPool, compressBound } from "../../src/codecs/zstd-pool.js";
import { prng } from "../helpers/prng.js";

/** Float-like bytes: partly compressible, as weights are. */
function sample(n: number, seed: number): Uint8Array {
  const f = new Float32Array(n);
  let x = seed;
  for (let i = 0; i < n; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    f[i] = (x / 2 ** 32 - 0.5) * 0.02;
  }
  return new Uint8Array(f.buffer);
}

/** Weights as a model has them: normal noise (Box-Muller), scale 0.02. Few repeated byte strings. */
function weights(n: number, seed: number): Uint8Array {
  const uniform = prng(seed);
  const f = new Float32Array(n);
  for (let i = 0; i < n; i++) f[i] = 0.02 * Math.sqrt(-2 * Math.log(1 - uniform())) * Math.cos(2 * Math.PI * uniform());
  return new Uint8Array(f.buffer);
}

describe("CompressPool: zstd on worker threads", () => {
  it("gives the same frame as compress() on the calling thread, for every chunk", async () => {
    const pool = new CompressPool(2);
    try {
      const inputs = [1, 2, 3, 4, 5].map((s) => sample(50_000 + s * 1000, s));
      const want = inputs.map((b) => compress(b));
      const got = await Promise.all(inputs.map((b) => pool.compress(new Uint8Array(b))));
      for (const [i, g] of got.entries()) expect(Buffer.from(g).equals(Buffer.from(want[i] as Uint8Array))).toBe(true);
    } finally {
      await pool.close();
    }
  });

  it("takes the chunk's buffer without copying it (transferred: empty here after) and its frame decodes back", async () => {
    const pool = new CompressPool(1);
    try {
      const data = sample(10_000, 7);
      const chunk = new Uint8Array(data);
      const frame = await pool.compress(chunk);
      expect(chunk.byteLength).toBe(0);
      expect(decompressExact(frame, data.length, "chunk")).toEqual(data);
    } finally {
      await pool.close();
    }
  });

  it("compressInto writes the same frame into the caller's shared buffer, leaving the chunk there, on a worker or not", async () => {
    for (const threads of [1, 0]) {
      const pool = new CompressPool(threads);
      try {
        const data = sample(20_000, 5);
        const chunk = new Uint8Array(new SharedArrayBuffer(data.length));
        chunk.set(data);
        const into = new Uint8Array(new SharedArrayBuffer(compressBound(data.length) + 100));
        const frame = await pool.compressInto(chunk, into);
        expect(Buffer.from(frame).equals(Buffer.from(compress(data)))).toBe(true);
        expect(frame.buffer).toBe(into.buffer);
        expect(frame.byteOffset).toBe(0);
        expect(Buffer.from(chunk).equals(Buffer.from(data))).toBe(true);
      } finally {
        await pool.close();
      }
    }
  });

  it("compressInto refuses a buffer smaller than zstd's bound, and on a worker one that is not shared", async () => {
    const pool = new CompressPool(1);
    try {
      const data = new Uint8Array(new SharedArrayBuffer(1000));
      data.set(sample(250, 4));
      await expect(pool.compressInto(data, new Uint8Array(new SharedArrayBuffer(compressBound(1000) - 1)))).rejects.toThrow(RangeError);
      await expect(pool.compressInto(data, new Uint8Array(compressBound(1000)))).rejects.toThrow(/SharedArrayBuffer/);
    } finally {
      await pool.close();
    }
  });

  it("with WEIGHT_PARAMS, frames decode back exactly, the same on a worker or not", async () => {
    const data = weights(300_000, 9);
    const frames: Uint8Array[] = [];
    for (const threads of [1, 0]) {
      const pool = new CompressPool(threads, WEIGHT_PARAMS);
      try {
        frames.push(await pool.compress(new Uint8Array(data)));
      } finally {
        await pool.close();
      }
    }
    expect(Buffer.from(decompressExact(frames[0] as Uint8Array, data.length, "chunk")).equals(Buffer.from(data))).toBe(true);
    expect(Buffer.from(frames[0] as Uint8Array).equals(Buffer.from(frames[1] as Uint8Array))).toBe(true);
  });

  it("WEIGHT_PARAMS still Huffman-code the literals, which the match search's step alone would store raw", async () => {
    const data = weights(300_000, 11);
    const sizes: number[] = [];
    for (const params of [WEIGHT_PARAMS, WEIGHT_PARAMS.slice(0, 2)]) {
      const pool = new CompressPool(0, params);
      sizes.push((await pool.compress(data)).length);
      await pool.close();
    }
    expect(sizes[0]).toBeLessThan(0.95 * data.length); // the exponent bytes' entropy coded
    expect(sizes[1]).toBeGreaterThan(data.length); // stored: the experimental parameter is what codes them
    expect(WEIGHT_PARAMS[0]).toEqual([binding.CParameter.compressionLevel, 1]);
  });

  it("with no threads compresses on the calling thread", async () => {
    const pool = new CompressPool(0);
    const data = sample(1000, 3);
    expect(Buffer.from(await pool.compress(data)).equals(Buffer.from(compress(data)))).toBe(true);
    await pool.close();
  });
});
