import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import {
  ChunkDecoder,
  compress,
  decodeChunkFrame,
  decodeChunkStream,
  decompressBounded,
  decompressExact,
  readFrameHeader,
} from "../../src/codecs/zstd.js";
import { FormatError, LimitError } from "../../src/errors.js";
import { blockHeader, cat, u32le, zstdFrame, zstdRawFrame, zstdRleFrameWithoutSize, zstdSkippableFrame } from "../helpers/ocdbt-encode.js";
import { FIXTURES } from "../helpers/paths.js";

const PATH = "mem://frame";
const MANIFEST = readFileSync(`${FIXTURES}/ocdbt-neuroglancer/files_high_arity.ocdbt/manifest.ocdbt`);
/** The 92-byte frame of the doc §9 manifest (after the 14-byte header, before the CRC). */
const REAL_FRAME = new Uint8Array(MANIFEST.subarray(14, MANIFEST.length - 4));
const bytes = (n: number) => Uint8Array.from({ length: n }, (_, i) => (i * 7) % 251);

describe("zstd frame headers", () => {
  test("a riegeli frame for a small node is single-segment with its content size", () => {
    expect(readFrameHeader(REAL_FRAME, PATH)).toEqual({ contentSize: 83, windowSize: 83 });
  });

  test("a frame without a content size reports only its window", () => {
    expect(readFrameHeader(zstdRawFrame(bytes(10), { contentSize: false }), PATH)).toEqual({ contentSize: undefined, windowSize: 1 << 17 });
  });

  test("bad magic is a FormatError naming the file and offset", () => {
    const read = () => readFrameHeader(new Uint8Array(8), PATH, 14);
    expect(read).toThrow(FormatError);
    expect(read).toThrow(/^mem:\/\/frame, offset 14: zstd: bad frame magic/);
  });
});

describe("decompressBounded", () => {
  test("decodes a real frame that declares its content size", () => {
    const out = decompressBounded(REAL_FRAME, 1000, PATH);
    expect(out.length).toBe(83);
    // The body starts with the database uuid (doc §9).
    expect([...out.subarray(0, 4)]).toEqual([0xc2, 0x97, 0xfe, 0xd9]);
  });

  test("decodes a hand-made frame without a content size (raw block, not single-segment)", () => {
    const data = bytes(1000);
    const frame = cat(u32le(0xfd2fb528), [0x00, 0x38], blockHeader(1, 0, data.length), data);
    expect(readFrameHeader(frame, PATH).contentSize).toBeUndefined();
    expect(decompressBounded(frame, 1000, PATH)).toEqual(data);
  });

  test("decodes a frame of several blocks", () => {
    const data = bytes(300_000); // three raw blocks of at most 128 KiB
    const out = decompressBounded(zstdRawFrame(data, { contentSize: false }), 300_000, PATH);
    expect(Buffer.compare(out, data)).toBe(0); // toEqual is slow on 300k elements
  });

  test("decodes concatenated frames into one output", () => {
    const a = bytes(50);
    const b = bytes(70).reverse();
    const out = decompressBounded(cat(zstdRawFrame(a), zstdRawFrame(b, { contentSize: false })), 120, PATH);
    expect(out).toEqual(cat(a, b));
  });

  test("skips skippable frames", () => {
    const skippable = cat(u32le(0x184d2a5e), u32le(3), [9, 9, 9]);
    expect(decompressBounded(cat(skippable, zstdRawFrame(bytes(5))), 5, PATH)).toEqual(bytes(5));
  });

  test("a declared content size above the limit is a LimitError before decoding", () => {
    // The block is truncated: only the header check can have produced the error.
    const frame = cat(u32le(0xfd2fb528), [0xa0], u32le(50_000_000), blockHeader(1, 0, 4), [1, 2, 3, 4]);
    expect(() => decompressBounded(frame, 1000, PATH, 14)).toThrow(LimitError);
    expect(() => decompressBounded(frame, 1000, PATH, 14)).toThrow(/offset 14: zstd frames declare 50000000 bytes, over the limit of 1000/);
  });

  test("declared sizes of concatenated frames add up against the limit", () => {
    expect(() => decompressBounded(cat(zstdRawFrame(bytes(60)), zstdRawFrame(bytes(60))), 100, PATH)).toThrow(LimitError);
  });

  test("a window larger than the limit is a LimitError", () => {
    // Window descriptor 0xa0: 2^(10+20) = 1 GiB, which fzstd would allocate.
    const frame = cat(u32le(0xfd2fb528), [0x00, 0xa0], blockHeader(1, 0, 1), [7]);
    expect(() => decompressBounded(frame, 1000, PATH)).toThrow(/window of 1073741824 bytes/);
  });

  test("output streamed past the limit by a frame without a content size is a LimitError", () => {
    const frame = zstdRawFrame(bytes(2000), { contentSize: false });
    expect(() => decompressBounded(frame, 1000, PATH)).toThrow(LimitError);
    expect(() => decompressBounded(frame, 1000, PATH)).toThrow(/zstd output exceeds the limit of 1000 bytes/);
  });

  test("RLE blocks expanding past the limit are a LimitError", () => {
    // 16 bytes of input, 4 blocks of 100 KiB of output each.
    const rle = cat(u32le(0xfd2fb528), [0x00, 0x38], ...[0, 0, 0, 1].map((last) => [...blockHeader(last, 1, 100_000), 0x41]));
    expect(() => decompressBounded(rle, 150_000, PATH)).toThrow(LimitError);
  });

  test("a frame holding more than its declared content size is a FormatError", () => {
    const frame = zstdRawFrame(bytes(2000), { declaredSize: 10 });
    expect(() => decompressBounded(frame, 5000, PATH)).toThrow(FormatError);
  });

  // libzstd rejects a frame whose output differs from its Frame_Content_Size (corruption_detected);
  // fzstd returns the short output and decompressBounded does not compare it with the declared size.
  test("a frame holding fewer bytes than its declared content size is a FormatError", () => {
    const frame = zstdRawFrame(bytes(100), { declaredSize: 200 });
    expect(() => decompressBounded(frame, 5000, PATH)).toThrow(FormatError);
  });

  test("corrupt compressed data is a FormatError naming the file", () => {
    // A compressed block (type 2) of garbage.
    const frame = cat(u32le(0xfd2fb528), [0x20, 0x40], blockHeader(1, 2, 6), [0xff, 0xff, 0xff, 0xff, 0xff, 0xff]);
    expect(() => decompressBounded(frame, 1000, PATH)).toThrow(FormatError);
    expect(() => decompressBounded(frame, 1000, PATH)).toThrow(/^mem:\/\/frame, offset 0: zstd: corrupt compressed data/);
  });

  test("a frame cut inside a block is a FormatError", () => {
    expect(() => decompressBounded(REAL_FRAME.subarray(0, 50), 1000, PATH)).toThrow(FormatError);
  });

  test("empty input is a FormatError", () => {
    expect(() => decompressBounded(new Uint8Array(0), 1000, PATH)).toThrow(FormatError);
  });
});

describe("decompressExact", () => {
  test("returns the bytes when they have exactly the expected size", () => {
    expect(decompressExact(zstdRawFrame(bytes(40), { contentSize: false }), 40, PATH)).toEqual(bytes(40));
  });

  test("fewer bytes than expected is a FormatError naming the file", () => {
    const frame = zstdRawFrame(bytes(10), { contentSize: false });
    expect(() => decompressExact(frame, 16, PATH, 3)).toThrow(FormatError);
    expect(() => decompressExact(frame, 16, PATH, 3)).toThrow(/^mem:\/\/frame, offset 3: zstd: decoded 10 bytes, expected 16/);
  });
});

// What TensorStore's zarr driver reads (riegeli's ZstdReader, then the end of the chunk's bytes checked), as
// TensorStore 0.1.85 answered for each of these frames as a 16-byte uint32[4] chunk: one frame, exactly the
// chunk's bytes, nothing after it.
describe("ChunkDecoder: a chunk as TensorStore reads it, fed piece by piece", () => {
  const chunk = bytes(16);
  /** Feeds `data` `piece` bytes at a time; the decoded bytes, or the failure's message. */
  const feed = (data: Uint8Array, size = 16, piece = 1): Uint8Array | string => {
    const out: Uint8Array[] = [];
    const decoder = new ChunkDecoder(size, PATH, (p) => out.push(p.slice()));
    try {
      for (let i = 0; i < data.length; i += piece) decoder.push(data.subarray(i, i + piece));
      decoder.end();
      return cat(...out);
    } catch (e) {
      return (e as Error).message;
    } finally {
      decoder.release();
    }
  };

  test("decodes a frame with its content size, a byte at a time", () => {
    expect(feed(compress(chunk))).toEqual(chunk);
  });

  test("decodes a frame without a content size (TensorStore reads it)", () => {
    expect(feed(zstdFrame(chunk, { contentSize: null, singleSegment: false }))).toEqual(chunk);
  });

  test("decodes a chunk of many blocks cut anywhere", () => {
    const big = bytes(1 << 20);
    const out = feed(compress(big), big.length, 4099);
    expect(Buffer.compare(out as Uint8Array, big)).toBe(0);
  });

  test("stops at the first byte past the shape: a frame without a size inflating to 2 GiB costs one block", () => {
    const started = performance.now();
    expect(feed(zstdRleFrameWithoutSize(0, 2 ** 31), 16, 1 << 20)).toMatch(
      /^mem:\/\/frame: the zstd frame decodes to more than the 16 bytes of the chunk's shape \(stopped at byte 17\)$/,
    );
    expect(performance.now() - started).toBeLessThan(1000);
  });

  test("fails a frame that decodes to fewer bytes than the shape", () => {
    expect(feed(zstdFrame(chunk.subarray(0, 8), { contentSize: null, singleSegment: false }))).toMatch(
      /decodes to 8 bytes, the chunk's shape holds 16$/,
    );
  });

  test("fails a truncated frame when the chunk ends", () => {
    const frame = compress(chunk);
    expect(feed(frame.subarray(0, frame.length - 1))).toMatch(/truncated zstd frame: the chunk ends after \d+ bytes/);
  });

  test("fails bytes after the frame (TensorStore: End of data expected)", () => {
    const frame = compress(chunk);
    expect(feed(cat(frame, [0, 0]))).toMatch(new RegExp(`bytes follow the zstd frame, which ends at byte ${frame.length} `));
  });

  test("fails a chunk of two frames (TensorStore reads the first only)", () => {
    expect(feed(cat(zstdFrame(chunk.subarray(0, 8)), zstdFrame(chunk.subarray(8))))).toMatch(
      /decodes to 8 bytes, the chunk's shape holds 16$/,
    );
  });

  test("fails a skippable frame before the frame", () => {
    expect(feed(cat(zstdSkippableFrame(4), compress(chunk)))).toMatch(/decodes to 0 bytes/);
  });

  test("fails a skippable frame after the frame", () => {
    expect(feed(cat(compress(chunk), zstdSkippableFrame(4)))).toMatch(/bytes follow the zstd frame/);
  });

  test("fails a frame whose content checksum does not match", () => {
    expect(feed(zstdFrame(chunk, { checksum: true }))).toMatch(/corrupt zstd frame \(Restored data doesn't match checksum\)/);
  });

  test("fails a frame that declares another size than it holds", () => {
    expect(feed(zstdFrame(chunk, { contentSize: 32 }))).toMatch(/corrupt zstd frame/);
  });

  test("a failure is a FormatError naming the chunk, thrown again by every later call", () => {
    const decoder = new ChunkDecoder(16, PATH);
    expect(() => decoder.push(cat(compress(chunk), [1]))).toThrow(FormatError);
    expect(() => decoder.end()).toThrow(/^mem:\/\/frame: bytes follow/);
  });

  test("decodeChunkFrame decodes a whole chunk into its elements", () => {
    expect(decodeChunkFrame(compress(chunk), 16, PATH)).toEqual(chunk);
  });
});

describe("decodeChunkStream: a chunk's compressed pieces decoded as they stream in", () => {
  async function* pieces(data: Uint8Array, cut: number): AsyncGenerator<Uint8Array> {
    for (let i = 0; i < data.length; i += cut) yield data.subarray(i, i + cut);
  }

  test("each compressed piece's decoded bytes are handed out before the next piece is read", async () => {
    const chunk = bytes(300_000);
    const frame = compress(chunk);
    const out: Uint8Array[] = [];
    let ticks = 0;
    for await (const _ of decodeChunkStream(pieces(frame, 1000), chunk.length, PATH, (p) => out.push(p.slice()))) ticks++;
    expect(cat(...out)).toEqual(chunk);
    // One after each piece, one after the end of the frame is checked.
    expect(ticks).toBe(Math.ceil(frame.length / 1000) + 1);
  });

  test("a frame that decodes to more than the chunk fails as TensorStore would", async () => {
    const run = async () => {
      for await (const _ of decodeChunkStream(pieces(compress(bytes(20)), 4), 16, PATH, () => undefined));
    };
    await expect(run()).rejects.toThrow(FormatError);
  });
});
