import { decompressExact } from "../codecs/zstd.js";
import { FormatError, NotFoundError } from "../errors.js";
import { type Compressor, chunkGrid, product, type ZarrArrayMeta } from "./metadata.js";
import { copyRegion, fillBuffer } from "./region.js";
import { readShardIndex } from "./sharding.js";

/**
 * Decodes one stored chunk into its elements: little-endian, C order, the full chunk shape (edge chunks
 * included, as zarr stores them). `stored` undefined means the key is absent: the fill value where the
 * format allows it, an error where it does not (zarr v2 with `fill_value: null`, as Orbax writes).
 */
export function decodeChunk(meta: ZarrArrayMeta, stored: Uint8Array | undefined, path: string): Uint8Array {
  const size = product(meta.chunkShape) * meta.dtype.itemSize;
  if (stored === undefined) {
    if (meta.fill === null) throw new NotFoundError("chunk is missing and the array has no fill value", { path });
    return fillBuffer(meta.fill, size);
  }
  const enc = meta.encoding;
  if (enc.kind !== "v3-sharded") return decodeElements(stored, enc.compressor, size, path);

  const innerShape = enc.innerChunkShape;
  const innerGrid = chunkGrid({ shape: meta.chunkShape, chunkShape: innerShape });
  const innerCount = product(innerGrid);
  const ranges = readShardIndex(stored, enc, innerCount, path);
  const innerSize = product(innerShape) * meta.dtype.itemSize;
  // One inner chunk covering the whole shard (what Orbax writes) needs no re-assembly.
  if (innerCount === 1) {
    const r = ranges[0];
    if (r === null || r === undefined) return fillBuffer(meta.fill ?? new Uint8Array(meta.dtype.itemSize), size);
    return decodeElements(stored.subarray(r.offset, r.offset + r.length), enc.compressor, size, path);
  }
  const out = new Uint8Array(size);
  const index = new Array<number>(innerGrid.length).fill(0);
  for (let i = 0; i < innerCount; i++) {
    const r = ranges[i];
    const inner =
      r === null || r === undefined
        ? fillBuffer(meta.fill ?? new Uint8Array(meta.dtype.itemSize), innerSize)
        : decodeElements(stored.subarray(r.offset, r.offset + r.length), enc.compressor, innerSize, path);
    copyRegion(
      inner,
      innerShape,
      out,
      meta.chunkShape,
      index.map((g, d) => g * (innerShape[d] as number)),
      innerShape,
      meta.dtype.itemSize,
    );
    // Next inner chunk index in C order.
    for (let d = index.length - 1; d >= 0; d--) {
      index[d] = (index[d] as number) + 1;
      if ((index[d] as number) < (innerGrid[d] as number)) break;
      index[d] = 0;
    }
  }
  return out;
}

function decodeElements(bytes: Uint8Array, compressor: Compressor, size: number, path: string): Uint8Array {
  if (compressor === "zstd") return decompressExact(bytes, size, path);
  if (bytes.length !== size) throw new FormatError(`uncompressed chunk has ${bytes.length} bytes, expected ${size}`, { path });
  return bytes;
}
