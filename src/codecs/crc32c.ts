// CRC-32C (Castagnoli): @node-rs/crc32's SIMD/SSE4.2 native implementation (several GB/s), so that every
// byte the converter writes can be checksummed without slowing the copy.
import { crc32c as native } from "@node-rs/crc32";

/** CRC-32C of `bytes`, as an unsigned 32-bit number; `previous` continues an earlier CRC over preceding bytes. */
export function crc32c(bytes: Uint8Array, previous = 0): number {
  return native(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength), previous) >>> 0;
}
