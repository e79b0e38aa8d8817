import { crc32c } from "../codecs/crc32c.js";
import { ChecksumError, FormatError } from "../errors.js";
import type { ChunkEncoding } from "./metadata.js";

/** Where one inner chunk lies inside a shard blob; null when it is absent (all fill value). */
export type InnerChunkRange = { readonly offset: number; readonly length: number } | null;

const MISSING = 0xffffffffffffffffn;

/**
 * Reads a `sharding_indexed` shard's index: one (offset, nbytes) pair of uint64 LE per inner chunk in C
 * order, at the start or end of the blob, followed by its CRC-32C when the index codecs say so.
 */
export function readShardIndex(
  blob: Uint8Array,
  encoding: Extract<ChunkEncoding, { kind: "v3-sharded" }>,
  innerCount: number,
  path: string,
): InnerChunkRange[] {
  const indexBytes = innerCount * 16;
  const total = indexBytes + (encoding.indexChecksum ? 4 : 0);
  if (blob.length < total) throw new FormatError(`shard of ${blob.length} bytes is smaller than its ${total}-byte index`, { path });
  const start = encoding.indexLocation === "end" ? blob.length - total : 0;
  const index = blob.subarray(start, start + indexBytes);
  const view = new DataView(blob.buffer, blob.byteOffset, blob.byteLength);
  if (encoding.indexChecksum) {
    const stored = view.getUint32(start + indexBytes, true);
    const actual = crc32c(index);
    if (stored !== actual) {
      throw new ChecksumError(`shard index CRC-32C mismatch: stored 0x${stored.toString(16)}, computed 0x${actual.toString(16)}`, {
        path,
        offset: start + indexBytes,
      });
    }
  }
  const out: InnerChunkRange[] = [];
  for (let i = 0; i < innerCount; i++) {
    const offset = view.getBigUint64(start + i * 16, true);
    const length = view.getBigUint64(start + i * 16 + 8, true);
    if (offset === MISSING && length === MISSING) {
      out.push(null);
      continue;
    }
    if (offset + length > BigInt(blob.length)) {
      throw new FormatError(`inner chunk ${i} range ${offset}+${length} lies outside the ${blob.length}-byte shard`, {
        path,
        offset: start + i * 16,
      });
    }
    out.push({ offset: Number(offset), length: Number(length) });
  }
  return out;
}
