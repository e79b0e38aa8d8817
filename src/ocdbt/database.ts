import { FormatError, LimitError, NotFoundError } from "../errors.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { type BtreeNode, decodeBtreeNode, type InteriorEntry, type LeafEntry, type ValueRef } from "./btree.js";
import type { OcdbtConfig } from "./config.js";
import { dataFilePath } from "./data-file-table.js";
import { decodeEnvelope } from "./envelope.js";
import { compareKeys, keyBytes, prefixUpperBound, startsWith } from "./key.js";
import { decodeManifest, latestVersion, type Manifest } from "./manifest.js";
import type { IndirectRef } from "./node-reference.js";
import type { VersionEntry } from "./version-tree.js";

/** TensorStore's default max_decoded_node_bytes; also the floor of what we accept for any node. */
const DEFAULT_MAX_DECODED_BYTES = 8 << 20;
/** Ceiling on what a manifest may raise max_decoded_node_bytes to (Orbax uses 100 MB). */
const MAX_DECODED_BYTES_CEILING = 512 << 20;
/** An encoded node is at most its decoded body plus envelope and zstd framing. */
const ENVELOPE_SLACK = 1 << 20;
const utf8 = new TextDecoder();
/** Children fetched ahead of the one being walked, so a listing over GCS is not one round trip per node. */
const PREFETCH = 8;
/**
 * Decoded nodes are kept after use, the most recently used first, until they hold this many entries in all
 * (the last one used is kept whatever its size): listing array after array reads a leaf they share once, and
 * lookups pass the root and the upper levels, always recent; but a database of millions of keys is never
 * held whole (a listing holds only its path and prefetch): memory follows what is read, not how many keys
 * the database holds.
 */
const ENTRIES_KEPT = 1 << 15;

/** Where a value's bytes are: inline in the tree, or a byte range of an object in the store. */
export type ValueLocation =
  | { readonly kind: "inline"; readonly bytes: Uint8Array }
  | { readonly kind: "file"; readonly key: string; readonly offset: number; readonly length: number };

export interface Entry {
  readonly key: string;
  readonly value: ValueLocation;
}

export interface ReadStats {
  nodesRead: number;
  nodeBytesRead: number;
  /** Leaf entries a listing looked at: what it yields plus a seek's few comparisons, not the leaf's size. */
  leafEntriesVisited: number;
}

/**
 * A read-only view of the latest version of one OCDBT database at `root` (a key prefix of `store`, "" for
 * the store's root). Nodes are fetched lazily; the most recently used are kept (ENTRIES_KEPT).
 */
export class OcdbtDatabase {
  readonly stats: ReadStats = { nodesRead: 0, nodeBytesRead: 0, leafEntriesVisited: 0 };
  /** Least recently used first, each with its entry count once decoded (see ENTRIES_KEPT). */
  private readonly nodes = new Map<string, { node: Promise<BtreeNode>; entries: number }>();
  private entriesKept = 0;
  private readonly maxNodeBytes: number;

  private constructor(
    readonly store: Store,
    readonly root: string,
    readonly config: OcdbtConfig,
    /** undefined for a database with no committed version. */
    readonly version: VersionEntry | undefined,
    readonly manifestKey: string,
  ) {
    this.maxNodeBytes = Math.min(Math.max(config.maxDecodedNodeBytes, DEFAULT_MAX_DECODED_BYTES), MAX_DECODED_BYTES_CEILING);
  }

  /** Opens the database whose `manifest.ocdbt` is at `root`/manifest.ocdbt. */
  static async open(store: Store, root = ""): Promise<OcdbtDatabase> {
    const manifestKey = joinKey(root, "manifest.ocdbt");
    let manifest = await readManifest(store, manifestKey);
    let versionsKey = manifestKey;
    if (manifest.kind === "config-only") {
      versionsKey = await newestNumberedManifest(store, root);
      const numbered = await readManifest(store, versionsKey);
      if (numbered.kind !== "versions") {
        throw new FormatError("numbered manifest holds only a config", { path: describe(store, versionsKey) });
      }
      const expected = Number.parseInt(versionsKey.slice(-16), 16);
      const latest = latestVersion(numbered);
      if (latest !== undefined && latest.generation !== expected) {
        throw new FormatError(`latest generation ${latest.generation} does not match the file name`, {
          path: describe(store, versionsKey),
        });
      }
      manifest = numbered;
    }
    return new OcdbtDatabase(store, root, manifest.config, latestVersion(manifest), versionsKey);
  }

  /** The store key of a data file named in the tree. */
  dataFileKey(ref: IndirectRef): string {
    return joinKey(this.root, dataFilePath(ref.file));
  }

  location(value: ValueRef): ValueLocation {
    if (value.kind === "inline") return value;
    // An empty value written out of line carries the empty file id; there is nothing to read.
    if (value.ref.length === 0) return { kind: "inline", bytes: new Uint8Array(0) };
    return { kind: "file", key: this.dataFileKey(value.ref), offset: value.ref.offset, length: value.ref.length };
  }

  /** Looks up one key; undefined if absent. */
  async get(key: string): Promise<Entry | undefined> {
    const target = keyBytes(key);
    const v = this.version;
    if (v?.root == null) return undefined;
    let node = await this.node(v.root, new Uint8Array(0), v.rootHeight);
    for (;;) {
      if (node.height === 0) {
        const entries = node.entries as LeafEntry[];
        const hit = entries[lowerBound(entries, target)];
        return hit === undefined || compareKeys(hit.key, target) !== 0 ? undefined : { key, value: this.location(hit.value) };
      }
      const entries = node.entries as InteriorEntry[];
      const i = upperBound(entries, target) - 1;
      if (i < 0) return undefined;
      const child = entries[i] as InteriorEntry;
      if (!startsWith(target, child.childPrefix)) return undefined;
      node = await this.node(child.ref, child.childPrefix, node.height - 1);
    }
  }

  /** Every entry whose key starts with `prefix`, in key order, without reading any value bytes. */
  async *list(prefix = ""): AsyncIterable<Entry> {
    const v = this.version;
    if (v?.root == null) return;
    const min = keyBytes(prefix);
    const max = prefixUpperBound(min);
    // Leaves come up as whole batches: one generator hop per leaf, not one per key per level.
    for await (const batch of this.leaves(this.node(v.root, new Uint8Array(0), v.rootHeight), v.rootHeight, min, max)) yield* batch;
  }

  private async *leaves(
    nodePromise: Promise<BtreeNode>,
    height: number,
    min: Uint8Array,
    max: Uint8Array | undefined,
  ): AsyncIterable<Entry[]> {
    const node = await nodePromise;
    if (height === 0) {
      // Seek (one listing per array over a leaf of 500k keys must not scan it from its start each time).
      const entries = node.entries as LeafEntry[];
      const end = max === undefined ? entries.length : lowerBound(entries, max);
      const batch: Entry[] = [];
      for (let i = lowerBound(entries, min); i < end; i++) {
        const e = entries[i] as LeafEntry;
        batch.push({ key: utf8.decode(e.key), value: this.location(e.value) });
      }
      this.stats.leafEntriesVisited += batch.length + Math.ceil(Math.log2(entries.length + 1));
      yield batch;
      return;
    }
    const entries = node.entries as InteriorEntry[];
    // Children from the last one whose lower bound is <= min, up to the first whose lower bound is >= max;
    // the first is skipped when its common prefix says all its keys sort before min.
    let first = Math.max(0, upperBound(entries, min) - 1);
    const end = max === undefined ? entries.length : lowerBound(entries, max);
    const head = entries[first];
    if (head !== undefined && before(head.childPrefix, min)) first++;
    const pending: Promise<BtreeNode>[] = [];
    const fetch = (i: number) => {
      const c = entries[i] as InteriorEntry;
      const p = this.node(c.ref, c.childPrefix, height - 1);
      p.catch(() => undefined); // surfaced when awaited in order
      return p;
    };
    for (let i = first; i < Math.min(end, first + PREFETCH); i++) pending.push(fetch(i));
    for (let i = first; i < end; i++) {
      const next = i + PREFETCH;
      if (next < end) pending.push(fetch(next));
      yield* this.leaves(pending.shift() as Promise<BtreeNode>, height - 1, min, max);
    }
  }

  /** The bytes of a value (inline, or a ranged read of its data file). */
  async readValue(value: ValueLocation): Promise<Uint8Array> {
    if (value.kind === "inline") return value.bytes;
    if (value.length === 0) return new Uint8Array(0);
    return this.store.readRange(value.key, value.offset, value.length);
  }

  private node(ref: IndirectRef, prefix: Uint8Array, height: number): Promise<BtreeNode> {
    const key = this.dataFileKey(ref);
    if (ref.length > this.maxNodeBytes + ENVELOPE_SLACK) {
      return Promise.reject(
        new LimitError(`b-tree node of ${ref.length} bytes exceeds max_decoded_node_bytes (${this.maxNodeBytes})`, {
          path: describe(this.store, key),
          offset: ref.offset,
        }),
      );
    }
    // The same bytes reached at another height or under another prefix would decode differently (a
    // corrupted tree can point a child at its ancestor); only an identical reference shares the cache.
    const id = `${key}@${ref.offset}+${ref.length}#${height}:${Buffer.from(prefix).toString("hex")}`;
    const kept = this.nodes.get(id);
    if (kept !== undefined) {
      this.nodes.delete(id); // set again: the most recently used
      this.nodes.set(id, kept);
      return kept.node;
    }
    const p = this.store.readRange(key, ref.offset, ref.length).then((bytes) => {
      this.stats.nodesRead++;
      this.stats.nodeBytesRead += bytes.length;
      const body = decodeEnvelope(bytes, "btreeNode", describe(this.store, key), this.maxNodeBytes, ref.offset);
      return decodeBtreeNode(body, prefix, ref.file.basePath, height);
    });
    const entry = { node: p, entries: 0 };
    this.nodes.set(id, entry);
    p.then(
      (node) => {
        if (this.nodes.get(id) !== entry) return; // evicted meanwhile
        entry.entries = node.entries.length;
        this.entriesKept += entry.entries;
        for (const [oldest, e] of this.nodes) {
          if (this.entriesKept <= ENTRIES_KEPT || oldest === id) break;
          this.nodes.delete(oldest);
          this.entriesKept -= e.entries;
        }
      },
      () => undefined, // the caller sees the failure; a failed read stays cached like a node (the same answer)
    );
    return p;
  }
}

/** Index of the first entry whose key is >= `key`. */
function lowerBound(entries: readonly { key: Uint8Array }[], key: Uint8Array): number {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (compareKeys((entries[mid] as { key: Uint8Array }).key, key) < 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

/** Whether every key starting with `prefix` sorts before `min` (neither is a prefix of the other, and prefix is less). */
function before(prefix: Uint8Array, min: Uint8Array): boolean {
  return !startsWith(prefix, min) && !startsWith(min, prefix) && compareKeys(prefix, min) < 0;
}

/** Index of the first entry whose key is > `key`. */
function upperBound(entries: readonly { key: Uint8Array }[], key: Uint8Array): number {
  let lo = 0;
  let hi = entries.length;
  while (lo < hi) {
    const mid = (lo + hi) >>> 1;
    if (compareKeys((entries[mid] as { key: Uint8Array }).key, key) <= 0) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

async function readManifest(store: Store, key: string): Promise<Manifest> {
  const bytes = await store.read(key);
  return decodeManifest(decodeEnvelope(bytes, "manifest", describe(store, key), DEFAULT_MAX_DECODED_BYTES));
}

async function newestNumberedManifest(store: Store, root: string): Promise<string> {
  const prefix = joinKey(root, "manifest.");
  let best: { key: string; n: bigint } | undefined;
  for await (const o of store.list(prefix)) {
    const hex = o.key.slice(o.key.lastIndexOf("manifest.") + "manifest.".length);
    if (!/^[0-9a-f]{16}$/.test(hex)) continue;
    const n = BigInt(`0x${hex}`);
    if (n === 0n) continue;
    if (best === undefined || n > best.n) best = { key: o.key, n };
  }
  if (best === undefined)
    throw new NotFoundError("numbered manifest kind, but no manifest.<16 hex> file", { path: describe(store, prefix) });
  return best.key;
}
