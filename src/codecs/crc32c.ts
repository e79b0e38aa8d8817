// crc-32's CRC-32C entry point: pure JS, the same one Neuroglancer's OCDBT reader uses.
import CRC32C from "crc-32/crc32c.js";

/** CRC-32C (Castagnoli) of `bytes`, as an unsigned 32-bit number. */
export function crc32c(bytes: Uint8Array): number {
  return CRC32C.buf(bytes, 0) >>> 0;
}
