/** A buffer of `size` bytes holding `fill` (one element) repeated. */
export function fillBuffer(fill: Uint8Array, size: number): Uint8Array {
  const out = new Uint8Array(size);
  if (fill.every((b) => b === 0)) return out;
  for (let i = 0; i < size; i += fill.length) out.set(fill, i);
  return out;
}

/**
 * Copies the box of shape `extent` from `src` (a C-order array of shape `srcShape`, box at its origin) into
 * `dst` (shape `dstShape`) at `dstOrigin`. Contiguous runs of the last dimension are copied at once.
 */
export function copyRegion(
  src: Uint8Array,
  srcShape: readonly number[],
  dst: Uint8Array,
  dstShape: readonly number[],
  dstOrigin: readonly number[],
  extent: readonly number[],
  itemSize: number,
): void {
  const rank = extent.length;
  if (rank === 0) {
    dst.set(src.subarray(0, itemSize), 0);
    return;
  }
  if (extent.some((e) => e === 0)) return;
  const srcStrides = strides(srcShape, itemSize);
  const dstStrides = strides(dstShape, itemSize);
  const run = (extent[rank - 1] as number) * itemSize;
  const idx = new Array<number>(rank - 1).fill(0);
  for (;;) {
    let s = 0;
    let d = 0;
    for (let k = 0; k < rank - 1; k++) {
      s += (idx[k] as number) * (srcStrides[k] as number);
      d += ((idx[k] as number) + (dstOrigin[k] as number)) * (dstStrides[k] as number);
    }
    d += (dstOrigin[rank - 1] as number) * itemSize;
    dst.set(src.subarray(s, s + run), d);
    let k = rank - 2;
    for (; k >= 0; k--) {
      idx[k] = (idx[k] as number) + 1;
      if ((idx[k] as number) < (extent[k] as number)) break;
      idx[k] = 0;
    }
    if (k < 0) return;
  }
}

function strides(shape: readonly number[], itemSize: number): number[] {
  const out = new Array<number>(shape.length);
  let s = itemSize;
  for (let k = shape.length - 1; k >= 0; k--) {
    out[k] = s;
    s *= shape[k] as number;
  }
  return out;
}
