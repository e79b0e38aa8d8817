/**
 * Shared machinery for the fuzz tests (test/fuzz/*.test.ts):
 *
 * 1. a seeded PRNG;
 * 2. small OCDBT *encoders* (envelope, zstd raw-block frames, data-file table, manifest, B+tree node) that
 *    record where every field lies, so a test can decode a real node with src/, change one field or the
 *    decompressed body, and write it back with a correct length and CRC-32C: the decoder itself, not only
 *    the checksum, then sees the corruption;
 * 3. a model of a database's tree (loaded from a pristine fixture) and a workspace that rewrites a node by
 *    appending the new encoding to its data file and re-linking every ancestor up to the manifest;
 * 4. a runner that executes openStep + inspectStep (or a raw database listing) in a worker thread, so a hang
 *    (even a loop that never yields to the event loop) is ended by terminating the worker, and that counts
 *    every typed-array / ArrayBuffer allocation, so an allocation past the limit is seen even when it is
 *    transient or lazily committed.
 *
 * The worker runs a copy of src/ transpiled with the project's own `typescript` (transpileModule, no type
 * check) into a temporary directory; nothing under src/ or dist/ is touched.
 */
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import v8 from "node:v8";
import vm from "node:vm";
import { parentPort, Worker } from "node:worker_threads";
import { inspectStep } from "../../src/cli/inspect.js";
import { crc32c } from "../../src/codecs/crc32c.js";
import { Orbax2RegError } from "../../src/errors.js";
import { type BtreeNode, decodeBtreeNode, type InteriorEntry, type LeafEntry } from "../../src/ocdbt/btree.js";
import type { OcdbtConfig } from "../../src/ocdbt/config.js";
import type { DataFileId } from "../../src/ocdbt/data-file-table.js";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { decodeEnvelope, type EnvelopeKind, MAGIC } from "../../src/ocdbt/envelope.js";
import { decodeManifest, type Manifest } from "../../src/ocdbt/manifest.js";
import type { IndirectRef } from "../../src/ocdbt/node-reference.js";
import { openStep } from "../../src/orbax/step.js";
import { LocalStore } from "../../src/store/local.js";
import { joinKey } from "../../src/store/store.js";

/** Orbax's max_decoded_node_bytes (100 MB): no single allocation and no retained growth may pass it. */
export const MEMORY_LIMIT = 100_000_000;

// ---------------------------------------------------------------------------------------------------------
// PRNG
// ---------------------------------------------------------------------------------------------------------

/** mulberry32: tiny, fast, good enough to drive mutations; the whole run is a function of the seed. */
export class Rng {
  private s: number;
  constructor(seed: number) {
    this.s = seed >>> 0;
  }
  u32(): number {
    this.s = (this.s + 0x6d2b79f5) >>> 0;
    let t = this.s;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return (t ^ (t >>> 14)) >>> 0;
  }
  /** Uniform in [0, n). */
  int(n: number): number {
    return Math.floor((this.u32() / 2 ** 32) * n);
  }
  /** Uniform in [lo, hi]. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }
  chance(p: number): boolean {
    return this.u32() / 2 ** 32 < p;
  }
  pick<T>(xs: readonly T[]): T {
    if (xs.length === 0) throw new Error("pick from an empty list");
    return xs[this.int(xs.length)] as T;
  }
  /** Picks by weight: `[[weight, value], ...]`. */
  weighted<T>(choices: readonly (readonly [number, T])[]): T {
    const total = choices.reduce((s, [w]) => s + w, 0);
    let x = (this.u32() / 2 ** 32) * total;
    for (const [w, v] of choices) {
      x -= w;
      if (x < 0) return v;
    }
    return (choices[choices.length - 1] as readonly [number, T])[1];
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

/** The seed of iteration `i` of a run: every iteration can be replayed alone (FUZZ_SEED + FUZZ_ITER). */
export function iterationSeed(seed: number, i: number): number {
  let h = Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(i + 1, 0xc2b2ae35);
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b);
  return (h ^ (h >>> 16)) >>> 0;
}

// ---------------------------------------------------------------------------------------------------------
// Field-recording encoder
// ---------------------------------------------------------------------------------------------------------

export type FieldKind = "u8" | "varint" | "u32" | "u64" | "bytes";

/** Where one encoded field lies in a body, so a test can replace exactly that field. */
export interface Field {
  readonly name: string;
  readonly kind: FieldKind;
  readonly start: number;
  readonly end: number;
}

export function varintBytes(v: number | bigint): number[] {
  let x = BigInt(v);
  if (x < 0n) throw new Error(`negative varint ${x}`);
  const out: number[] = [];
  do {
    let b = Number(x & 0x7fn);
    x >>= 7n;
    if (x !== 0n) b |= 0x80;
    out.push(b);
  } while (x !== 0n);
  return out;
}

/** A varint padded with redundant continuation bytes to `length` bytes (riegeli accepts up to 10 for 64 bits). */
export function overlongVarint(v: number | bigint, length: number): number[] {
  const out = varintBytes(v);
  while (out.length < length) {
    out[out.length - 1] = (out[out.length - 1] as number) | 0x80;
    out.push(0);
  }
  return out;
}

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
    this.add(name, "varint", varintBytes(v));
  }
  u32le(v: number, name: string): void {
    this.add(name, "u32", [v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, (v >>> 24) & 0xff]);
  }
  u64le(v: bigint, name: string): void {
    const b: number[] = [];
    for (let i = 0n; i < 8n; i++) b.push(Number((v >> (8n * i)) & 0xffn));
    this.add(name, "u64", b);
  }
  bytes(b: Uint8Array, name: string): void {
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

export function concat(...parts: ArrayLike<number>[]): Uint8Array {
  const out = new Uint8Array(parts.reduce((s, p) => s + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p instanceof Uint8Array ? p : Array.from(p), at);
    at += p.length;
  }
  return out;
}

function lcp(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

function startsWithBytes(key: Uint8Array, prefix: Uint8Array): boolean {
  return key.length >= prefix.length && lcp(key, prefix) === prefix.length;
}

const utf8 = new TextEncoder();

// ---------------------------------------------------------------------------------------------------------
// zstd frames (raw and RLE blocks only: a valid frame without a compressor)
// ---------------------------------------------------------------------------------------------------------

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
  const out: number[] = [0x28, 0xb5, 0x2f, 0xfd, fhd];
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
    const header = (size << 3) | (0 << 1) | last;
    out.push(header & 0xff, (header >> 8) & 0xff, (header >> 16) & 0xff);
    for (let i = 0; i < size; i++) out.push(data[pos + i] as number);
    pos += size;
  } while (pos < data.length);
  if (o.checksum) out.push(0, 0, 0, 0);
  return Uint8Array.from(out);
}

/** A skippable frame (RFC 8878 §3.1.2) with `n` bytes of content; `declared` may claim another size. */
export function zstdSkippableFrame(n: number, magicNibble = 0, declared = n): Uint8Array {
  const d = declared >>> 0;
  const head = [0x50 | (magicNibble & 0xf), 0x2a, 0x4d, 0x18, d & 0xff, (d >>> 8) & 0xff, (d >>> 16) & 0xff, (d >>> 24) & 0xff];
  return concat(head, new Uint8Array(n));
}

// ---------------------------------------------------------------------------------------------------------
// Envelopes
// ---------------------------------------------------------------------------------------------------------

export interface EnvelopeOptions {
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

/** magic (BE) + length (LE u64) + version varint + compression varint + payload + CRC-32C (LE). */
export function encodeEnvelope(kind: EnvelopeKind, payload: Uint8Array, o: EnvelopeOptions): Uint8Array {
  const version = o.versionBytes ?? [0];
  const compression = o.compressionBytes ?? varintBytes(o.compression);
  const total = 12 + version.length + compression.length + payload.length + 4;
  const out = new Uint8Array(total);
  const view = new DataView(out.buffer);
  view.setUint32(0, o.magic ?? MAGIC[kind], false);
  view.setBigUint64(4, o.length ?? BigInt(total), true);
  out.set(version, 12);
  out.set(compression, 12 + version.length);
  out.set(payload, 12 + version.length + compression.length);
  const crc = crc32c(out.subarray(0, total - 4));
  view.setUint32(total - 4, o.badCrc ? (crc ^ 1) >>> 0 : crc, true);
  return out;
}

/** The common case: a body stored raw, or zstd-framed with default frame options. */
export function envelopeOf(kind: EnvelopeKind, body: Uint8Array, zstd = false): Uint8Array {
  return zstd ? encodeEnvelope(kind, zstdFrame(body), { compression: 1 }) : encodeEnvelope(kind, body, { compression: 0 });
}

/** The decoded (decompressed) body of a valid envelope, decoded by src/. */
export function envelopeBody(bytes: Uint8Array, kind: EnvelopeKind): Uint8Array {
  return decodeEnvelope(bytes, kind, "fuzz", 1 << 30).bytes.slice();
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

// ---------------------------------------------------------------------------------------------------------
// OCDBT bodies
// ---------------------------------------------------------------------------------------------------------

interface TableFile {
  readonly base: string;
  readonly rel: string;
}

/** Collects data files in first-use order; base paths are stored relative to the node's transitive path. */
class FileTable {
  readonly files: TableFile[] = [];
  private readonly index = new Map<string, number>();
  constructor(private readonly transitive: string) {}
  add(id: DataFileId): number {
    if (!id.basePath.startsWith(this.transitive)) throw new Error(`base path ${id.basePath} outside ${this.transitive}`);
    const base = id.basePath.slice(this.transitive.length);
    const k = `${base}\0${id.relativePath}`;
    let i = this.index.get(k);
    if (i === undefined) {
      i = this.files.length;
      this.files.push({ base, rel: id.relativePath });
      this.index.set(k, i);
    }
    return i;
  }
}

/** OCDBT "Data file table format", prefix-compressed the way the decoder allows. */
export function writeDataFileTable(w: FieldWriter, files: readonly TableFile[]): void {
  const paths = files.map((f) => utf8.encode(f.base + f.rel));
  const bases = files.map((f) => utf8.encode(f.base).length);
  const prefixes = paths.map((p, i) => {
    if (i === 0) return 0;
    let n = Math.min(lcp(paths[i - 1] as Uint8Array, p), 0xffff);
    if (bases[i] !== bases[i - 1]) n = Math.min(n, bases[i] as number, bases[i - 1] as number);
    return n;
  });
  w.varint(files.length, "data file count");
  for (let i = 1; i < files.length; i++) w.varint(prefixes[i] as number, "data file path prefix length");
  for (let i = 0; i < files.length; i++)
    w.varint((paths[i] as Uint8Array).length - (prefixes[i] as number), "data file path suffix length");
  for (let i = 0; i < files.length; i++) w.varint(bases[i] as number, "data file base path length");
  for (let i = 0; i < files.length; i++) w.bytes((paths[i] as Uint8Array).subarray(prefixes[i] as number), "data file path suffix");
}

function writeConfig(w: FieldWriter, c: OcdbtConfig): void {
  w.bytes(c.uuid, "uuid");
  w.u8(c.manifestKind === "single" ? 0 : 1, "manifest_kind");
  w.varint(c.maxInlineValueBytes, "max_inline_value_bytes");
  w.varint(c.maxDecodedNodeBytes, "max_decoded_node_bytes");
  w.u8(c.versionTreeArityLog2, "version_tree_arity_log2");
  w.varint(c.compression.method === "none" ? 0 : 1, "compression_method");
  if (c.compression.method === "zstd") w.u32le(c.compression.level >>> 0, "zstd level");
}

const MISSING = (1n << 64n) - 1n;

export type VersionsManifest = Manifest & { kind: "versions" };

/** A "single" manifest body: config, data-file table, inline versions, version-node references. */
export function encodeManifest(m: VersionsManifest): FieldWriter {
  const w = new FieldWriter();
  writeConfig(w, m.config);
  const table = new FileTable("");
  const rootIdx = m.inlineVersions.map((v) => (v.root === null ? 0 : table.add(v.root.file)));
  const nodeIdx = m.versionNodes.map((n) => table.add(n.ref.file));
  writeDataFileTable(w, table.files);
  const vs = m.inlineVersions;
  w.varint(vs.length, "version count");
  for (const v of vs) w.varint(v.generation, "generation_number");
  for (const v of vs) w.u8(v.rootHeight, "root_height");
  for (const i of rootIdx) w.varint(i, "version root data file index");
  for (const v of vs) w.varint(v.root === null ? MISSING : BigInt(v.root.offset), "version root offset");
  for (const v of vs) w.varint(v.root === null ? MISSING : BigInt(v.root.length), "version root length");
  for (const v of vs) w.varint(v.stats.numKeys, "version num_keys");
  for (const v of vs) w.varint(v.stats.numTreeBytes, "version num_tree_bytes");
  for (const v of vs) w.varint(v.stats.numIndirectValueBytes, "version num_indirect_value_bytes");
  for (const v of vs) w.u64le(v.commitTimeNs, "commit_time");
  const ns = m.versionNodes;
  w.varint(ns.length, "version node count");
  for (const n of ns) w.varint(n.generation, "version node generation_number");
  for (const i of nodeIdx) w.varint(i, "version node data file index");
  for (const n of ns) w.varint(n.ref.offset, "version node offset");
  for (const n of ns) w.varint(n.ref.length, "version node length");
  for (const n of ns) w.varint(n.numGenerations, "num_generations");
  for (const n of ns) w.u64le(n.commitTimeNs, "version node commit_time");
  for (const n of ns) w.u8(n.height, "entry_height");
  return w;
}

/**
 * A B+tree node body (OCDBT spec "B+tree node format"). `prefix` is the implicit key prefix the parent
 * gives the node and `transitive` the base path it is read through: both are stripped, as TensorStore does.
 */
export function encodeBtreeNode(node: BtreeNode, prefix: Uint8Array, transitive: string): FieldWriter {
  const w = new FieldWriter();
  w.u8(node.height, "height");
  const table = new FileTable(transitive);
  const leaf = node.height === 0;
  const leafEntries = node.entries as LeafEntry[];
  const interior = node.entries as InteriorEntry[];
  const fileIdx = leaf
    ? leafEntries.flatMap((e) => (e.value.kind === "indirect" ? [table.add(e.value.ref.file)] : []))
    : interior.map((e) => table.add(e.ref.file));
  writeDataFileTable(w, table.files);
  const n = node.entries.length;
  w.varint(n, "entry count");
  const rel = node.entries.map((e) => {
    if (!startsWithBytes(e.key, prefix)) throw new Error("entry key outside the node's prefix");
    return e.key.subarray(prefix.length);
  });
  const shared = rel.map((k, i) => (i === 0 ? 0 : Math.min(lcp(rel[i - 1] as Uint8Array, k), 0xffff)));
  for (let i = 1; i < n; i++) w.varint(shared[i] as number, "key prefix length");
  for (let i = 0; i < n; i++) w.varint((rel[i] as Uint8Array).length - (shared[i] as number), "key suffix length");
  if (!leaf) for (const e of interior) w.varint(e.childPrefix.length - prefix.length, "subtree common prefix length");
  for (let i = 0; i < n; i++) w.bytes((rel[i] as Uint8Array).subarray(shared[i] as number), "key suffix");
  if (leaf) {
    for (const e of leafEntries) w.varint(e.value.kind === "inline" ? e.value.bytes.length : e.value.ref.length, "value length");
    for (const e of leafEntries) w.u8(e.value.kind === "inline" ? 0 : 1, "value kind");
    for (const i of fileIdx) w.varint(i, "value data file index");
    for (const e of leafEntries) if (e.value.kind === "indirect") w.varint(e.value.ref.offset, "value offset");
    for (const e of leafEntries) if (e.value.kind === "inline") w.bytes(e.value.bytes, "inline value");
  } else {
    for (const i of fileIdx) w.varint(i, "child data file index");
    for (const e of interior) w.varint(e.ref.offset, "child offset");
    for (const e of interior) w.varint(e.ref.length, "child length");
    for (const e of interior) w.varint(e.stats.numKeys, "child num_keys");
    for (const e of interior) w.varint(e.stats.numTreeBytes, "child num_tree_bytes");
    for (const e of interior) w.varint(e.stats.numIndirectValueBytes, "child num_indirect_value_bytes");
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------------
// Database model and workspace
// ---------------------------------------------------------------------------------------------------------

export interface NodeInfo {
  readonly id: number;
  /** Store key (relative to the workspace root) of the data file holding the node. */
  readonly dataKey: string;
  readonly ref: IndirectRef;
  /** Base path the node is read through (its data-file table is relative to it). */
  readonly transitive: string;
  readonly prefix: Uint8Array;
  readonly height: number;
  readonly node: BtreeNode;
  readonly parent: { readonly node: number; readonly entry: number } | "manifest";
}

export interface DbModel {
  /** Key prefix of the database inside the workspace ("" for the workspace root). */
  readonly root: string;
  readonly manifestKey: string;
  readonly manifest: VersionsManifest;
  readonly nodes: readonly NodeInfo[];
}

/** Reads a database's manifest and every node of its latest version, with src/'s own decoders. */
export function loadDb(dir: string, root: string): DbModel {
  const read = (key: string) => new Uint8Array(readFileSync(join(dir, ...key.split("/"))));
  const manifestKey = joinKey(root, "manifest.ocdbt");
  const manifest = decodeManifest(decodeEnvelope(read(manifestKey), "manifest", manifestKey, 1 << 30));
  if (manifest.kind !== "versions") throw new Error(`${manifestKey}: numbered manifests are not modelled`);
  const nodes: NodeInfo[] = [];
  const latest = manifest.inlineVersions[manifest.inlineVersions.length - 1];
  const visit = (ref: IndirectRef, prefix: Uint8Array, height: number, parent: NodeInfo["parent"]) => {
    const dataKey = joinKey(root, ref.file.basePath + ref.file.relativePath);
    const bytes = read(dataKey).subarray(ref.offset, ref.offset + ref.length);
    const body = decodeEnvelope(bytes, "btreeNode", dataKey, 1 << 30);
    const node = decodeBtreeNode(body, prefix, ref.file.basePath, height);
    const info: NodeInfo = { id: nodes.length, dataKey, ref, transitive: ref.file.basePath, prefix, height, node, parent };
    nodes.push(info);
    if (height > 0) {
      (node.entries as InteriorEntry[]).forEach((e, i) => {
        visit(e.ref, e.childPrefix, height - 1, { node: info.id, entry: i });
      });
    }
  };
  if (latest?.root) visit(latest.root, new Uint8Array(0), latest.rootHeight, "manifest");
  return { root, manifestKey, manifest, nodes };
}

/** Every leaf entry of the model, in key order. */
export function leafEntries(db: DbModel): LeafEntry[] {
  const out: LeafEntry[] = [];
  const byEntry = (a: NodeInfo, b: NodeInfo) =>
    (a.parent === "manifest" ? 0 : a.parent.entry) - (b.parent === "manifest" ? 0 : b.parent.entry);
  const walk = (id: number) => {
    const info = db.nodes[id] as NodeInfo;
    if (info.height === 0) out.push(...(info.node.entries as LeafEntry[]));
    else for (const child of db.nodes.filter((n) => n.parent !== "manifest" && n.parent.node === id).sort(byEntry)) walk(child.id);
  };
  const root = db.nodes.find((n) => n.parent === "manifest");
  if (root) walk(root.id);
  return out;
}

/**
 * A mutable copy of a fixture directory; keys are `/`-separated paths relative to it. Every key written,
 * appended to or removed is recorded in `touched`, so the copy can be restored file by file.
 */
export class Workspace {
  readonly touched = new Set<string>();
  constructor(readonly dir: string) {}
  path(key: string): string {
    return join(this.dir, ...key.split("/"));
  }
  exists(key: string): boolean {
    return existsSync(this.path(key));
  }
  read(key: string): Uint8Array {
    return new Uint8Array(readFileSync(this.path(key)));
  }
  write(key: string, bytes: Uint8Array): void {
    this.touched.add(key);
    mkdirSync(dirname(this.path(key)), { recursive: true });
    writeFileSync(this.path(key), bytes);
  }
  /** Appends and returns the offset the bytes start at. */
  append(key: string, bytes: Uint8Array): number {
    this.touched.add(key);
    const offset = existsSync(this.path(key)) ? statSync(this.path(key)).size : 0;
    mkdirSync(dirname(this.path(key)), { recursive: true });
    appendFileSync(this.path(key), bytes);
    return offset;
  }
  remove(key: string): void {
    this.touched.add(key);
    rmSync(this.path(key), { force: true });
  }
  /** Every file, as keys, sorted. */
  files(): string[] {
    const out: string[] = [];
    const walk = (d: string) => {
      for (const name of readdirSync(d).sort()) {
        const p = join(d, name);
        if (statSync(p).isDirectory()) walk(p);
        else out.push(relative(this.dir, p).split("\\").join("/"));
      }
    };
    walk(this.dir);
    return out;
  }
}

/** Writes a manifest raw (compression 0). */
export function writeManifest(ws: Workspace, db: DbModel, manifest: VersionsManifest, zstd = false): void {
  ws.write(db.manifestKey, envelopeOf("manifest", encodeManifest(manifest).finish(), zstd));
}

/** The manifest with its latest version's root replaced. */
export function withRoot(m: VersionsManifest, root: IndirectRef, rootHeight?: number): VersionsManifest {
  const versions = [...m.inlineVersions];
  const last = versions[versions.length - 1];
  if (last === undefined) throw new Error("manifest has no version");
  versions[versions.length - 1] = { ...last, root, rootHeight: rootHeight ?? last.rootHeight };
  return { ...m, inlineVersions: versions };
}

/**
 * Stores `envelope` as the new encoding of node `id`: appended to the node's data file, then every ancestor
 * re-encoded (raw) with the new reference, up to the manifest. Other nodes and values keep their offsets.
 */
export function replaceNode(ws: Workspace, db: DbModel, id: number, envelope: Uint8Array): void {
  const info = db.nodes[id] as NodeInfo;
  const offset = ws.append(info.dataKey, envelope);
  relink(ws, db, id, { ...info.ref, offset, length: envelope.length });
}

function relink(ws: Workspace, db: DbModel, id: number, ref: IndirectRef): void {
  const info = db.nodes[id] as NodeInfo;
  if (info.parent === "manifest") {
    writeManifest(ws, db, withRoot(db.manifest, ref));
    return;
  }
  const { node: parentId, entry } = info.parent;
  const parent = db.nodes[parentId] as NodeInfo;
  const entries = (parent.node.entries as InteriorEntry[]).map((e, i) => (i === entry ? { ...e, ref } : e));
  const body = encodeBtreeNode({ height: parent.height, entries }, parent.prefix, parent.transitive).finish();
  replaceNode(ws, db, parentId, envelopeOf("btreeNode", body));
}

/** Re-encodes node `id` after `edit` changed its entries (a model-level mutation). */
export function rewriteNode(ws: Workspace, db: DbModel, id: number, node: BtreeNode, zstd = false): void {
  const info = db.nodes[id] as NodeInfo;
  replaceNode(ws, db, id, envelopeOf("btreeNode", encodeBtreeNode(node, info.prefix, info.transitive).finish(), zstd));
}

/**
 * Rewrites the whole tree as a fresh B+tree of the given arity (leaves of `arity` entries, interior nodes
 * of `arity` children) in a new data file `<root>/d/fuzz-tree`, with the same keys and values, and points
 * the manifest at it. Turns a fixture whose tree is a single leaf into one with interior nodes.
 */
export function rebuildTree(ws: Workspace, db: DbModel, arity: number): DbModel {
  const entries = leafEntries(db);
  if (entries.length === 0) return db;
  const file: DataFileId = { basePath: "", relativePath: "d/fuzz-tree" };
  const dataKey = joinKey(db.root, "d/fuzz-tree");
  interface Built {
    first: Uint8Array;
    last: Uint8Array;
    lcp: Uint8Array;
    numKeys: number;
    ref: IndirectRef;
    node: BtreeNode;
    children: Built[];
  }
  const write = (node: BtreeNode, first: Uint8Array, last: Uint8Array, children: Built[], numKeys: number): Built => {
    const prefix = first.subarray(0, lcp(first, last));
    const env = envelopeOf("btreeNode", encodeBtreeNode(node, prefix, "").finish());
    const offset = ws.append(dataKey, env);
    return { first, last, lcp: prefix, numKeys, ref: { file, offset, length: env.length }, node, children };
  };
  let level: Built[] = [];
  for (let i = 0; i < entries.length; i += arity) {
    const chunk = entries.slice(i, i + arity);
    const first = (chunk[0] as LeafEntry).key;
    const last = (chunk[chunk.length - 1] as LeafEntry).key;
    level.push(write({ height: 0, entries: chunk }, first, last, [], chunk.length));
  }
  let height = 0;
  while (level.length > 1) {
    height++;
    const next: Built[] = [];
    for (let i = 0; i < level.length; i += arity) {
      const kids = level.slice(i, i + arity);
      const ents: InteriorEntry[] = kids.map((k) => ({
        key: k.first,
        childPrefix: k.lcp,
        ref: k.ref,
        stats: { numKeys: k.numKeys, numTreeBytes: k.ref.length, numIndirectValueBytes: 0 },
      }));
      const first = (kids[0] as Built).first;
      const last = (kids[kids.length - 1] as Built).last;
      next.push(
        write(
          { height, entries: ents },
          first,
          last,
          kids,
          kids.reduce((s, k) => s + k.numKeys, 0),
        ),
      );
    }
    level = next;
  }
  const top = level[0] as Built;
  const manifest = withRoot(db.manifest, top.ref, height);
  writeManifest(ws, db, manifest);
  const nodes: NodeInfo[] = [];
  const add = (b: Built, h: number, prefix: Uint8Array, parent: NodeInfo["parent"]) => {
    const info: NodeInfo = { id: nodes.length, dataKey, ref: b.ref, transitive: "", prefix, height: h, node: b.node, parent };
    nodes.push(info);
    b.children.forEach((c, i) => {
      add(c, h - 1, c.lcp, { node: info.id, entry: i });
    });
  };
  add(top, height, new Uint8Array(0), "manifest");
  return { root: db.root, manifestKey: db.manifestKey, manifest, nodes };
}

// ---------------------------------------------------------------------------------------------------------
// Running the code under test in a worker
// ---------------------------------------------------------------------------------------------------------

export interface Job {
  /**
   * "step": openStep + inspectStep({checksums: true}) + a few get()s; "get": openStep + one get(`key`);
   * "db": OcdbtDatabase.open on `dir`, list, get and read every value.
   */
  readonly mode: "step" | "get" | "db";
  readonly dir: string;
  readonly key?: string;
}

export type Outcome = "ok" | "typed" | "untyped" | "timeout" | "crash";

export interface ErrorInfo {
  readonly name: string;
  readonly code?: string;
  readonly message: string;
  readonly stack?: string;
}

export interface JobResult {
  readonly outcome: Outcome;
  /** The first error (for "untyped": the first non-Orbax2RegError). */
  readonly error?: ErrorInfo;
  /** The largest single typed-array / ArrayBuffer allocation during the job, in bytes. */
  readonly maxAlloc: number;
  /** Stack of the first allocation larger than MEMORY_LIMIT. */
  readonly allocStack?: string;
  /** process.memoryUsage().arrayBuffers of the worker after the job (after a gc when it is over 16 MiB). */
  readonly arrayBuffers: number;
  /** arrayBuffers minus the worker's value after its first job. */
  readonly arrayBuffersGrowth: number;
  readonly unhandledRejections: readonly string[];
  readonly ms: number;
}

interface AllocStats {
  max: number;
  stack: string | undefined;
  /** The same maximum in memory shared with the main thread, readable after the worker is terminated. */
  shared: Float64Array;
}

/** Set by the worker bootstrap (below), before any module that allocates is loaded. */
function allocStats(): AllocStats | undefined {
  return (globalThis as { __orbax2regFuzzAlloc?: AllocStats }).__orbax2regFuzzAlloc;
}

function errorInfo(e: unknown): ErrorInfo {
  if (e instanceof Error) {
    const code = (e as { code?: unknown }).code;
    return { name: e.name, ...(typeof code === "string" ? { code } : {}), message: e.message, ...(e.stack ? { stack: e.stack } : {}) };
  }
  return { name: typeof e, message: String(e) };
}

async function exerciseStep(dir: string): Promise<void> {
  const step = await openStep(dir);
  try {
    await inspectStep(step, { checksums: true });
  } finally {
    // Point lookups walk the tree differently from listings (and are what conversion uses).
    const names = step.leaves.filter((l) => l.isArray).map((l) => l.name);
    for (const name of names.slice(0, 4)) {
      await step.source.get(`${name}/.zarray`).catch(ignoreTyped);
      await step.source.get(`${name}/zarr.json`).catch(ignoreTyped);
    }
    await step.source.get("~missing").catch(ignoreTyped);
  }
}

function ignoreTyped(e: unknown): undefined {
  if (e instanceof Orbax2RegError) return undefined;
  throw e;
}

async function exerciseDb(dir: string): Promise<void> {
  const db = await OcdbtDatabase.open(new LocalStore(dir), "");
  const keys: string[] = [];
  for await (const e of db.list("")) {
    keys.push(e.key);
    await db.readValue(e.value);
  }
  for (const k of [...keys.slice(0, 16), "", "~missing", "baz/", "baz/y"]) {
    const e = await db.get(k);
    if (e) await db.readValue(e.value);
  }
  for await (const _ of db.list("baz/")) {
    // prefix listing: exercises the bounded walk
  }
}

/** ArrayBuffer memory above which the worker collects garbage before reporting it. */
const GC_THRESHOLD = 16 << 20;

/** Worker side: answers each Job with a JobResult. Started by the bootstrap in FuzzRunner. */
export async function workerMain(): Promise<void> {
  const port = parentPort;
  if (port === null) throw new Error("workerMain outside a worker");
  let gc: (() => void) | undefined;
  try {
    v8.setFlagsFromString("--expose-gc");
    gc = vm.runInNewContext("gc") as () => void;
  } catch {
    gc = undefined;
  }
  let rejections: string[] = [];
  process.on("unhandledRejection", (r) => rejections.push(errorInfo(r).stack ?? String(r)));
  port.postMessage("ready");
  port.on("message", async (job: Job) => {
    const stats = allocStats();
    if (stats) {
      stats.max = 0;
      stats.stack = undefined;
      stats.shared[0] = 0;
    }
    rejections = [];
    const t0 = performance.now();
    let outcome: Outcome = "ok";
    let error: ErrorInfo | undefined;
    try {
      if (job.mode === "step") await exerciseStep(job.dir);
      else if (job.mode === "get") await (await openStep(job.dir)).source.get(job.key ?? "");
      else await exerciseDb(job.dir);
    } catch (e) {
      outcome = e instanceof Orbax2RegError ? "typed" : "untyped";
      error = errorInfo(e);
    }
    const ms = performance.now() - t0;
    // Let stray rejections (prefetched nodes nobody awaited) surface before reporting.
    await new Promise((r) => setTimeout(r, 0));
    // A full gc costs more than most jobs: collect only when what is left could matter (retained growth).
    if (process.memoryUsage().arrayBuffers > GC_THRESHOLD) gc?.();
    const result: Omit<JobResult, "arrayBuffersGrowth"> = {
      outcome,
      ...(error ? { error } : {}),
      maxAlloc: stats?.max ?? 0,
      ...(stats?.stack ? { allocStack: stats.stack } : {}),
      arrayBuffers: process.memoryUsage().arrayBuffers,
      unhandledRejections: rejections,
      ms,
    };
    port.postMessage(result);
  });
}

/**
 * Runs in the worker before anything else (CommonJS, `eval: true`). Wraps every typed-array and
 * ArrayBuffer constructor in a Proxy, and Buffer.alloc*, to record the largest requested size (also in
 * shared memory, so the main thread still knows it after terminating a hung worker) and to refuse with a
 * RangeError anything over `hardLimit`: a bad input can then neither take the machine down nor reach
 * fs.read with a length past 2^31 (which aborts the whole process on Node 20). Then loads the transpiled
 * copy of this file and calls workerMain; fzstd, zstd-napi and src/ all see the wrapped functions.
 */
const BOOTSTRAP = `
const { workerData } = require("node:worker_threads");
process.setSourceMapsEnabled(true);
const stats = { max: 0, stack: undefined, shared: new Float64Array(workerData.shared) };
globalThis.__orbax2regFuzzAlloc = stats;
const track = (bytes) => {
  if (!(bytes > stats.max)) return;
  stats.max = bytes;
  stats.shared[0] = bytes;
  if (bytes > workerData.reportLimit && stats.stack === undefined) stats.stack = new Error("allocation of " + bytes + " bytes").stack;
  if (bytes > workerData.hardLimit) throw new RangeError("fuzz harness: refused an allocation of " + bytes + " bytes");
};
for (const name of ["ArrayBuffer", "SharedArrayBuffer", "Uint8Array", "Uint8ClampedArray", "Int8Array", "Uint16Array", "Int16Array",
    "Uint32Array", "Int32Array", "Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array"]) {
  const C = globalThis[name];
  const bpe = C.BYTES_PER_ELEMENT || 1;
  globalThis[name] = new Proxy(C, {
    construct(target, args, newTarget) {
      if (typeof args[0] === "number") track(args[0] * bpe);
      return Reflect.construct(target, args, newTarget);
    },
  });
}
// Buffer.alloc* create their memory inside Node (not through the globals above); zstd-napi, for one, sizes
// its output with Buffer.allocUnsafe(declared content size).
for (const name of ["alloc", "allocUnsafe", "allocUnsafeSlow"]) {
  const f = Buffer[name];
  Buffer[name] = function (size, ...rest) {
    if (typeof size === "number") track(size);
    return f.call(this, size, ...rest);
  };
}
import(workerData.entry).then((m) => m.workerMain());
`;

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

/** Transpiles src/**\/*.ts and this file into a temporary ESM tree the worker can import. */
async function transpileForWorker(): Promise<string> {
  const ts = (await import("typescript")).default;
  const out = mkdtempSync(join(tmpdir(), "orbax2reg-fuzz-build-"));
  writeFileSync(join(out, "package.json"), '{ "type": "module" }\n');
  symlinkSync(join(REPO, "node_modules"), join(out, "node_modules"), "dir");
  const sources: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const p = join(d, name);
      if (statSync(p).isDirectory()) walk(p);
      else if (p.endsWith(".ts") && !p.endsWith(".d.ts")) sources.push(p);
    }
  };
  walk(join(REPO, "src"));
  sources.push(fileURLToPath(import.meta.url));
  for (const file of sources) {
    const { outputText } = ts.transpileModule(readFileSync(file, "utf8"), {
      fileName: file,
      // Inline source maps: stacks from the worker name src/*.ts lines (see setSourceMapsEnabled below).
      compilerOptions: {
        module: ts.ModuleKind.ES2022,
        target: ts.ScriptTarget.ES2022,
        inlineSourceMap: true,
        sourceRoot: `${pathToFileURL(dirname(file)).href}/`,
      },
    });
    const dest = join(out, relative(REPO, file).replace(/\.ts$/, ".js"));
    mkdirSync(dirname(dest), { recursive: true });
    writeFileSync(dest, outputText);
  }
  return out;
}

export interface RunnerOptions {
  /** Allocations above this are recorded with their stack (default MEMORY_LIMIT). */
  readonly reportLimit?: number;
  /** Allocations above this are refused with a RangeError (default 1 GiB). */
  readonly hardLimit?: number;
  /** V8 old-space limit of the worker, so a runaway JS heap ends the worker, not the machine. */
  readonly maxOldGenerationSizeMb?: number;
}

/** Runs Jobs one at a time in a worker; a job past its deadline terminates the worker (a new one follows). */
export class FuzzRunner {
  private worker: Worker | undefined;
  private baseline: number | undefined;
  private shared = new Float64Array(new SharedArrayBuffer(8));
  workersStarted = 0;

  private constructor(
    private readonly buildDir: string,
    private readonly options: RunnerOptions,
  ) {}

  static async create(options: RunnerOptions = {}): Promise<FuzzRunner> {
    return new FuzzRunner(await transpileForWorker(), options);
  }

  /** A new worker, once it has loaded everything (start-up time is not charged to the first job). */
  private async spawn(): Promise<Worker> {
    const entry = pathToFileURL(join(this.buildDir, relative(REPO, fileURLToPath(import.meta.url)).replace(/\.ts$/, ".js"))).href;
    this.shared = new Float64Array(new SharedArrayBuffer(8));
    const w = new Worker(BOOTSTRAP, {
      eval: true,
      workerData: {
        entry,
        shared: this.shared.buffer,
        reportLimit: this.options.reportLimit ?? MEMORY_LIMIT,
        hardLimit: this.options.hardLimit ?? 2 ** 30,
      },
      resourceLimits: { maxOldGenerationSizeMb: this.options.maxOldGenerationSizeMb ?? 768 },
      stdout: false,
      stderr: false,
    });
    w.unref();
    this.baseline = undefined;
    this.workersStarted++;
    // Between jobs nobody else listens: an error must not become an uncaught 'error' event here, and a
    // worker that died is replaced at the next job.
    w.on("error", () => undefined);
    w.on("exit", () => {
      if (this.worker === w) this.worker = undefined;
    });
    await new Promise<void>((resolveReady, reject) => {
      const onExit = (code: number) => reject(new Error(`fuzz worker exited with code ${code} while starting`));
      w.once("exit", onExit);
      w.once("message", () => {
        w.off("exit", onExit);
        resolveReady();
      });
    });
    this.worker = w;
    return w;
  }

  private drop(w: Worker): void {
    if (this.worker === w) this.worker = undefined;
    void w.terminate();
  }

  async run(job: Job, timeoutMs: number): Promise<JobResult> {
    const w = this.worker ?? (await this.spawn());
    const shared = this.shared;
    const t0 = performance.now();
    return new Promise((resolvePromise) => {
      const finish = (r: Omit<JobResult, "arrayBuffersGrowth">) => {
        clearTimeout(timer);
        w.off("message", onMessage);
        w.off("error", onError);
        w.off("exit", onExit);
        if (r.outcome !== "timeout" && r.outcome !== "crash" && this.baseline === undefined) this.baseline = r.arrayBuffers;
        resolvePromise({ ...r, arrayBuffersGrowth: r.arrayBuffers - (this.baseline ?? r.arrayBuffers) });
      };
      const failed = (outcome: "timeout" | "crash", error: ErrorInfo) => {
        this.drop(w);
        finish({ outcome, error, maxAlloc: shared[0] ?? 0, arrayBuffers: 0, unhandledRejections: [], ms: performance.now() - t0 });
      };
      const onMessage = (r: Omit<JobResult, "arrayBuffersGrowth">) => finish(r);
      const onError = (e: unknown) => failed("crash", errorInfo(e));
      const onExit = (code: number) => failed("crash", { name: "WorkerExit", message: `worker exited with code ${code}` });
      const timer = setTimeout(
        () => failed("timeout", { name: "Timeout", message: `no answer within ${timeoutMs} ms (hang or busy loop)` }),
        timeoutMs,
      );
      w.on("message", onMessage);
      w.on("error", onError);
      w.on("exit", onExit);
      w.postMessage(job);
    });
  }

  async close(): Promise<void> {
    const w = this.worker;
    this.worker = undefined;
    if (w) await w.terminate();
    rmSync(this.buildDir, { recursive: true, force: true });
  }
}

/** What is wrong with a result, or undefined when it meets the requirement. */
export function violation(r: JobResult, limit = MEMORY_LIMIT): string | undefined {
  if (r.outcome === "untyped") return `non-typed error escaped: ${r.error?.stack ?? `${r.error?.name}: ${r.error?.message}`}`;
  if (r.outcome === "timeout" || r.outcome === "crash") return `${r.outcome}: ${r.error?.message}`;
  if (r.maxAlloc > limit) return `allocation of ${r.maxAlloc} bytes (limit ${limit}) at ${r.allocStack ?? "?"}`;
  if (r.arrayBuffersGrowth > limit) return `ArrayBuffer memory grew by ${r.arrayBuffersGrowth} bytes (limit ${limit})`;
  if (r.unhandledRejections.length > 0) return `unhandled rejection: ${r.unhandledRejections[0]}`;
  return undefined;
}
