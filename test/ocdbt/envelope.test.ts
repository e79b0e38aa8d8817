import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { ChecksumError, FormatError, LimitError, type Orbax2RegError, UnsupportedError } from "../../src/errors.js";
import { decodeEnvelope } from "../../src/ocdbt/envelope.js";
import { cat, envelope, u32le } from "../helpers/ocdbt-encode.js";
import { FIXTURES } from "../helpers/paths.js";

const PATH = "mem://d/node";
const BODY = new TextEncoder().encode("body bytes");
const MANIFEST = new Uint8Array(readFileSync(`${FIXTURES}/ocdbt-neuroglancer/files_high_arity.ocdbt/manifest.ocdbt`));

/** The error a decode throws (fails the test if it does not throw). */
function decodeError(bytes: Uint8Array, offset = 0): Orbax2RegError {
  try {
    decodeEnvelope(bytes, "btreeNode", PATH, 1 << 20, offset);
  } catch (e) {
    return e as Orbax2RegError;
  }
  throw new Error("expected decodeEnvelope to fail");
}

/** Replaces the CRC so that only the field under test is wrong. */
function recrc(bytes: Uint8Array): Uint8Array {
  const head = bytes.subarray(0, bytes.length - 4);
  return cat(head, u32le(crc32c(head)));
}

describe("envelope", () => {
  test("the doc §9 manifest decodes to its 83-byte body", () => {
    const r = decodeEnvelope(MANIFEST, "manifest", PATH, 1 << 20);
    expect(r.remaining).toBe(83);
  });

  test("a zstd body decodes", () => {
    const r = decodeEnvelope(envelope("btreeNode", BODY), "btreeNode", PATH, 100);
    expect(r.take(r.remaining, "body")).toEqual(BODY);
  });

  test("a raw (uncompressed) body decodes, with offsets counted from the start of the file", () => {
    const r = decodeEnvelope(envelope("btreeNode", BODY, { compression: 0 }), "btreeNode", PATH, 100, 1000);
    expect(r.take(r.remaining, "body")).toEqual(BODY);
    // The body starts after magic, length, version and compression: byte 14 of the object.
    expect(() => r.u8("past the end")).toThrow(/offset 1024: truncated/);
  });

  test("bad magic is a FormatError at offset 0 of the object", () => {
    const e = decodeError(envelope("manifest", BODY), 500);
    expect(e).toBeInstanceOf(FormatError);
    expect(e.message).toMatch(/^mem:\/\/d\/node, offset 500: bad magic 0x0cdb3a2a for btreeNode \(expected 0x0cdb20de\)/);
  });

  test("a length field that differs from the object's size is a FormatError at offset 4", () => {
    const bytes = envelope("btreeNode", BODY);
    bytes[4] = (bytes[4] as number) + 1;
    const e = decodeError(recrc(bytes));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.offset).toBe(4);
    expect(e.message).toMatch(/length field says \d+ bytes, object has \d+/);
  });

  test("a CRC-32C mismatch is a ChecksumError naming the file and the checksum's offset", () => {
    const bytes = envelope("btreeNode", BODY);
    bytes[20] = (bytes[20] as number) ^ 0x01; // a body byte
    const e = decodeError(bytes, 924);
    expect(e).toBeInstanceOf(ChecksumError);
    expect(e.path).toBe(PATH);
    expect(e.offset).toBe(924 + bytes.length - 4);
    expect(e.message).toMatch(/CRC-32C mismatch: stored 0x[0-9a-f]{8}, computed 0x[0-9a-f]{8}/);
  });

  test("the CRC covers the compressed bytes, not the decompressed body", () => {
    // Same body, different frames (with and without content size): both carry a valid CRC of their own.
    const a = envelope("btreeNode", BODY);
    const b = envelope("btreeNode", BODY, { zstd: { contentSize: false } });
    expect(a.subarray(-4)).not.toEqual(b.subarray(-4));
    expect(decodeEnvelope(b, "btreeNode", PATH, 100).remaining).toBe(BODY.length);
  });

  test("format version 1 is an UnsupportedError at offset 12", () => {
    const e = decodeError(envelope("btreeNode", BODY, { version: 1 }));
    expect(e).toBeInstanceOf(UnsupportedError);
    expect(e.offset).toBe(12);
    expect(e.message).toMatch(/format version 1/);
  });

  test("an unknown compression format is an UnsupportedError at its offset", () => {
    const e = decodeError(envelope("btreeNode", BODY, { compression: 2 }), 100);
    expect(e).toBeInstanceOf(UnsupportedError);
    expect(e.offset).toBe(113);
    expect(e.message).toMatch(/compression format 2/);
  });

  test("the version and compression are varints, not single bytes", () => {
    // A non-shortest 0 (80 00) for the version is still version 0.
    const raw = envelope("btreeNode", BODY, { compression: 0 });
    const bytes = cat(raw.subarray(0, 12), [0x80, 0x00], raw.subarray(13, raw.length - 4));
    bytes[4] = bytes.length + 4;
    const r = decodeEnvelope(recrc(cat(bytes, [0, 0, 0, 0])), "btreeNode", PATH, 100);
    expect(r.take(r.remaining, "body")).toEqual(BODY);
  });

  test("a truncated object is a FormatError", () => {
    const e = decodeError(envelope("btreeNode", BODY).subarray(0, 10));
    expect(e).toBeInstanceOf(FormatError);
    expect(e.message).toMatch(/truncated btreeNode: 10 bytes/);
  });

  test("an object cut short of its length field is a FormatError", () => {
    const bytes = envelope("btreeNode", BODY);
    expect(decodeError(bytes.subarray(0, bytes.length - 3))).toBeInstanceOf(FormatError);
  });

  test("a body decompressing past the limit is a LimitError", () => {
    const bytes = envelope("btreeNode", new Uint8Array(200));
    expect(() => decodeEnvelope(bytes, "btreeNode", PATH, 100)).toThrow(LimitError);
  });
});
