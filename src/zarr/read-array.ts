import { LimitError } from "../errors.js";
import { decodeChunk } from "./chunk.js";
import { chunkGrid, type ZarrArrayMeta } from "./metadata.js";
import { copyRegion } from "./region.js";

/** Largest row of chunks decoded at once (Node's typed arrays stop a little above 4 GiB). */
const MAX_SLAB_BYTES = 2 ** 32;

/** Fetches a stored chunk by grid index; undefined when the key is absent. */
export type ChunkSource = (index: readonly number[]) => Promise<Uint8Array | undefined>;

/**
 * Yields the array's elements (little-endian, C order) as consecutive slabs, one per row of chunks along
 * the first dimension, so memory holds one row of chunks rather than the whole array.
 */
export async function* readArraySlabs(
  meta: ZarrArrayMeta,
  source: ChunkSource,
  describeChunk: (index: readonly number[]) => string,
): AsyncIterable<Uint8Array> {
  const { shape, chunkShape, dtype } = meta;
  if (shape.length === 0) {
    yield decodeChunk(meta, await source([]), describeChunk([])).subarray(0, dtype.itemSize);
    return;
  }
  if (shape.some((s) => s === 0)) return;
  const grid = chunkGrid(meta);
  const rest = grid.slice(1);
  const restCount = rest.reduce((a, b) => a * b, 1);
  for (let g0 = 0; g0 < (grid[0] as number); g0++) {
    const rows = Math.min(chunkShape[0] as number, (shape[0] as number) - g0 * (chunkShape[0] as number));
    const slabShape = [rows, ...shape.slice(1)];
    const slabBytes = slabShape.reduce((a, b) => a * b, 1) * dtype.itemSize;
    if (!Number.isSafeInteger(slabBytes) || slabBytes > MAX_SLAB_BYTES) {
      throw new LimitError(
        `one row of chunks of shape ${JSON.stringify(shape)} needs ${slabBytes} bytes, over the ${MAX_SLAB_BYTES}-byte limit`,
        {
          path: describeChunk([g0, ...rest.map(() => 0)]),
        },
      );
    }
    const slab = new Uint8Array(slabBytes);
    const indices: number[][] = [];
    for (let i = 0; i < restCount; i++) indices.push([g0, ...unravel(i, rest)]);
    const stored = await Promise.all(indices.map((index) => source(index)));
    indices.forEach((index, i) => {
      const chunk = decodeChunk(meta, stored[i], describeChunk(index));
      const origin = index.map((g, d) => g * (chunkShape[d] as number));
      const extent = origin.map((o, d) => Math.min(chunkShape[d] as number, (shape[d] as number) - o));
      copyRegion(chunk, chunkShape, slab, slabShape, [0, ...origin.slice(1)], extent, dtype.itemSize);
    });
    yield slab;
  }
}

/** The C-order multi-index of flat position `i` in a grid of shape `shape`. */
export function unravel(i: number, shape: readonly number[]): number[] {
  const out = new Array<number>(shape.length);
  for (let d = shape.length - 1; d >= 0; d--) {
    const n = shape[d] as number;
    out[d] = i % n;
    i = Math.floor(i / n);
  }
  return out;
}
