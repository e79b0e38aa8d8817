import { crc32c } from "../codecs/crc32c.js";
import { decompressBounded } from "../codecs/zstd.js";
import { ChecksumError, UnsupportedError } from "../errors.js";
import { ByteReader } from "./byte-reader.js";

/** The three kinds of encoded object in an OCDBT database, told apart by their big-endian magic. */
export const MAGIC = {
  manifest: 0x0cdb3a2a,
  versionTreeNode: 0x0cdb1234,
  btreeNode: 0x0cdb20de,
} as const;
export type EnvelopeKind = keyof typeof MAGIC;

const HEADER_BYTES = 12; // magic (4) + length (8)
const CRC_BYTES = 4;

/**
 * Checks the common envelope (magic, length, version 0, CRC-32C over everything before the checksum) and
 * returns the body, decompressed if the envelope says zstd. `offset` is where the object starts in its
 * file, so errors point at the real byte position.
 */
export function decodeEnvelope(bytes: Uint8Array, kind: EnvelopeKind, path: string, maxDecodedBytes: number, offset = 0): ByteReader {
  const r = new ByteReader(bytes, path, offset);
  if (bytes.length < HEADER_BYTES + 2 + CRC_BYTES) r.fail(`truncated ${kind}: ${bytes.length} bytes`, 0);
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const magic = view.getUint32(0, false);
  if (magic !== MAGIC[kind])
    r.fail(`bad magic 0x${magic.toString(16).padStart(8, "0")} for ${kind} (expected 0x${MAGIC[kind].toString(16).padStart(8, "0")})`, 0);
  const length = view.getBigUint64(4, true);
  if (length !== BigInt(bytes.length)) r.fail(`${kind} length field says ${length} bytes, object has ${bytes.length}`, 4);
  const stored = view.getUint32(bytes.length - CRC_BYTES, true);
  const actual = crc32c(bytes.subarray(0, bytes.length - CRC_BYTES));
  if (stored !== actual) {
    throw new ChecksumError(`${kind} CRC-32C mismatch: stored 0x${hex32(stored)}, computed 0x${hex32(actual)}`, {
      path,
      offset: offset + bytes.length - CRC_BYTES,
    });
  }
  r.take(HEADER_BYTES, "header");
  const versionAt = r.offset;
  const version = r.varint("format version", 32);
  if (version !== 0)
    throw new UnsupportedError(`${kind} format version ${version} (only 0 is defined)`, { path, offset: offset + versionAt });
  const compressionAt = r.offset;
  const compression = r.varint("compression format", 32);
  const bodyStart = r.offset;
  const payload = bytes.subarray(bodyStart, bytes.length - CRC_BYTES);
  switch (compression) {
    case 0:
      return new ByteReader(payload, path, offset + bodyStart);
    case 1:
      return new ByteReader(decompressBounded(payload, maxDecodedBytes, path, offset + bodyStart), path, 0, offset + bodyStart);
    default:
      throw new UnsupportedError(`${kind} compression format ${compression} (0 = raw, 1 = zstd)`, {
        path,
        offset: offset + compressionAt,
      });
  }
}

function hex32(v: number): string {
  return v.toString(16).padStart(8, "0");
}
