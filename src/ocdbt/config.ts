import type { ByteReader } from "./byte-reader.js";

export type ManifestKind = "single" | "numbered";
export type Compression = { readonly method: "none" } | { readonly method: "zstd"; readonly level: number };

/** The database configuration at the start of every manifest (OCDBT spec "Manifest format"). */
export interface OcdbtConfig {
  readonly uuid: Uint8Array;
  readonly manifestKind: ManifestKind;
  readonly maxInlineValueBytes: number;
  readonly maxDecodedNodeBytes: number;
  readonly versionTreeArityLog2: number;
  readonly compression: Compression;
}

export function decodeConfig(r: ByteReader): OcdbtConfig {
  const uuid = r.take(16, "uuid");
  const kindAt = r.offset;
  const kindByte = r.u8("manifest_kind");
  if (kindByte > 1) r.fail(`manifest_kind ${kindByte} (0 = single, 1 = numbered)`, kindAt);
  const maxInlineValueBytes = r.varint("max_inline_value_bytes", 32);
  const maxDecodedNodeBytes = r.varint("max_decoded_node_bytes", 32);
  const arityAt = r.offset;
  const versionTreeArityLog2 = r.u8("version_tree_arity_log2");
  if (versionTreeArityLog2 < 1 || versionTreeArityLog2 > 16)
    r.fail(`version_tree_arity_log2 ${versionTreeArityLog2} is not in 1..16`, arityAt);
  const methodAt = r.offset;
  const method = r.varint("compression_method", 32);
  let compression: Compression;
  if (method === 0) compression = { method: "none" };
  else if (method === 1) compression = { method: "zstd", level: r.i32le("zstd level") };
  else r.fail(`compression_method ${method} (0 = none, 1 = zstd)`, methodAt);
  return {
    uuid,
    manifestKind: kindByte === 0 ? "single" : "numbered",
    maxInlineValueBytes,
    maxDecodedNodeBytes,
    versionTreeArityLog2,
    compression,
  };
}
