import { afterAll, describe, expect, it } from "vitest";
import { compress, decodeChunkFrame } from "../../src/codecs/zstd.js";
import { DecodePool } from "../../src/codecs/zstd-decode-pool.js";
import { FormatError } from "../../src/errors.js";
import { castToBfloat16 } from "../../src/zarr/cast.js";
import { DTYPES } from "../../src/zarr/dtype.js";
import { cat, zstdFrame } from "../helpers/ocdbt-encode.js";

const PATH = "mem://chunk";

/** Float-like bytes: partly compressible, as weights are. */
function sample(n: number, seed: number): Uint8Array {
  const f = new Float32Array(n / 4);
  let x = seed;
  for (let i = 0; i < f.length; i++) {
    x = (x * 1103515245 + 12345) >>> 0;
    f[i] = (x / 2 ** 32 - 0.5) * 0.02;
  }
  return new Uint8Array(f.buffer);
}

/** `bytes` in a SharedArrayBuffer, as a source's read buffers hold them (what the workers decode). */
function shared(bytes: Uint8Array): Uint8Array {
  const out = new Uint8Array(new SharedArrayBuffer(bytes.length));
  out.set(bytes);
  return out;
}

/** The error decodeChunkFrame throws on `frame`, or undefined. */
function errorOf(frame: Uint8Array, size: number): unknown {
  try {
    decodeChunkFrame(frame, size, PATH);
  } catch (e) {
    return e;
  }
  return undefined;
}

describe("DecodePool: whole zstd chunks decoded on worker threads", () => {
  const pool = new DecodePool(64 << 10, 2);
  afterAll(() => pool.close());

  it("decodes every chunk to the bytes decodeChunkFrame gives, more chunks at once than it has slots", async () => {
    const chunks = Array.from({ length: 20 }, (_, i) => sample(4000 + 400 * i, i + 1));
    const got = await Promise.all(chunks.map((c) => pool.decode(shared(compress(c)), c.length, PATH)));
    for (const [i, g] of got.entries()) expect(Buffer.from(g).equals(Buffer.from(chunks[i] as Uint8Array))).toBe(true);
  });

  it("casts a float32 chunk to bfloat16 as asked, on the worker or not, to the bits zarr/cast.ts gives", async () => {
    const float32 = DTYPES.find((d) => d.name === "float32");
    if (float32 === undefined) throw new Error("no float32");
    // Ties to even both ways, carries into the exponent, infinities, NaNs of both signs (quiet or not), denormals.
    const special = [
      0x3f808000, 0x3f818000, 0x3f80ffff, 0x7f7fffff, 0xff7fffff, 0x7f800000, 0xff800000, 0x7fc00001, 0xff800001, 0x7f800001, 0x00000001,
      0x80008000, 0x0,
    ];
    const words = new Uint32Array(2048);
    for (let i = 0; i < words.length; i++)
      words[i] = i < special.length * 10 ? (special[i % special.length] as number) : Math.imul(i, 2654435761) >>> 0;
    words.set(new Uint32Array(sample(4096, 11).buffer), special.length * 10);
    const chunk = new Uint8Array(words.buffer);
    const want = castToBfloat16(chunk, float32);
    const onWorker = await pool.decode(shared(compress(chunk)), chunk.length, PATH, true);
    const here = await pool.decode(compress(chunk), chunk.length, PATH, true);
    expect(Buffer.from(onWorker).equals(Buffer.from(want))).toBe(true);
    expect(Buffer.from(here).equals(Buffer.from(want))).toBe(true);
  });

  it("gives each chunk a buffer of its own, not a view of a worker's slot", async () => {
    const a = sample(8000, 1);
    const b = sample(8000, 2);
    const first = await pool.decode(shared(compress(a)), a.length, PATH);
    await Promise.all([1, 2, 3, 4, 5, 6, 7, 8, 9].map(() => pool.decode(shared(compress(b)), b.length, PATH)));
    expect(first.buffer instanceof SharedArrayBuffer).toBe(false);
    expect(first.byteLength).toBe(a.length);
    expect(Buffer.from(first).equals(Buffer.from(a))).toBe(true);
  });

  it.each([
    ["a frame decoding to fewer bytes than the chunk", (c: Uint8Array) => compress(c.subarray(8))],
    ["a frame decoding to more bytes than the chunk", (c: Uint8Array) => compress(cat(c, [1, 2, 3, 4]))],
    ["bytes after the frame", (c: Uint8Array) => cat(compress(c), [0])],
    ["a truncated frame", (c: Uint8Array) => compress(c).subarray(0, 100)],
    ["a frame whose checksum does not match", (c: Uint8Array) => corruptChecksum(zstdFrame(c, { checksum: true }))],
    ["bytes that are no zstd frame", (c: Uint8Array) => c.slice(0, 200)],
  ])("fails %s with decodeChunkFrame's own error, and decodes the next chunk", async (_, make) => {
    const chunk = sample(4000, 9);
    const frame = make(chunk);
    const want = errorOf(frame, chunk.length);
    expect(want).toBeInstanceOf(FormatError);
    const failed = pool.decode(shared(frame), chunk.length, PATH);
    await expect(failed).rejects.toThrow(FormatError);
    await expect(failed).rejects.toThrow((want as Error).message);
    const next = sample(4000, 10);
    expect(Buffer.from(await pool.decode(shared(compress(next)), next.length, PATH)).equals(Buffer.from(next))).toBe(true);
  });

  it("decodes on the calling thread a chunk larger than its slots or not in shared memory", async () => {
    const big = sample(100 << 10, 3);
    expect(Buffer.from(await pool.decode(shared(compress(big)), big.length, PATH)).equals(Buffer.from(big))).toBe(true);
    const plain = sample(4000, 4);
    expect(Buffer.from(await pool.decode(compress(plain), plain.length, PATH)).equals(Buffer.from(plain))).toBe(true);
  });

  it("with no threads decodes on the calling thread", async () => {
    const none = new DecodePool(64 << 10, 0);
    const c = sample(4000, 5);
    expect(Buffer.from(await none.decode(shared(compress(c)), c.length, PATH)).equals(Buffer.from(c))).toBe(true);
    await none.close();
  });
});

/** `frame` (which ends in a 4-byte content checksum) with its checksum's last byte flipped. */
function corruptChecksum(frame: Uint8Array): Uint8Array {
  const out = frame.slice();
  out[out.length - 1] = (out[out.length - 1] as number) ^ 0xff;
  return out;
}
