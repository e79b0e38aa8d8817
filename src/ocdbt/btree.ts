import type { ByteReader } from "./byte-reader.js";
import { type DataFileId, decodeDataFileTable, readDataFileRef } from "./data-file-table.js";
import { compareKeys, concatBytes } from "./key.js";
import { type IndirectRef, readIndirectRefColumns, readStatsColumns, type SubtreeStats } from "./node-reference.js";

/** A leaf value: stored in the node itself, or raw bytes at a range of a data file. */
export type ValueRef = { readonly kind: "inline"; readonly bytes: Uint8Array } | { readonly kind: "indirect"; readonly ref: IndirectRef };

export interface LeafEntry {
  /** The full key (the node's implicit prefix included). */
  readonly key: Uint8Array;
  readonly value: ValueRef;
}

export interface InteriorEntry {
  /** Inclusive lower bound of the child's keys (full key). */
  readonly key: Uint8Array;
  /** Implicit prefix of every key in the child: the part its stored keys leave out. */
  readonly childPrefix: Uint8Array;
  readonly ref: IndirectRef;
  readonly stats: SubtreeStats;
}

export type BtreeNode =
  | { readonly height: 0; readonly entries: LeafEntry[] }
  | { readonly height: number; readonly entries: InteriorEntry[] };

const MAX_ENTRIES = 1048576;
const MAX_INLINE_VALUE = 1 << 20;
const MAX_KEY_LENGTH = 65535;

/**
 * Decodes a B+tree node body (after the envelope). `prefix` is the implicit key prefix the parent gave this
 * node, `transitivePath` the base path of the reference it was read through.
 */
export function decodeBtreeNode(r: ByteReader, prefix: Uint8Array, transitivePath: string, expectedHeight: number): BtreeNode {
  const heightAt = r.offset;
  const height = r.u8("height");
  if (height !== expectedHeight) r.fail(`b-tree node height ${height}, expected ${expectedHeight}`, heightAt);
  const files = decodeDataFileTable(r, transitivePath);
  const countAt = r.offset;
  const n = r.count("entry count", MAX_ENTRIES, 1);
  if (n === 0) r.fail("empty b-tree node", countAt);

  const prefixLengths = [0];
  for (let i = 1; i < n; i++) prefixLengths.push(r.varint16("key prefix length"));
  const suffixLengths: number[] = [];
  for (let i = 0; i < n; i++) suffixLengths.push(r.varint16("key suffix length"));
  const subtreePrefixLengths: number[] = [];
  if (height > 0) for (let i = 0; i < n; i++) subtreePrefixLengths.push(r.varint16("subtree common prefix length"));

  // A leaf's keys are made whole (the node's prefix in front) in place; an interior node's stay relative.
  const whole = height === 0 ? prefix : new Uint8Array(0);
  const slabs = new KeySlabs(keyBytes(n, whole.length, prefixLengths, suffixLengths));
  const keys: Uint8Array[] = [];
  let prev: Uint8Array = new Uint8Array(0);
  for (let i = 0; i < n; i++) {
    const p = prefixLengths[i] as number;
    const s = suffixLengths[i] as number;
    const at = r.offset;
    const prevLength = i === 0 ? 0 : prev.length - whole.length;
    if (p > prevLength) r.fail(`key ${i}: prefix length ${p} exceeds previous key length ${prevLength}`, at);
    if (prefix.length + p + s > MAX_KEY_LENGTH) r.fail(`key ${i}: longer than ${MAX_KEY_LENGTH} bytes`, at);
    const key = slabs.take(whole.length + p + s);
    key.set(whole, 0);
    key.set(prev.subarray(whole.length, whole.length + p), whole.length);
    key.set(r.take(s, "key suffix"), whole.length + p);
    if (i > 0 && compareKeys(prev, key) >= 0) r.fail(`key ${i}: keys are not strictly increasing`, at);
    keys.push(key);
    prev = key;
  }

  if (height === 0) return { height: 0, entries: decodeLeafValues(r, keys, files) };
  const relativeKeys = keys;

  const refs = readIndirectRefColumns(r, n, files, false, "child");
  const stats = readStatsColumns(r, n, "child");
  r.expectEnd("b-tree interior node");
  const entries = relativeKeys.map((rel, i): InteriorEntry => {
    const common = subtreePrefixLengths[i] as number;
    if (common > rel.length) r.fail(`entry ${i}: subtree common prefix length ${common} exceeds key length ${rel.length}`);
    return {
      key: concatBytes(prefix, rel),
      childPrefix: concatBytes(prefix, rel.subarray(0, common)),
      ref: refs[i] as IndirectRef,
      stats: stats[i] as SubtreeStats,
    };
  });
  return { height, entries };
}

/** The bytes of a node's keys, each `extra` bytes (the prefix made whole) plus its own. */
function keyBytes(n: number, extra: number, prefixLengths: readonly number[], suffixLengths: readonly number[]): number {
  let total = 0;
  for (let i = 0; i < n; i++) total += extra + (prefixLengths[i] as number) + (suffixLengths[i] as number);
  return total;
}

/** Bytes of the slabs that a large node's keys are cut from. */
const SLAB_BYTES = 1 << 20;

/**
 * A node's keys as views of a few shared slabs, not one buffer each: a leaf of 520k keys is then its key
 * bytes and one view per key, where a buffer per key (and one more to prepend the prefix) cost several
 * hundred bytes each, held for as long as the node is cached. Slabs are at most 1 MiB and no larger than
 * the bytes the node says are still to come (so a small node costs its own bytes), and are allocated only
 * as keys are decoded: a node that claims more than it holds fails before it costs more than a slab.
 */
class KeySlabs {
  private slab = new Uint8Array(0);
  private used = 0;

  constructor(private left: number) {}

  take(length: number): Uint8Array {
    if (this.used + length > this.slab.length) {
      this.slab = new Uint8Array(Math.max(length, Math.min(SLAB_BYTES, this.left)));
      this.used = 0;
    }
    const key = this.slab.subarray(this.used, this.used + length);
    this.used += length;
    this.left -= length;
    return key;
  }
}

/** `keys`: the leaf's whole keys (the node's prefix included). */
function decodeLeafValues(r: ByteReader, keys: Uint8Array[], files: readonly DataFileId[]): LeafEntry[] {
  const n = keys.length;
  const lengths: number[] = [];
  for (let i = 0; i < n; i++) lengths.push(r.varint("value length"));
  const kinds: number[] = [];
  for (let i = 0; i < n; i++) {
    const at = r.offset;
    const kind = r.u8("value kind");
    if (kind > 1) r.fail(`value kind ${kind} (0 = inline, 1 = out-of-line)`, at);
    kinds.push(kind);
  }
  const indirect = kinds.filter((k) => k === 1).length;
  const ids: DataFileId[] = [];
  for (let i = 0; i < indirect; i++) ids.push(readDataFileRef(r, files, "value data file index"));
  const offsets: number[] = [];
  for (let i = 0; i < indirect; i++) offsets.push(r.varint("value offset"));

  const entries: LeafEntry[] = [];
  let k = 0;
  for (let i = 0; i < n; i++) {
    const length = lengths[i] as number;
    const key = keys[i] as Uint8Array;
    if (kinds[i] === 0) {
      if (length > MAX_INLINE_VALUE) r.fail(`inline value of ${length} bytes exceeds 1 MiB`);
      entries.push({ key, value: { kind: "inline", bytes: r.take(length, "inline value") } });
    } else {
      const offset = offsets[k] as number;
      if (offset + length > Number.MAX_SAFE_INTEGER) r.fail(`value range ${offset}+${length} is out of range`);
      entries.push({ key, value: { kind: "indirect", ref: { file: ids[k] as DataFileId, offset, length } } });
      k++;
    }
  }
  r.expectEnd("b-tree leaf node");
  return entries;
}
