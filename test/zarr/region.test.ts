import { describe, expect, test } from "vitest";
import { copyRegion, fillBuffer } from "../../src/zarr/region.js";

/** A C-order array of `shape` whose element i (itemSize bytes) holds the bytes (i*itemSize + b) & 0xff. */
function iota(shape: readonly number[], itemSize = 1): Uint8Array {
  const n = shape.reduce((a, b) => a * b, 1) * itemSize;
  return Uint8Array.from({ length: n }, (_, i) => (i + 1) & 0xff);
}

/** Reference copy, one element at a time through multi-dimensional indices. */
function naiveCopy(
  src: Uint8Array,
  srcShape: readonly number[],
  dst: Uint8Array,
  dstShape: readonly number[],
  origin: readonly number[],
  extent: readonly number[],
  itemSize: number,
): void {
  const flat = (shape: readonly number[], idx: readonly number[]) => idx.reduce((acc, x, k) => acc * (shape[k] as number) + x, 0);
  const total = extent.reduce((a, b) => a * b, 1);
  for (let e = 0; e < total; e++) {
    const idx: number[] = [];
    let rest = e;
    for (let k = extent.length - 1; k >= 0; k--) {
      idx[k] = rest % (extent[k] as number);
      rest = Math.floor(rest / (extent[k] as number));
    }
    const s = flat(srcShape, idx) * itemSize;
    const d =
      flat(
        dstShape,
        idx.map((x, k) => x + (origin[k] as number)),
      ) * itemSize;
    dst.set(src.subarray(s, s + itemSize), d);
  }
}

describe("fillBuffer", () => {
  test("a zero fill gives a zeroed buffer of the size", () => {
    expect(fillBuffer(new Uint8Array(4), 12)).toEqual(new Uint8Array(12));
  });

  test("a one-byte fill repeats that byte", () => {
    expect(fillBuffer(Uint8Array.of(0x7f), 5)).toEqual(new Uint8Array(5).fill(0x7f));
  });

  test("a multi-byte fill repeats the element in order", () => {
    expect(fillBuffer(Uint8Array.of(1, 2, 3, 4), 12)).toEqual(Uint8Array.of(1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3, 4));
  });

  test("a fill whose bytes are partly zero is still repeated (float32 1.0 is 00 00 80 3f)", () => {
    expect(Array.from(fillBuffer(Uint8Array.of(0, 0, 0x80, 0x3f), 8))).toEqual([0, 0, 0x80, 0x3f, 0, 0, 0x80, 0x3f]);
  });

  test("size 0 gives an empty buffer for any fill", () => {
    expect(fillBuffer(Uint8Array.of(9, 9), 0)).toEqual(new Uint8Array(0));
  });

  test("the result is a fresh buffer: changing it leaves the fill alone", () => {
    const fill = Uint8Array.of(5, 6);
    const out = fillBuffer(fill, 4);
    out[0] = 0;
    expect(fill).toEqual(Uint8Array.of(5, 6));
  });

  test("a size that is not a multiple of the element size is refused (sizes are whole elements)", () => {
    expect(() => fillBuffer(Uint8Array.of(1, 2, 3, 4), 6)).toThrow(RangeError);
  });
});

describe("copyRegion", () => {
  test("a rank-0 (scalar) array copies one item", () => {
    const dst = new Uint8Array(4);
    copyRegion(Uint8Array.of(1, 2, 3, 4, 99), [], dst, [], [], [], 4);
    expect(dst).toEqual(Uint8Array.of(1, 2, 3, 4));
  });

  test("a 1-d box lands at its origin and nowhere else", () => {
    const dst = new Uint8Array(10);
    copyRegion(Uint8Array.of(7, 8, 9), [3], dst, [10], [4], [3], 1);
    expect(Array.from(dst)).toEqual([0, 0, 0, 0, 7, 8, 9, 0, 0, 0]);
  });

  test("a whole-array copy is a plain copy", () => {
    const src = iota([3, 4], 2);
    const dst = new Uint8Array(src.length);
    copyRegion(src, [3, 4], dst, [3, 4], [0, 0], [3, 4], 2);
    expect(dst).toEqual(src);
  });

  test("an edge chunk copies only its extent, from the top-left of the (full-shape) source", () => {
    // A 4x4 chunk at the bottom-right edge of a 6x6 array: only 2x2 of it is inside the array.
    const src = iota([4, 4]);
    const dst = new Uint8Array(36);
    copyRegion(src, [4, 4], dst, [6, 6], [4, 4], [2, 2], 1);
    const expected = new Uint8Array(36);
    naiveCopy(src, [4, 4], expected, [6, 6], [4, 4], [2, 2], 1);
    expect(dst).toEqual(expected);
    expect([dst[28], dst[29], dst[34], dst[35]]).toEqual([1, 2, 5, 6]);
  });

  test("a 3-d box with multi-byte items matches an element-by-element copy", () => {
    const srcShape = [2, 3, 4];
    const src = iota(srcShape, 4);
    const dst = new Uint8Array(5 * 6 * 7 * 4);
    const expected = new Uint8Array(dst.length);
    copyRegion(src, srcShape, dst, [5, 6, 7], [3, 2, 1], [2, 3, 3], 4);
    naiveCopy(src, srcShape, expected, [5, 6, 7], [3, 2, 1], [2, 3, 3], 4);
    expect(dst).toEqual(expected);
  });

  test("an empty extent in any dimension copies nothing", () => {
    const dst = new Uint8Array(16).fill(0xee);
    copyRegion(iota([4, 4]), [4, 4], dst, [4, 4], [0, 0], [4, 0], 1);
    copyRegion(iota([4, 4]), [4, 4], dst, [4, 4], [0, 0], [0, 4], 1);
    expect(dst).toEqual(new Uint8Array(16).fill(0xee));
  });

  test("boxes placed side by side tile the destination exactly", () => {
    const dst = new Uint8Array(4 * 6);
    for (const [r, c] of [
      [0, 0],
      [0, 3],
      [2, 0],
      [2, 3],
    ] as const) {
      const src = new Uint8Array(2 * 3).fill(r * 10 + c + 1);
      copyRegion(src, [2, 3], dst, [4, 6], [r, c], [2, 3], 1);
    }
    expect(Array.from(dst)).toEqual([
      ...[1, 1, 1, 4, 4, 4],
      ...[1, 1, 1, 4, 4, 4],
      ...[21, 21, 21, 24, 24, 24],
      ...[21, 21, 21, 24, 24, 24],
    ]);
  });

  test("a box whose source shape is larger than the extent skips the rest of each source row", () => {
    const src = iota([3, 5]);
    const dst = new Uint8Array(6);
    copyRegion(src, [3, 5], dst, [2, 3], [0, 0], [2, 3], 1);
    expect(Array.from(dst)).toEqual([1, 2, 3, 6, 7, 8]);
  });
});
