import { MetadataError, UnsupportedError } from "../errors.js";
import { type DType, dtypeFromZarr2, dtypeFromZarr3 } from "./dtype.js";

/** How a stored chunk's bytes encode its elements (little-endian, C order in every supported case). */
export type Compressor = "zstd" | "none";

export type ChunkEncoding =
  /** zarr v2: the chunk is `compressor(elements)`. */
  | { readonly kind: "v2"; readonly compressor: Compressor; readonly level: number | undefined }
  /** zarr v3 without sharding: `bytes` then optionally `zstd`. */
  | { readonly kind: "v3"; readonly compressor: Compressor }
  /** zarr v3 `sharding_indexed`: a grid of inner chunks plus an index of (offset, nbytes) pairs. */
  | {
      readonly kind: "v3-sharded";
      readonly innerChunkShape: readonly number[];
      readonly compressor: Compressor;
      readonly indexLocation: "start" | "end";
      readonly indexChecksum: boolean;
    };

export type ChunkKeyEncoding = { readonly prefix: "" | "c"; readonly separator: "." | "/" };

export interface ZarrArrayMeta {
  readonly zarrFormat: 2 | 3;
  /** `.zarray` or `zarr.json`, relative to the array's key prefix. */
  readonly metadataKey: ".zarray" | "zarr.json";
  readonly shape: readonly number[];
  /** The storage grid: zarr v2 chunks, or zarr v3 regular-grid chunks (= shards when sharded). */
  readonly chunkShape: readonly number[];
  readonly dtype: DType;
  /** One element of fill value, or null when there is none (zarr v2 `fill_value: null`). */
  readonly fill: Uint8Array | null;
  readonly encoding: ChunkEncoding;
  readonly keyEncoding: ChunkKeyEncoding;
}

interface Where {
  path: string;
  key?: string;
}

const text = new TextDecoder();

/** Parses `.zarray` (zarr v2) or `zarr.json` (zarr v3) bytes; `where` names the key for errors. */
export function parseZarrMetadata(kind: ".zarray" | "zarr.json", bytes: Uint8Array, where: Where): ZarrArrayMeta {
  let json: unknown;
  try {
    json = JSON.parse(text.decode(bytes));
  } catch (e) {
    throw new MetadataError(`${kind} is not valid JSON (${(e as Error).message})`, where);
  }
  if (typeof json !== "object" || json === null || Array.isArray(json)) throw new MetadataError(`${kind} is not a JSON object`, where);
  return kind === ".zarray" ? parseZarr2(json as Record<string, unknown>, where) : parseZarr3(json as Record<string, unknown>, where);
}

function field(obj: Record<string, unknown>, name: string, where: Where, doc: string): unknown {
  if (!(name in obj)) throw new MetadataError(`${doc}: missing field "${name}"`, where);
  return obj[name];
}

function dims(v: unknown, name: string, where: Where, min: number): number[] {
  if (!Array.isArray(v) || !v.every((x) => Number.isSafeInteger(x) && x >= min)) {
    throw new MetadataError(`field "${name}" must be a list of integers >= ${min}, got ${JSON.stringify(v)}`, where);
  }
  return v as number[];
}

function parseZarr2(j: Record<string, unknown>, where: Where): ZarrArrayMeta {
  const doc = ".zarray";
  if (field(j, "zarr_format", where, doc) !== 2) throw new MetadataError(`zarr_format ${JSON.stringify(j.zarr_format)} in .zarray`, where);
  const shape = dims(field(j, "shape", where, doc), "shape", where, 0);
  const chunkShape = dims(field(j, "chunks", where, doc), "chunks", where, 1);
  if (chunkShape.length !== shape.length)
    throw new MetadataError(`"chunks" has rank ${chunkShape.length}, "shape" has rank ${shape.length}`, where);
  const dtype = dtypeFromZarr2(field(j, "dtype", where, doc), where);
  const order = j.order ?? "C";
  if (order !== "C") throw new UnsupportedError(`zarr v2 order ${JSON.stringify(order)} (only "C")`, where);
  const filters = j.filters ?? null;
  if (filters !== null && !(Array.isArray(filters) && filters.length === 0))
    throw new UnsupportedError(`zarr v2 filters ${JSON.stringify(filters)}`, where);
  const sep = j.dimension_separator ?? ".";
  if (sep !== "." && sep !== "/") throw new MetadataError(`dimension_separator ${JSON.stringify(sep)}`, where);
  const comp = j.compressor ?? null;
  let compressor: Compressor;
  let level: number | undefined;
  if (comp === null) compressor = "none";
  else if (typeof comp === "object" && (comp as { id?: unknown }).id === "zstd") {
    compressor = "zstd";
    const l = (comp as { level?: unknown }).level;
    level = typeof l === "number" ? l : undefined;
  } else throw new UnsupportedError(`zarr v2 compressor ${JSON.stringify(comp)} (supported: zstd, null)`, where);
  return {
    zarrFormat: 2,
    metadataKey: ".zarray",
    shape,
    chunkShape,
    dtype,
    fill: j.fill_value === null || j.fill_value === undefined ? null : encodeFill(dtype, j.fill_value, where),
    encoding: { kind: "v2", compressor, level },
    keyEncoding: { prefix: "", separator: sep },
  };
}

interface Codec {
  name: string;
  configuration?: Record<string, unknown>;
}

function codecList(v: unknown, name: string, where: Where): Codec[] {
  if (!Array.isArray(v) || !v.every((c) => typeof c === "object" && c !== null && typeof (c as Codec).name === "string")) {
    throw new MetadataError(`"${name}" must be a list of codecs`, where);
  }
  return v as Codec[];
}

/** `bytes` (little-endian) optionally followed by `zstd`: the only array-to-bytes chains Orbax writes. */
function plainChain(codecs: Codec[], where: Where): Compressor {
  const [first, ...rest] = codecs;
  if (first?.name !== "bytes")
    throw new UnsupportedError(`zarr v3 codec chain ${JSON.stringify(codecs.map((c) => c.name))} (expected bytes[, zstd])`, where);
  const endian = first.configuration?.endian ?? "little";
  if (endian !== "little") throw new UnsupportedError(`zarr v3 bytes codec endian ${JSON.stringify(endian)}`, where);
  if (rest.length === 0) return "none";
  if (rest.length === 1 && rest[0]?.name === "zstd") return "zstd";
  throw new UnsupportedError(`zarr v3 codec chain ${JSON.stringify(codecs.map((c) => c.name))} (expected bytes[, zstd])`, where);
}

function parseZarr3(j: Record<string, unknown>, where: Where): ZarrArrayMeta {
  const doc = "zarr.json";
  if (field(j, "zarr_format", where, doc) !== 3)
    throw new MetadataError(`zarr_format ${JSON.stringify(j.zarr_format)} in zarr.json`, where);
  if ((j.node_type ?? "array") !== "array") throw new MetadataError(`node_type ${JSON.stringify(j.node_type)} is not an array`, where);
  const shape = dims(field(j, "shape", where, doc), "shape", where, 0);
  const grid = field(j, "chunk_grid", where, doc) as { name?: unknown; configuration?: { chunk_shape?: unknown } } | null;
  if (grid?.name !== "regular") throw new UnsupportedError(`zarr v3 chunk_grid ${JSON.stringify(grid)} (only regular)`, where);
  const chunkShape = dims(grid.configuration?.chunk_shape, "chunk_grid.configuration.chunk_shape", where, 1);
  if (chunkShape.length !== shape.length)
    throw new MetadataError(`chunk_shape has rank ${chunkShape.length}, shape has rank ${shape.length}`, where);
  const dtype = dtypeFromZarr3(field(j, "data_type", where, doc), where);
  const codecs = codecList(field(j, "codecs", where, doc), "codecs", where);
  let encoding: ChunkEncoding;
  const sharding = codecs[0];
  if (sharding?.name === "sharding_indexed") {
    if (codecs.length !== 1) throw new UnsupportedError("zarr v3 codecs after sharding_indexed", where);
    const cfg = sharding.configuration ?? {};
    const inner = dims(cfg.chunk_shape, "sharding_indexed.chunk_shape", where, 1);
    if (inner.length !== shape.length) throw new MetadataError("sharding_indexed.chunk_shape rank differs from shape", where);
    inner.forEach((c, d) => {
      if ((chunkShape[d] as number) % c !== 0)
        throw new MetadataError("sharding_indexed.chunk_shape does not divide the shard shape", where);
    });
    const indexCodecs = codecList(cfg.index_codecs ?? [{ name: "bytes" }, { name: "crc32c" }], "index_codecs", where);
    const names = indexCodecs.map((c) => c.name).join(",");
    if (names !== "bytes" && names !== "bytes,crc32c") throw new UnsupportedError(`sharding index_codecs ${names}`, where);
    const loc = cfg.index_location ?? "end";
    if (loc !== "start" && loc !== "end") throw new MetadataError(`index_location ${JSON.stringify(loc)}`, where);
    encoding = {
      kind: "v3-sharded",
      innerChunkShape: inner,
      compressor: plainChain(codecList(cfg.codecs, "sharding_indexed.codecs", where), where),
      indexLocation: loc,
      indexChecksum: names === "bytes,crc32c",
    };
  } else {
    encoding = { kind: "v3", compressor: plainChain(codecs, where) };
  }
  const cke = (j.chunk_key_encoding ?? { name: "default" }) as { name?: unknown; configuration?: { separator?: unknown } };
  let keyEncoding: ChunkKeyEncoding;
  if (cke.name === "default") keyEncoding = { prefix: "c", separator: cke.configuration?.separator === "." ? "." : "/" };
  else if (cke.name === "v2") keyEncoding = { prefix: "", separator: cke.configuration?.separator === "/" ? "/" : "." };
  else throw new UnsupportedError(`chunk_key_encoding ${JSON.stringify(cke)}`, where);
  return {
    zarrFormat: 3,
    metadataKey: "zarr.json",
    shape,
    chunkShape,
    dtype,
    fill: encodeFill(dtype, j.fill_value ?? 0, where),
    encoding,
    keyEncoding,
  };
}

/** The key of chunk `index` relative to the array's prefix (`0.1`, `c/0/1`; rank 0: `0` or `c`). */
export function chunkKey(meta: ZarrArrayMeta, index: readonly number[]): string {
  const { prefix, separator } = meta.keyEncoding;
  if (prefix === "c") return index.length === 0 ? "c" : `c${separator}${index.join(separator)}`;
  return index.length === 0 ? "0" : index.join(separator);
}

/** Number of chunks along each dimension. */
export function chunkGrid(meta: Pick<ZarrArrayMeta, "shape" | "chunkShape">): number[] {
  return meta.shape.map((s, d) => Math.ceil(s / (meta.chunkShape[d] as number)));
}

export function product(xs: readonly number[]): number {
  return xs.reduce((a, b) => a * b, 1);
}

/** Encodes a JSON fill value as one little-endian element of `dtype`. */
function encodeFill(dtype: DType, v: unknown, where: Where): Uint8Array {
  const out = new Uint8Array(dtype.itemSize);
  const view = new DataView(out.buffer);
  if (typeof v === "string" && /^0x[0-9a-f]+$/i.test(v)) {
    // Raw bit pattern (zarr v3 spec), most significant byte first.
    let bits = BigInt(v);
    for (let i = 0; i < dtype.itemSize; i++, bits >>= 8n) out[i] = Number(bits & 0xffn);
    return out;
  }
  if (v === 0 || v === false || v === "0") return out;
  const num =
    typeof v === "number"
      ? v
      : v === true
        ? 1
        : v === "NaN"
          ? Number.NaN
          : v === "Infinity"
            ? Infinity
            : v === "-Infinity"
              ? -Infinity
              : undefined;
  if (num === undefined) throw new UnsupportedError(`fill_value ${JSON.stringify(v)} for ${dtype.name}`, where);
  if (/int|bool/.test(dtype.name) && !Number.isInteger(num))
    throw new MetadataError(`fill_value ${JSON.stringify(v)} is not an integer (${dtype.name})`, where);
  switch (dtype.name) {
    case "bool":
    case "uint8":
      view.setUint8(0, num);
      return out;
    case "int8":
      view.setInt8(0, num);
      return out;
    case "int16":
      view.setInt16(0, num, true);
      return out;
    case "uint16":
      view.setUint16(0, num, true);
      return out;
    case "int32":
      view.setInt32(0, num, true);
      return out;
    case "uint32":
      view.setUint32(0, num, true);
      return out;
    case "int64":
      view.setBigInt64(0, BigInt(num), true);
      return out;
    case "uint64":
      view.setBigUint64(0, BigInt(num), true);
      return out;
    case "float32":
    case "complex64":
      view.setFloat32(0, num, true);
      return out;
    case "float64":
    case "complex128":
      view.setFloat64(0, num, true);
      return out;
    case "bfloat16": {
      const f = new DataView(new ArrayBuffer(4));
      f.setFloat32(0, num, true);
      view.setUint16(0, f.getUint16(2, true), true);
      return out;
    }
    default:
      throw new UnsupportedError(`fill_value ${JSON.stringify(v)} for ${dtype.name}`, where);
  }
}
