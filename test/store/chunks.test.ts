import { describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { memoryChunks, streamChunks } from "../../src/store/chunks.js";

const data = Uint8Array.from({ length: 1000 }, (_, i) => (i * 7) & 0xff);

async function* pieces(of: Uint8Array, size: number): AsyncGenerator<Uint8Array> {
  for (let at = 0; at < of.length; at += size) yield of.slice(at, at + size);
}

describe("the chunks of an upload", () => {
  test("a stream is handed out chunk by chunk, the last one marked, with the whole object's size and CRC-32C", async () => {
    const it = pieces(data, 33);
    const source = streamChunks([], it, 400);
    const a = await source.take(0, 400);
    expect([Buffer.from(a.bytes), a.last]).toEqual([Buffer.from(data.subarray(0, 400)), false]);
    expect(source.total).toBeUndefined();
    const b = await source.take(400, 400);
    expect([Buffer.from(b.bytes), b.last]).toEqual([Buffer.from(data.subarray(400, 800)), false]);
    const c = await source.take(800, 400);
    expect([Buffer.from(c.bytes), c.last]).toEqual([Buffer.from(data.subarray(800)), true]);
    expect(source.total).toEqual({ size: 1000, crc32c: crc32c(data) });
  });

  test("what the server did not keep of a chunk is handed out again, with what follows it", async () => {
    const source = streamChunks([], pieces(data, 100), 400);
    await source.take(0, 400);
    const again = await source.take(256, 400); // the server kept 256 of the 400
    expect(Buffer.from(again.bytes)).toEqual(Buffer.from(data.subarray(256, 656)));
    await expect(source.take(0, 400)).rejects.toThrow(RangeError);
  });

  test("a stream that ends exactly at a chunk's end marks that chunk last", async () => {
    const source = streamChunks([data.slice(0, 500)], pieces(data.subarray(500), 250), 500);
    expect((await source.take(0, 500)).last).toBe(false);
    expect((await source.take(500, 500)).last).toBe(true);
    expect(source.total).toEqual({ size: 1000, crc32c: crc32c(data) });
  });

  test("bytes in memory are handed out as views of themselves", async () => {
    const source = memoryChunks(data);
    const a = await source.take(300, 400);
    expect(a.bytes.buffer).toBe(data.buffer);
    expect(a.last).toBe(false);
    expect((await source.take(700, 400)).last).toBe(true);
    expect(source.total).toEqual({ size: 1000, crc32c: crc32c(data) });
  });
});
