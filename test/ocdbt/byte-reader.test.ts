import { describe, expect, test } from "vitest";
import { FormatError } from "../../src/errors.js";
import { ByteReader } from "../../src/ocdbt/byte-reader.js";

const reader = (bytes: number[], baseOffset = 0) => new ByteReader(Uint8Array.from(bytes), "mem://body", baseOffset);

/** The FormatError a read throws (fails the test if it does not throw one). */
function formatError(read: () => unknown): FormatError {
  try {
    read();
  } catch (e) {
    expect(e).toBeInstanceOf(FormatError);
    return e as FormatError;
  }
  throw new Error("expected a FormatError");
}

describe("LEB128 varints", () => {
  test("decodes one- and multi-byte values, least significant group first", () => {
    const r = reader([0x00, 0x7f, 0x80, 0x01, 0x80, 0x80, 0x80, 0x04]);
    expect([r.varint("a"), r.varint("b"), r.varint("c"), r.varint("d")]).toEqual([0, 127, 128, 8388608]);
    expect(r.remaining).toBe(0);
  });

  test("accepts non-shortest encodings, as riegeli does", () => {
    expect(reader([0x80, 0x00]).varint("x")).toBe(0);
    expect(reader([0x81, 0x80, 0x80, 0x80, 0x00]).varint("x", 32)).toBe(1);
    expect(reader([0x81, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00]).varintBig("x")).toBe(1n);
  });

  test("reads the full 32-bit and 64-bit ranges", () => {
    expect(reader([0xff, 0xff, 0xff, 0xff, 0x0f]).varint("x", 32)).toBe(0xffffffff);
    expect(reader([0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]).varintBig("x")).toBe((1n << 64n) - 1n);
  });

  test("rejects a 32-bit varint longer than 5 bytes", () => {
    const e = formatError(() => reader([0x80, 0x80, 0x80, 0x80, 0x80, 0x00]).varint("count", 32));
    expect(e.message).toMatch(/longer than 5 bytes \(count\)/);
  });

  test("rejects a 64-bit varint longer than 10 bytes", () => {
    const e = formatError(() => reader([...Array(10).fill(0x80), 0x00]).varintBig("offset"));
    expect(e.message).toMatch(/longer than 10 bytes/);
  });

  test("rejects bits beyond 32 in a 32-bit varint", () => {
    expect(formatError(() => reader([0xff, 0xff, 0xff, 0xff, 0x1f]).varint("x", 32)).message).toMatch(/out of range for 32 bits/);
  });

  test("rejects bits beyond 64 in a 64-bit varint", () => {
    const bytes = [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02];
    expect(formatError(() => reader(bytes).varintBig("x")).message).toMatch(/out of range for 64 bits/);
  });

  test("a value above 2^53 is refused where a JS number is needed", () => {
    const twoTo53 = [0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x10];
    expect(reader(twoTo53).varintBig("x")).toBe(1n << 53n);
    expect(formatError(() => reader(twoTo53).varint("offset")).message).toMatch(/exceeds 2\^53/);
  });

  test("a truncated varint names the file and the offset where it started", () => {
    const r = reader([0x01, 0x80, 0x80], 100);
    r.varint("a");
    const e = formatError(() => r.varint("length"));
    expect(e.path).toBe("mem://body");
    expect(e.offset).toBe(101);
    expect(e.message).toMatch(/^mem:\/\/body, offset 101: truncated varint \(length\)/);
  });
});

describe("16-bit lengths", () => {
  test("accepts 65535", () => {
    expect(reader([0xff, 0xff, 0x03]).varint16("key length")).toBe(65535);
  });

  test("rejects lengths above 65535", () => {
    expect(formatError(() => reader([0x80, 0x80, 0x04]).varint16("key length")).message).toMatch(/key length 65536 exceeds 65535/);
  });
});

describe("count", () => {
  test("accepts a count the remaining bytes can hold", () => {
    expect(reader([0x03, 1, 2, 3]).count("entries", 10)).toBe(3);
  });

  test("refuses a count the remaining bytes cannot justify", () => {
    const e = formatError(() => reader([0x05, 1, 2, 3]).count("entries", 10));
    expect(e.message).toMatch(/entries 5 is larger than the remaining bytes allow/);
    expect(e.offset).toBe(0);
  });

  test("counts the minimum bytes per entry", () => {
    expect(reader([0x02, 1, 2, 3, 4]).count("files", 10, 2)).toBe(2);
    expect(() => reader([0x02, 1, 2, 3]).count("files", 10, 2)).toThrow(FormatError);
  });

  test("refuses a count above its limit", () => {
    expect(formatError(() => reader([0x05, 1, 2, 3, 4, 5]).count("versions", 4)).message).toMatch(/versions 5 exceeds the limit 4/);
  });
});

describe("fixed-width reads and truncation", () => {
  test("reads little-endian integers", () => {
    const r = reader([0x01, 0x02, 0x03, 0x04, 0xff, 0xff, 0xff, 0xff, 0x6e, 0, 0, 0, 0, 0, 0, 0]);
    expect(r.u32le("a")).toBe(0x04030201);
    expect(r.i32le("b")).toBe(-1);
    expect(r.u64le("c")).toBe(110n);
  });

  test("a truncated fixed-width read names the offset and what was read", () => {
    const r = reader([1, 2, 3, 4, 5, 6], 40);
    r.u32le("first");
    const e = formatError(() => r.u64le("commit_time"));
    expect(e.offset).toBe(44);
    expect(e.message).toMatch(/offset 44: truncated: commit_time needs 8 bytes, 2 left/);
  });

  test("take returns a view of exactly n bytes and refuses more than is left", () => {
    const r = reader([1, 2, 3]);
    expect([...r.take(2, "x")]).toEqual([1, 2]);
    expect(() => r.take(2, "suffix")).toThrow(/truncated: suffix needs 2 bytes, 1 left/);
  });

  test("expectEnd rejects trailing bytes", () => {
    const r = reader([1, 2]);
    r.u8("x");
    expect(formatError(() => r.expectEnd("manifest")).message).toMatch(/offset 1: 1 unexpected trailing bytes after manifest/);
  });
});
