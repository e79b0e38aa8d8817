import { describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";

describe("crc32c", () => {
  test('the check value of "123456789" is 0xE3069283', () => {
    expect(crc32c(new TextEncoder().encode("123456789"))).toBe(0xe3069283);
  });

  test("the CRC of no bytes is 0", () => {
    expect(crc32c(new Uint8Array(0))).toBe(0);
  });

  test("is unsigned even when the top bit is set", () => {
    // 0xE3069283 has its top bit set: a signed result would be negative.
    expect(crc32c(new TextEncoder().encode("123456789"))).toBeGreaterThan(0);
  });

  test("covers only the view it is given, not the whole underlying buffer", () => {
    const buf = new TextEncoder().encode("xx123456789yy");
    expect(crc32c(buf.subarray(2, 11))).toBe(0xe3069283);
  });
});
