// The fill encoder (rleFrame): a uniform chunk is written as RLE blocks without a buffer of its size.
// A wrong frame here shows up only as a sha256 mismatch of the converted chunk, so check it decodes to
// the right bytes with zstd-napi (what the reader side of the tests and most zstd users run).
import { describe, expect, test } from "vitest";
import * as native from "zstd-napi";
import { decompressExact, readFrameHeader, rleFrame } from "../../src/codecs/zstd.js";

const BLOCK = 128 * 1024;
const decode = (frame: Uint8Array) => new Uint8Array(native.decompress(frame));

describe("rleFrame", () => {
  test.each([
    ["0 bytes", 0],
    ["1 byte", 1],
    ["an odd size", 12_345],
    ["exactly one block", BLOCK],
    ["one byte past a block", BLOCK + 1],
    ["several blocks and a partial one", 3 * BLOCK + 777],
  ])("%s decodes with zstd-napi to that many copies of the byte", (_, size) => {
    const out = decode(rleFrame(0xa5, size));
    expect(out.length).toBe(size);
    expect(out.every((b) => b === 0xa5)).toBe(true);
  });

  test("a zero byte (the usual fill) decodes to zeros", () => {
    expect(decode(rleFrame(0, 1000))).toEqual(new Uint8Array(1000));
  });

  test("the frame declares its content size", () => {
    expect(readFrameHeader(rleFrame(1, 5000), "mem://fill").contentSize).toBe(5000);
  });

  test("the frame costs 4 bytes per 128 KiB block after a 13-byte header", () => {
    expect(rleFrame(0, 1).length).toBe(13 + 4);
    expect(rleFrame(0, 2 * BLOCK).length).toBe(13 + 2 * 4);
    expect(rleFrame(0, 2 * BLOCK + 1).length).toBe(13 + 3 * 4);
  });

  test("a 2 GiB fill is a small frame whose header declares 2 GiB", () => {
    const frame = rleFrame(0, 2 ** 31);
    expect(frame.length).toBe(13 + (2 ** 31 / BLOCK) * 4);
    expect(readFrameHeader(frame, "mem://fill").contentSize).toBe(2 ** 31);
  });

  test("the project's own decoder reads it back too", () => {
    expect(decompressExact(rleFrame(0x3c, BLOCK + 3), BLOCK + 3, "mem://fill")).toEqual(new Uint8Array(BLOCK + 3).fill(0x3c));
  });
});
