// TEST-ONLY OCDBT encoder, the one every test uses (test/ocdbt, test/codecs, test/fuzz): just enough of
// the OCDBT format (TensorStore's kvstore/ocdbt/format/, https://google.github.io/tensorstore/kvstore/ocdbt/)
// to craft databases and edge cases. It writes what TensorStore writes (shortest varints; zstd as hand-made
// raw-block frames) and validates nothing, so tests can also build invalid objects on purpose. Two layers:
//  - byte builders from raw fields (file indices, relative keys): envelope, config, dataFileTable,
//    manifestBody, leafBody, interiorBody, versionLeafBody, versionInteriorBody;
//  - encoders from the decoded model (src/ocdbt types: Manifest, BtreeNode) that record where every field
//    lies (FieldWriter), so the fuzz tests can change exactly one field: encodeManifest, encodeBtreeNode.
// Both layers share the same column writers below.
import { crc32c } from "../../src/codecs/crc32c.js";
import type { BtreeNode, InteriorEntry as DecodedInteriorEntry, LeafEntry as DecodedLeafEntry } from "../../src/ocdbt/btree.js";
import type { OcdbtConfig } from "../../src/ocdbt/config.js";
import type { DataFileId } from "../../src/ocdbt/data-file-table.js";
import { type EnvelopeKind, MAGIC } from "../../src/ocdbt/envelope.js";
import type { Manifest } from "../../src/ocdbt/manifest.js";

export type Bytes = Uint8Array;
type Part = ArrayLike<number> | string;

const utf8 = new TextEncoder();

/** Concatenates byte arrays, number lists (one byte each) and strings (UTF-8). */
export function cat(...parts: Part[]): Uint8Array {
  const arrays = parts.map((p) => (typeof p === "string" ? utf8.encode(p) : p instanceof Uint8Array ? p : Uint8Array.from(p)));
  const out = new Uint8Array(arrays.reduce((n, a) => n + a.length, 0));
  let at = 0;
  for (const a of arrays) {
    out.set(a, at);
    at += a.length;
  }
  return out;
}

/** `cat` under the fuzz tests' name. */
export const concat: (...parts: ArrayLike<number>[]) => Uint8Array = cat;

/** Shortest unsigned LEB128. */
export function varint(value: number | bigint): number[] {
  let v = BigInt(value);
  if (v < 0n) throw new Error(`negative varint ${v}`);
  const out: number[] = [];
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v === 0n ? b : b | 0x80);
  } while (v !== 0n);
  return out;
}

/** `varint` under the fuzz tests' name. */
export const varintBytes = varint;

/** A varint padded with redundant continuation bytes to `length` bytes (riegeli accepts up to 10 for 64 bits). */
export function overlongVarint(v: number | bigint, length: number): number[] {
  const out = varint(v);
  while (out.length < length) {
    out[out.length - 1] = (out[out.length - 1] as number) | 0x80;
    out.push(0);
  }
  return out;
}

export function u32le(v: number): number[] {
  return [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, (v >>> 24) & 0xff];
}

export function u64le(v: number | bigint): number[] {
  const out: number[] = [];
  let x = BigInt.asUintN(64, BigInt(v));
  for (let i = 0; i < 8; i++, x >>= 8n) out.push(Number(x & 0xffn));
  return out;
}

/** The "missing" sentinel (2^64-1): offset and length of an empty tree. */
export const MISSING = (1n << 64n) - 1n;

function commonPrefix(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

// ---------------------------------------------------------------------------------------------- field recording

export type FieldKind = "u8" | "varint" | "u32" | "u64" | "bytes";

/** Where one encoded field lies in a body, so a test can replace exactly that field. */
export interface Field {
  readonly name: string;
  readonly kind: FieldKind;
  readonly start: number;
  readonly end: number;
}

/** Appends fields and records where each lies. Every encoder below writes through one. */
export class FieldWriter {
  private readonly out: number[] = [];
  readonly fields: Field[] = [];

  private add(name: string, kind: FieldKind, bytes: ArrayLike<number>): void {
    const start = this.out.length;
    for (let i = 0; i < bytes.length; i++) this.out.push(bytes[i] as number);
    this.fields.push({ name, kind, start, end: this.out.length });
  }
  u8(v: number, name: string): void {
    this.add(name, "u8", [v & 0xff]);
  }
  varint(v: number | bigint, name: string): void {
    this.add(name, "varint", varint(v));
  }
  u32le(v: number, name: string): void {
    this.add(name, "u32", u32le(v));
  }
  u64le(v: number | bigint, name: string): void {
    this.add(name, "u64", u64le(v));
  }
  bytes(b: ArrayLike<number>, name: string): void {
    this.add(name, "bytes", b);
  }
  finish(): Uint8Array {
    return Uint8Array.from(this.out);
  }
}

/** `body` with `field` replaced by `replacement` (which may have another length). */
export function replaceField(body: Uint8Array, field: Field, replacement: ArrayLike<number>): Uint8Array {
  const out = new Uint8Array(body.length - (field.end - field.start) + replacement.length);
  out.set(body.subarray(0, field.start), 0);
  out.set(Array.from(replacement), field.start);
  out.set(body.subarray(field.end), field.start + replacement.length);
  return out;
}

const written = (write: (w: FieldWriter) => void): Uint8Array => {
  const w = new FieldWriter();
  write(w);
  return w.finish();
};

// ---------------------------------------------------------------------------------------------- zstd

/** zstd frames of raw (stored) blocks only: a valid frame without a compressor. */
export interface ZstdFrameOptions {
  /** Frame_Content_Size to declare; null omits it; default: the real size. */
  readonly contentSize?: number | bigint | null;
  /** Frame_Content_Size_flag (0..3); default: 2 (4 bytes), or 3 when the declared size needs 8. */
  readonly fcsFlag?: 0 | 1 | 2 | 3;
  /** Single_Segment_flag; default true (no window descriptor, window = content size). */
  readonly singleSegment?: boolean;
  /** The window descriptor byte when not single-segment; default: the smallest window that fits a block. */
  readonly windowDescriptor?: number;
  /** Raw block size (default 128 KiB, the format's maximum). */
  readonly blockSize?: number;
  /** Sets Content_Checksum_flag and appends 4 (unchecked) bytes. */
  readonly checksum?: boolean;
  /** Drops the Last_Block flag of the final block (a frame that never ends). */
  readonly noLastBlock?: boolean;
}

export function zstdFrame(data: Uint8Array, o: ZstdFrameOptions = {}): Uint8Array {
  const singleSegment = o.singleSegment ?? true;
  const declared = o.contentSize === undefined ? BigInt(data.length) : o.contentSize === null ? null : BigInt(o.contentSize);
  let fcsFlag = o.fcsFlag ?? (declared !== null && declared >= 2n ** 32n ? 3 : 2);
  if (declared === null && o.fcsFlag === undefined) fcsFlag = 0;
  const fcsBytes = fcsFlag === 0 ? (singleSegment ? 1 : 0) : 1 << fcsFlag;
  const fhd = (fcsFlag << 6) | (singleSegment ? 0x20 : 0) | (o.checksum ? 0x04 : 0);
  const out: number[] = [...u32le(0xfd2fb528), fhd];
  const blockSize = Math.max(1, Math.min(o.blockSize ?? 131072, 131072));
  if (!singleSegment) {
    let log = 10;
    while (2 ** log < Math.min(blockSize, Math.max(data.length, 1))) log++;
    out.push(o.windowDescriptor ?? (log - 10) << 3);
  }
  let v = (declared ?? 0n) - (fcsFlag === 1 ? 256n : 0n);
  if (v < 0n) v = 0n;
  for (let i = 0; i < fcsBytes; i++) {
    out.push(Number(v & 0xffn));
    v >>= 8n;
  }
  let pos = 0;
  do {
    const size = Math.min(blockSize, data.length - pos);
    const last = pos + size >= data.length && !o.noLastBlock ? 1 : 0;
    out.push(...blockHeader(last, 0, size));
    for (let i = 0; i < size; i++) out.push(data[pos + i] as number);
    pos += size;
  } while (pos < data.length);
  if (o.checksum) out.push(0, 0, 0, 0);
  return Uint8Array.from(out);
}

export interface RawFrameOptions {
  /** Declare the content size (single-segment frame, as riegeli writes small nodes). Default true. */
  contentSize?: boolean;
  /** Override the declared size (to lie about it). */
  declaredSize?: number;
}

/**
 * A zstd frame as riegeli writes a node: the smallest content-size field; without a content size, a
 * 128 KiB window (not single-segment).
 */
export function zstdRawFrame(data: Uint8Array, options: RawFrameOptions = {}): Uint8Array {
  if (!(options.contentSize ?? true)) return zstdFrame(data, { contentSize: null, singleSegment: false, windowDescriptor: 7 << 3 });
  const size = options.declaredSize ?? data.length;
  // Single-segment: FCS field of 1, 2 (value - 256) or 4 bytes.
  return zstdFrame(data, { contentSize: size, fcsFlag: size < 256 ? 0 : size < 65536 + 256 ? 1 : 2 });
}

/** A zstd block header: last flag, type (0 raw, 1 RLE, 2 compressed), size. */
export function blockHeader(last: number, type: number, size: number): number[] {
  const v = last | (type << 1) | (size << 3);
  return [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff];
}

/**
 * A frame of `size` copies of `byte` in RLE blocks of 128 KiB without a content size (a 128 KiB window): a few
 * bytes per block, so a frame that inflates to gigabytes is tens of KiB, and only decoding it tells its size.
 */
export function zstdRleFrameWithoutSize(byte: number, size: number): Uint8Array {
  const blocks = Math.max(1, Math.ceil(size / 131072));
  const out = new Uint8Array(6 + blocks * 4);
  out.set([...u32le(0xfd2fb528), 0x00, 7 << 3]);
  for (let b = 0, left = size; b < blocks; b++) {
    const n = Math.min(131072, left);
    left -= n;
    out.set([...blockHeader(b === blocks - 1 ? 1 : 0, 1, n), byte], 6 + b * 4);
  }
  return out;
}

/** A skippable frame (RFC 8878 §3.1.2) with `n` bytes of content; `declared` may claim another size. */
export function zstdSkippableFrame(n: number, magicNibble = 0, declared = n): Uint8Array {
  return cat([0x50 | (magicNibble & 0xf), 0x2a, 0x4d, 0x18], u32le(declared >>> 0), new Uint8Array(n));
}

// ---------------------------------------------------------------------------------------------- envelope

export interface RawEnvelopeOptions {
  /** 0 = raw, 1 = zstd (then `payload` must already be zstd frames). */
  readonly compression: number;
  /** Raw bytes of the version varint (default `[0]`). */
  readonly versionBytes?: readonly number[];
  /** Raw bytes of the compression varint (default: `compression` encoded). */
  readonly compressionBytes?: readonly number[];
  readonly magic?: number;
  /** Length field to write (default: the real length). */
  readonly length?: bigint;
  /** Store a wrong CRC (default: the correct one). */
  readonly badCrc?: boolean;
}

/** magic (BE) | length (u64 LE, incl. CRC) | version varint | compression varint | payload | CRC-32C (LE). */
export function encodeEnvelope(kind: EnvelopeKind, payload: Uint8Array, o: RawEnvelopeOptions): Uint8Array {
  const version = o.versionBytes ?? [0];
  const compression = o.compressionBytes ?? varint(o.compression);
  const total = 12 + version.length + compression.length + payload.length + 4;
  const m = o.magic ?? MAGIC[kind];
  const withoutCrc = cat(
    [m >>> 24, (m >>> 16) & 0xff, (m >>> 8) & 0xff, m & 0xff],
    u64le(o.length ?? total),
    version,
    compression,
    payload,
  );
  const crc = crc32c(withoutCrc);
  return cat(withoutCrc, u32le(o.badCrc ? (crc ^ 1) >>> 0 : crc));
}

export interface EnvelopeOptions {
  /** 0 = raw, 1 = zstd (the body is wrapped in a raw-block frame), anything else is written as given. */
  compression?: number;
  version?: number;
  /** Frame options when compression = 1. */
  zstd?: RawFrameOptions;
}

/** An envelope around `body` (zstd-framed by default, as TensorStore writes). */
export function envelope(kind: EnvelopeKind, body: Uint8Array, options: EnvelopeOptions = {}): Uint8Array {
  const compression = options.compression ?? 1;
  const payload = compression === 1 ? zstdRawFrame(body, options.zstd) : body;
  return encodeEnvelope(kind, payload, { compression, versionBytes: varint(options.version ?? 0) });
}

/** The fuzz tests' common case: a body stored raw, or zstd-framed with default frame options. */
export function envelopeOf(kind: EnvelopeKind, body: Uint8Array, zstd = false): Uint8Array {
  return zstd ? encodeEnvelope(kind, zstdFrame(body), { compression: 1 }) : encodeEnvelope(kind, body, { compression: 0 });
}

/** Recomputes the length field and CRC of an envelope after its bytes were edited in place or resized. */
export function resealEnvelope(bytes: Uint8Array): Uint8Array {
  const out = bytes.slice();
  if (out.length < 16) return out;
  const view = new DataView(out.buffer);
  view.setBigUint64(4, BigInt(out.length), true);
  view.setUint32(out.length - 4, crc32c(out.subarray(0, out.length - 4)), true);
  return out;
}

// ---------------------------------------------------------------------------------------------- data file table

export type FileId = readonly [basePath: string, relativePath: string];

/**
 * Writes the table in the given order the way TensorStore's DataFileTableBuilder does: the shared
 * prefix reaches into the relative path only when both base paths are equal.
 */
export function writeDataFileTable(w: FieldWriter, files: readonly FileId[]): void {
  const paths = files.map(([b, r]) => utf8.encode(b + r));
  const bases = files.map(([b]) => utf8.encode(b));
  const prefixes = files.map((f, i) => {
    if (i === 0) return 0;
    const prev = files[i - 1] as FileId;
    if (prev[0] === f[0]) return commonPrefix(paths[i - 1] as Bytes, paths[i] as Bytes);
    return commonPrefix(bases[i - 1] as Bytes, bases[i] as Bytes);
  });
  w.varint(files.length, "data file count");
  for (let i = 1; i < files.length; i++) w.varint(prefixes[i] as number, "data file path prefix length");
  for (let i = 0; i < files.length; i++) w.varint((paths[i] as Bytes).length - (prefixes[i] as number), "data file path suffix length");
  for (let i = 0; i < files.length; i++) w.varint((bases[i] as Bytes).length, "data file base path length");
  for (let i = 0; i < files.length; i++) w.bytes((paths[i] as Bytes).subarray(prefixes[i] as number), "data file path suffix");
}

export function dataFileTable(files: readonly FileId[]): Uint8Array {
  return written((w) => writeDataFileTable(w, files));
}

/** Collects data files in first-use order; base paths are stored relative to the node's transitive path. */
class FileTable {
  readonly files: FileId[] = [];
  private readonly index = new Map<string, number>();
  constructor(private readonly transitive: string) {}
  add(id: DataFileId): number {
    if (!id.basePath.startsWith(this.transitive)) throw new Error(`base path ${id.basePath} outside ${this.transitive}`);
    const base = id.basePath.slice(this.transitive.length);
    const k = `${base}\0${id.relativePath}`;
    let i = this.index.get(k);
    if (i === undefined) {
      i = this.files.length;
      this.files.push([base, id.relativePath]);
      this.index.set(k, i);
    }
    return i;
  }
}

// ---------------------------------------------------------------------------------------------- node references

/** A node (or value) reference with its subtree statistics; `file` is an index into the data file table. */
export interface NodeRef {
  file: number;
  offset: number | bigint;
  length: number | bigint;
  numKeys?: number;
  numTreeBytes?: number;
  numIndirectValueBytes?: number;
}

/** (file, offset, length) in column order, as every reference array stores them. */
export function writeRefColumns(w: FieldWriter, refs: readonly NodeRef[], what: string): void {
  for (const r of refs) w.varint(r.file, `${what} data file index`);
  for (const r of refs) w.varint(r.offset, `${what} offset`);
  for (const r of refs) w.varint(r.length, `${what} length`);
}

/** num_keys, num_tree_bytes, num_indirect_value_bytes in column order. */
export function writeStatsColumns(w: FieldWriter, refs: readonly NodeRef[], what: string): void {
  for (const r of refs) w.varint(r.numKeys ?? 0, `${what} num_keys`);
  for (const r of refs) w.varint(r.numTreeBytes ?? 0, `${what} num_tree_bytes`);
  for (const r of refs) w.varint(r.numIndirectValueBytes ?? 0, `${what} num_indirect_value_bytes`);
}

// ---------------------------------------------------------------------------------------------- manifest

export interface ConfigFields {
  uuid?: Uint8Array;
  kind?: number; // 0 single, 1 numbered
  maxInlineValueBytes?: number;
  maxDecodedNodeBytes?: number;
  arityLog2?: number;
  /** undefined = zstd level 0; null = no compression. */
  zstdLevel?: number | null;
}

export function writeConfig(w: FieldWriter, c: ConfigFields = {}): void {
  const level = c.zstdLevel === undefined ? 0 : c.zstdLevel;
  w.bytes(c.uuid ?? new Uint8Array(16).fill(0xab), "uuid");
  w.u8(c.kind ?? 0, "manifest_kind");
  w.varint(c.maxInlineValueBytes ?? 100, "max_inline_value_bytes");
  w.varint(c.maxDecodedNodeBytes ?? 8388608, "max_decoded_node_bytes");
  w.u8(c.arityLog2 ?? 4, "version_tree_arity_log2");
  w.varint(level === null ? 0 : 1, "compression_method");
  if (level !== null) w.u32le(level >>> 0, "zstd level");
}

export function config(c: ConfigFields = {}): Uint8Array {
  return written((w) => writeConfig(w, c));
}

/** The raw fields of a decoded config. */
export function configFields(c: OcdbtConfig): ConfigFields {
  return {
    uuid: c.uuid,
    kind: c.manifestKind === "single" ? 0 : 1,
    maxInlineValueBytes: c.maxInlineValueBytes,
    maxDecodedNodeBytes: c.maxDecodedNodeBytes,
    arityLog2: c.versionTreeArityLog2,
    zstdLevel: c.compression.method === "none" ? null : c.compression.level,
  };
}

export interface Version extends NodeRef {
  generation: number;
  rootHeight?: number;
  commitTimeNs?: bigint;
}

/** A reference to a version-tree node (manifest or interior version node). */
export interface VersionNode {
  generation: number;
  file: number;
  offset: number | bigint;
  length: number | bigint;
  numGenerations: number;
  commitTimeNs?: bigint;
  /** Written only in the manifest (inside a node every child has the node's height minus one). */
  height?: number;
}

/** A version entry array: the manifest's inline versions and the body of a version-tree leaf. */
export function writeVersions(w: FieldWriter, versions: readonly Version[]): void {
  w.varint(versions.length, "version count");
  for (const v of versions) w.varint(v.generation, "generation_number");
  for (const v of versions) w.u8(v.rootHeight ?? 0, "root_height");
  writeRefColumns(w, versions, "version root");
  writeStatsColumns(w, versions, "version");
  for (const v of versions) w.u64le(v.commitTimeNs ?? 0n, "commit_time");
}

/** A version-node reference array; `withHeights` in the manifest only. */
export function writeVersionNodes(w: FieldWriter, nodes: readonly VersionNode[], withHeights: boolean): void {
  w.varint(nodes.length, "version node count");
  for (const n of nodes) w.varint(n.generation, "version node generation_number");
  writeRefColumns(w, nodes, "version node");
  for (const n of nodes) w.varint(n.numGenerations, "num_generations");
  for (const n of nodes) w.u64le(n.commitTimeNs ?? 0n, "version node commit_time");
  if (withHeights) for (const n of nodes) w.u8(n.height ?? 0, "entry_height");
}

/** A single-kind manifest body: config, data-file table, inline versions, version nodes (default none). */
export function manifestBody(
  c: ConfigFields,
  files: readonly FileId[],
  versions: readonly Version[],
  versionNodes: readonly VersionNode[] = [],
): Uint8Array {
  return written((w) => {
    writeConfig(w, { ...c, kind: 0 });
    writeDataFileTable(w, files);
    writeVersions(w, versions);
    writeVersionNodes(w, versionNodes, true);
  });
}

/** A version-tree leaf body: arity, height 0, data-file table, version entries. */
export function versionLeafBody(arityLog2: number, files: readonly FileId[], versions: readonly Version[], height = 0): Uint8Array {
  return written((w) => {
    w.u8(arityLog2, "version_tree_arity_log2");
    w.u8(height, "height");
    writeDataFileTable(w, files);
    writeVersions(w, versions);
  });
}

/** A version-tree interior body: arity, height, data-file table, child references (no per-entry height). */
export function versionInteriorBody(
  arityLog2: number,
  height: number,
  files: readonly FileId[],
  children: readonly VersionNode[],
): Uint8Array {
  return written((w) => {
    w.u8(arityLog2, "version_tree_arity_log2");
    w.u8(height, "height");
    writeDataFileTable(w, files);
    writeVersionNodes(w, children, false);
  });
}

export type VersionsManifest = Manifest & { kind: "versions" };

/** A "single" manifest body from a decoded manifest, every field recorded. */
export function encodeManifest(m: VersionsManifest): FieldWriter {
  const w = new FieldWriter();
  writeConfig(w, configFields(m.config));
  const table = new FileTable("");
  const versions = m.inlineVersions.map(
    (v): Version => ({
      generation: v.generation,
      rootHeight: v.rootHeight,
      file: v.root === null ? 0 : table.add(v.root.file),
      offset: v.root === null ? MISSING : v.root.offset,
      length: v.root === null ? MISSING : v.root.length,
      ...v.stats,
      commitTimeNs: v.commitTimeNs,
    }),
  );
  const nodes = m.versionNodes.map(
    (n): VersionNode => ({
      generation: n.generation,
      file: table.add(n.ref.file),
      offset: n.ref.offset,
      length: n.ref.length,
      numGenerations: n.numGenerations,
      commitTimeNs: n.commitTimeNs,
      height: n.height,
    }),
  );
  writeDataFileTable(w, table.files);
  writeVersions(w, versions);
  writeVersionNodes(w, nodes, true);
  return w;
}

// ---------------------------------------------------------------------------------------------- b+tree nodes

export type Key = string | Uint8Array;
const keyOf = (k: Key): Uint8Array => (typeof k === "string" ? utf8.encode(k) : k);

/** Entry count and prefix-compressed key columns; `subtreePrefixes` only for interior nodes. */
function writeKeyColumns(w: FieldWriter, keys: readonly Key[], subtreePrefixes?: readonly number[]): void {
  const ks = keys.map(keyOf);
  const prefixes = ks.map((k, i) => (i === 0 ? 0 : Math.min(commonPrefix(ks[i - 1] as Bytes, k), 0xffff)));
  w.varint(ks.length, "entry count");
  for (let i = 1; i < ks.length; i++) w.varint(prefixes[i] as number, "key prefix length");
  for (let i = 0; i < ks.length; i++) w.varint((ks[i] as Bytes).length - (prefixes[i] as number), "key suffix length");
  for (const p of subtreePrefixes ?? []) w.varint(p, "subtree common prefix length");
  for (let i = 0; i < ks.length; i++) w.bytes((ks[i] as Bytes).subarray(prefixes[i] as number), "key suffix");
}

export interface LeafEntry {
  /** Relative to the node's implicit prefix. */
  key: Key;
  /** Inline bytes, or an out-of-line (file index, offset, length) reference. */
  value: Uint8Array | { file: number; offset: number; length: number };
  /** Overrides the value_kind byte written (to craft invalid kinds). */
  kind?: number;
}

function writeLeaf(w: FieldWriter, height: number, files: readonly FileId[], entries: readonly LeafEntry[]): void {
  const indirect = entries.flatMap((e) => (e.value instanceof Uint8Array ? [] : [e.value]));
  w.u8(height, "height");
  writeDataFileTable(w, files);
  writeKeyColumns(
    w,
    entries.map((e) => e.key),
  );
  for (const e of entries) w.varint(e.value.length, "value length");
  for (const e of entries) w.u8(e.kind ?? (e.value instanceof Uint8Array ? 0 : 1), "value kind");
  for (const v of indirect) w.varint(v.file, "value data file index");
  for (const v of indirect) w.varint(v.offset, "value offset");
  for (const e of entries) if (e.value instanceof Uint8Array) w.bytes(e.value, "inline value");
}

export function leafBody(files: readonly FileId[], entries: readonly LeafEntry[], height = 0): Uint8Array {
  return written((w) => writeLeaf(w, height, files, entries));
}

export interface InteriorEntry extends NodeRef {
  /** Relative to the node's implicit prefix; the child's lower bound. */
  key: Key;
  /** How many leading bytes of `key` every key in the child shares (left out of the child's keys). */
  subtreePrefixLength?: number;
}

function writeInterior(w: FieldWriter, height: number, files: readonly FileId[], entries: readonly InteriorEntry[]): void {
  w.u8(height, "height");
  writeDataFileTable(w, files);
  writeKeyColumns(
    w,
    entries.map((e) => e.key),
    entries.map((e) => e.subtreePrefixLength ?? 0),
  );
  writeRefColumns(w, entries, "child");
  writeStatsColumns(w, entries, "child");
}

export function interiorBody(height: number, files: readonly FileId[], entries: readonly InteriorEntry[]): Uint8Array {
  return written((w) => writeInterior(w, height, files, entries));
}

/**
 * A B+tree node body from a decoded node, every field recorded. `prefix` is the implicit key prefix the
 * parent gives the node and `transitive` the base path it is read through: both are stripped, as
 * TensorStore does.
 */
export function encodeBtreeNode(node: BtreeNode, prefix: Uint8Array, transitive: string): FieldWriter {
  const w = new FieldWriter();
  const table = new FileTable(transitive);
  const relative = (key: Uint8Array): Uint8Array => {
    if (key.length < prefix.length || commonPrefix(key, prefix) !== prefix.length) throw new Error("entry key outside the node's prefix");
    return key.subarray(prefix.length);
  };
  if (node.height === 0) {
    const entries = (node.entries as DecodedLeafEntry[]).map(
      (e): LeafEntry => ({
        key: relative(e.key),
        value: e.value.kind === "inline" ? e.value.bytes : { ...e.value.ref, file: table.add(e.value.ref.file) },
      }),
    );
    writeLeaf(w, 0, table.files, entries);
  } else {
    const entries = (node.entries as DecodedInteriorEntry[]).map(
      (e): InteriorEntry => ({
        key: relative(e.key),
        subtreePrefixLength: e.childPrefix.length - prefix.length,
        file: table.add(e.ref.file),
        offset: e.ref.offset,
        length: e.ref.length,
        ...e.stats,
      }),
    );
    writeInterior(w, node.height, table.files, entries);
  }
  return w;
}

// ---------------------------------------------------------------------------------------------- data files

/** Appends objects to one data file and remembers where each went (like TensorStore's IndirectDataWriter). */
export class DataFileBuilder {
  private readonly parts: Uint8Array[] = [];
  private size = 0;

  add(bytes: Uint8Array): { offset: number; length: number } {
    const at = { offset: this.size, length: bytes.length };
    this.parts.push(bytes);
    this.size += bytes.length;
    return at;
  }

  bytes(): Uint8Array {
    return cat(...this.parts);
  }
}
