// TEST-ONLY OCDBT encoder: just enough of docs/ocdbt-format.md §2-6 to craft databases and edge cases,
// plus a read-counting Store. It writes what TensorStore writes (shortest varints; zstd as hand-made
// raw-block frames) and validates nothing, so tests can also build invalid objects on purpose.
import { crc32c } from "../../src/codecs/crc32c.js";
import { MAGIC } from "../../src/ocdbt/envelope.js";

export type Bytes = Uint8Array;
type Part = Uint8Array | readonly number[] | string;

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

/** Shortest unsigned LEB128. */
export function varint(value: number | bigint): number[] {
  let v = BigInt(value);
  const out: number[] = [];
  do {
    const b = Number(v & 0x7fn);
    v >>= 7n;
    out.push(v === 0n ? b : b | 0x80);
  } while (v !== 0n);
  return out;
}

export function u32le(v: number): number[] {
  return [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, (v >>> 24) & 0xff];
}

export function u64le(v: number | bigint): number[] {
  const out: number[] = [];
  let x = BigInt(v);
  for (let i = 0; i < 8; i++, x >>= 8n) out.push(Number(x & 0xffn));
  return out;
}

/** The "missing" sentinel (2^64-1): offset and length of an empty tree. */
export const MISSING = (1n << 64n) - 1n;

// ---------------------------------------------------------------------------------------------- zstd

export interface ZstdFrameOptions {
  /** Declare the content size (single-segment frame, as riegeli writes small nodes). Default true. */
  contentSize?: boolean;
  /** Override the declared size (to lie about it). */
  declaredSize?: number;
}

/** A zstd frame of raw (stored) blocks, no checksum. Without a content size it uses a 128 KiB window. */
export function zstdRawFrame(data: Uint8Array, options: ZstdFrameOptions = {}): Uint8Array {
  const header: number[] = [...u32le(0xfd2fb528)];
  if (options.contentSize ?? true) {
    const size = options.declaredSize ?? data.length;
    // Single-segment: FCS field of 1, 2 (value - 256) or 4 bytes.
    if (size < 256) header.push(0x20, size);
    else if (size < 65536 + 256) header.push(0x60, (size - 256) & 0xff, (size - 256) >> 8);
    else header.push(0xa0, ...u32le(size));
  } else {
    header.push(0x00, 7 << 3); // no FCS, not single-segment; window descriptor 2^(10+7)
  }
  const blocks: Part[] = [];
  const maxBlock = 128 * 1024;
  let pos = 0;
  do {
    const size = Math.min(maxBlock, data.length - pos);
    const last = pos + size >= data.length ? 1 : 0;
    blocks.push(blockHeader(last, 0, size), data.subarray(pos, pos + size));
    pos += size;
  } while (pos < data.length);
  return cat(header, ...blocks);
}

/** A zstd block header: last flag, type (0 raw, 1 RLE, 2 compressed), size. */
export function blockHeader(last: number, type: number, size: number): number[] {
  const v = last | (type << 1) | (size << 3);
  return [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff];
}

// ---------------------------------------------------------------------------------------------- envelope

export interface EnvelopeOptions {
  /** 0 = raw, 1 = zstd (the body is wrapped in a raw-block frame), anything else is written as given. */
  compression?: number;
  version?: number;
  /** Frame options when compression = 1. */
  zstd?: ZstdFrameOptions;
}

/** magic (BE) | length (u64 LE, incl. CRC) | version | compression | body | CRC-32C (LE) over all before it. */
export function envelope(kind: keyof typeof MAGIC, body: Uint8Array, options: EnvelopeOptions = {}): Uint8Array {
  const compression = options.compression ?? 1;
  const payload = compression === 1 ? zstdRawFrame(body, options.zstd) : body;
  const head = cat(varint(options.version ?? 0), varint(compression));
  const length = 12 + head.length + payload.length + 4;
  const m = MAGIC[kind];
  const withoutCrc = cat([m >>> 24, (m >>> 16) & 0xff, (m >>> 8) & 0xff, m & 0xff], u64le(length), head, payload);
  return cat(withoutCrc, u32le(crc32c(withoutCrc)));
}

// ---------------------------------------------------------------------------------------------- data file table

export type FileId = readonly [basePath: string, relativePath: string];

function commonPrefix(a: Uint8Array, b: Uint8Array): number {
  let i = 0;
  while (i < a.length && i < b.length && a[i] === b[i]) i++;
  return i;
}

/**
 * Encodes the table in the given order the way TensorStore's DataFileTableBuilder does: the shared
 * prefix reaches into the relative path only when both base paths are equal.
 */
export function dataFileTable(files: readonly FileId[]): Uint8Array {
  const paths = files.map(([b, r]) => utf8.encode(b + r));
  const bases = files.map(([b]) => utf8.encode(b));
  const prefixes = files.map((f, i) => {
    if (i === 0) return 0;
    const prev = files[i - 1] as FileId;
    if (prev[0] === f[0]) return commonPrefix(paths[i - 1] as Bytes, paths[i] as Bytes);
    return commonPrefix(bases[i - 1] as Bytes, bases[i] as Bytes);
  });
  return cat(
    varint(files.length),
    prefixes.slice(1).flatMap(varint),
    paths.flatMap((p, i) => varint(p.length - (prefixes[i] as number))),
    bases.flatMap((b) => varint(b.length)),
    ...paths.map((p, i) => p.subarray(prefixes[i] as number)),
  );
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

export function config(c: ConfigFields = {}): Uint8Array {
  const level = c.zstdLevel === undefined ? 0 : c.zstdLevel;
  return cat(
    c.uuid ?? new Uint8Array(16).fill(0xab),
    [c.kind ?? 0],
    varint(c.maxInlineValueBytes ?? 100),
    varint(c.maxDecodedNodeBytes ?? 8388608),
    [c.arityLog2 ?? 4],
    level === null ? [0] : [1, ...u32le(level)],
  );
}

/** A node (or value) reference with its subtree statistics. */
export interface NodeRef {
  file: number;
  offset: number | bigint;
  length: number | bigint;
  numKeys?: number;
  numTreeBytes?: number;
  numIndirectValueBytes?: number;
}

export interface Version extends NodeRef {
  generation: number;
  rootHeight?: number;
  commitTimeNs?: bigint;
}

function statsColumns(refs: readonly NodeRef[]): number[] {
  return [
    ...refs.flatMap((r) => varint(r.numKeys ?? 0)),
    ...refs.flatMap((r) => varint(r.numTreeBytes ?? 0)),
    ...refs.flatMap((r) => varint(r.numIndirectValueBytes ?? 0)),
  ];
}

function refColumns(refs: readonly NodeRef[]): number[] {
  return [...refs.flatMap((r) => varint(r.file)), ...refs.flatMap((r) => varint(r.offset)), ...refs.flatMap((r) => varint(r.length))];
}

/** A single-kind manifest body: config, data-file table, inline versions, no version nodes. */
export function manifestBody(c: ConfigFields, files: readonly FileId[], versions: readonly Version[]): Uint8Array {
  return cat(
    config({ ...c, kind: 0 }),
    dataFileTable(files),
    varint(versions.length),
    versions.flatMap((v) => varint(v.generation)),
    versions.map((v) => v.rootHeight ?? 0),
    refColumns(versions),
    statsColumns(versions),
    versions.flatMap((v) => u64le(v.commitTimeNs ?? 0n)),
    varint(0), // version_nodes
  );
}

// ---------------------------------------------------------------------------------------------- b+tree nodes

export type Key = string | Uint8Array;
const keyOf = (k: Key): Uint8Array => (typeof k === "string" ? utf8.encode(k) : k);

/** Prefix-compressed key columns; `subtreePrefixes` only for interior nodes. */
function keyColumns(keys: readonly Key[], subtreePrefixes?: readonly number[]): Uint8Array {
  const ks = keys.map(keyOf);
  const prefixes = ks.map((k, i) => (i === 0 ? 0 : commonPrefix(ks[i - 1] as Bytes, k)));
  return cat(
    varint(ks.length),
    prefixes.slice(1).flatMap(varint),
    ks.flatMap((k, i) => varint(k.length - (prefixes[i] as number))),
    subtreePrefixes?.flatMap(varint) ?? [],
    ...ks.map((k, i) => k.subarray(prefixes[i] as number)),
  );
}

export interface LeafEntry {
  /** Relative to the node's implicit prefix. */
  key: Key;
  /** Inline bytes, or an out-of-line (file index, offset, length) reference. */
  value: Uint8Array | { file: number; offset: number; length: number };
  /** Overrides the value_kind byte written (to craft invalid kinds). */
  kind?: number;
}

export function leafBody(files: readonly FileId[], entries: readonly LeafEntry[], height = 0): Uint8Array {
  const indirect = entries.flatMap((e) => (e.value instanceof Uint8Array ? [] : [e.value]));
  return cat(
    [height],
    dataFileTable(files),
    keyColumns(entries.map((e) => e.key)),
    entries.flatMap((e) => varint(e.value instanceof Uint8Array ? e.value.length : e.value.length)),
    entries.map((e) => e.kind ?? (e.value instanceof Uint8Array ? 0 : 1)),
    indirect.flatMap((v) => varint(v.file)),
    indirect.flatMap((v) => varint(v.offset)),
    ...entries.flatMap((e) => (e.value instanceof Uint8Array ? [e.value] : [])),
  );
}

export interface InteriorEntry extends NodeRef {
  /** Relative to the node's implicit prefix; the child's lower bound. */
  key: Key;
  /** How many leading bytes of `key` every key in the child shares (left out of the child's keys). */
  subtreePrefixLength?: number;
}

export function interiorBody(height: number, files: readonly FileId[], entries: readonly InteriorEntry[]): Uint8Array {
  return cat(
    [height],
    dataFileTable(files),
    keyColumns(
      entries.map((e) => e.key),
      entries.map((e) => e.subtreePrefixLength ?? 0),
    ),
    refColumns(entries),
    statsColumns(entries),
  );
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
