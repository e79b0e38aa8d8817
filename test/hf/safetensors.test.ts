import { expect, test } from "vitest";
import { buildHeader, parseHeader } from "../../src/hf/safetensors.js";

const tensors = [
  { name: "a", dtype: "BF16" as const, shape: [2, 3] },
  { name: "b", dtype: "BF16" as const, shape: [5] },
];

test("the header: 8-byte little-endian length, compact JSON with __metadata__ first, padded with spaces to 8 bytes", () => {
  const { header, offsets, dataBytes, fileBytes } = buildHeader(tensors);
  const json =
    '{"__metadata__":{"format":"pt"},"a":{"dtype":"BF16","shape":[2,3],"data_offsets":[0,12]},"b":{"dtype":"BF16","shape":[5],"data_offsets":[12,22]}}';
  const n = Math.ceil(json.length / 8) * 8;
  expect(new DataView(header.buffer).getBigUint64(0, true)).toBe(BigInt(n));
  expect(new TextDecoder().decode(header.subarray(8))).toBe(json + " ".repeat(n - json.length));
  expect(offsets).toEqual([
    [0, 12],
    [12, 22],
  ]);
  expect([dataBytes, fileBytes]).toEqual([22, 8 + n + 22]);
});

test("tensors are laid out in the order given, not by name", () => {
  const { offsets } = buildHeader([tensors[1] as never, tensors[0] as never]);
  expect(offsets).toEqual([
    [0, 10],
    [10, 22],
  ]);
});

test("a built header parses back to its tensors and metadata", () => {
  const parsed = parseHeader(buildHeader(tensors).header, "x");
  expect(parsed.metadata).toEqual({ format: "pt" });
  expect(parsed.tensors.map((t) => [t.name, t.dtype, t.shape, t.begin, t.end])).toEqual([
    ["a", "BF16", [2, 3], 0, 12],
    ["b", "BF16", [5], 12, 22],
  ]);
});

test("a header whose offsets disagree with its shape is refused", () => {
  const json = '{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}';
  const bytes = new Uint8Array(8 + json.length);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(json.length), true);
  bytes.set(new TextEncoder().encode(json), 8);
  expect(() => parseHeader(bytes, "x")).toThrow(/data_offsets do not match/);
});

/** A header of `json` alone, as parseHeader reads it. */
function headerOf(json: string): Uint8Array {
  const bytes = new Uint8Array(8 + json.length);
  new DataView(bytes.buffer).setBigUint64(0, BigInt(json.length), true);
  bytes.set(new TextEncoder().encode(json), 8);
  return bytes;
}

test("an import's reader takes F16 tensors (2 bytes each) when asked to; an export's does not", () => {
  const bytes = headerOf('{"a":{"dtype":"F16","shape":[3],"data_offsets":[0,6]}}');
  expect(parseHeader(bytes, "x", ["F32", "BF16", "F16"]).tensors[0]).toMatchObject({ name: "a", dtype: "F16", begin: 0, end: 6 });
  expect(() => parseHeader(bytes, "x")).toThrow(/is not a BF16\/F32 tensor/);
});

test("with the dtypes given, another dtype is refused naming the tensor and its dtype", () => {
  const bytes = headerOf('{"w":{"dtype":"F64","shape":[1],"data_offsets":[0,8]}}');
  expect(() => parseHeader(bytes, "x", ["F32", "BF16", "F16"])).toThrow('tensor "w" has dtype F64 (F32, BF16, F16 expected)');
});
