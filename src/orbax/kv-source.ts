import type { Entry, OcdbtDatabase, ValueLocation } from "../ocdbt/database.js";
import { compareKeys, keyBytes } from "../ocdbt/key.js";
import { describe, joinKey, type Store } from "../store/store.js";

/**
 * The key-value namespace an Orbax PyTree item stores its zarr arrays in (`<param>/.zarray`,
 * `<param>/0.0`, ...), whatever holds it: the merged OCDBT root, the union of per-process databases of an
 * unmerged step, or plain per-parameter directories (non-OCDBT layout).
 */
export interface KvSource {
  readonly kind: "ocdbt" | "ocdbt-unmerged" | "directory";
  get(key: string): Promise<Entry | undefined>;
  /** Entries whose key starts with `prefix`, in key order, without reading values. */
  list(prefix: string): AsyncIterable<Entry>;
  read(value: ValueLocation): Promise<Uint8Array>;
  /** A location for messages about `key`. */
  describe(key: string): string;
}

export class OcdbtSource implements KvSource {
  readonly kind = "ocdbt";
  constructor(readonly db: OcdbtDatabase) {}
  get(key: string) {
    return this.db.get(key);
  }
  list(prefix: string) {
    return this.db.list(prefix);
  }
  read(value: ValueLocation) {
    return this.db.readValue(value);
  }
  describe(key: string) {
    return `${describe(this.db.store, this.db.root)} (ocdbt) key ${JSON.stringify(key)}`;
  }
}

/** Per-process databases of a step whose merge never ran: their union, the first database winning. */
export class UnionSource implements KvSource {
  readonly kind = "ocdbt-unmerged";
  constructor(
    readonly dbs: readonly OcdbtDatabase[],
    private readonly where: string,
  ) {}

  async get(key: string): Promise<Entry | undefined> {
    for (const db of this.dbs) {
      const e = await db.get(key);
      if (e !== undefined) return e;
    }
    return undefined;
  }

  async *list(prefix: string): AsyncIterable<Entry> {
    // A k-way merge of sorted listings; small k (one per process), so a linear scan for the minimum is fine.
    const its = this.dbs.map((db) => db.list(prefix)[Symbol.asyncIterator]());
    const heads = await Promise.all(its.map((it) => it.next()));
    let last: Uint8Array | undefined;
    for (;;) {
      let best = -1;
      for (let i = 0; i < heads.length; i++) {
        const h = heads[i];
        if (h === undefined || h.done) continue;
        const b = best < 0 ? undefined : heads[best];
        if (b === undefined || b.done || compareKeys(keyBytes(h.value.key), keyBytes(b.value.key)) < 0) best = i;
      }
      if (best < 0) return;
      const head = heads[best] as IteratorResult<Entry> & { done: false };
      const kb = keyBytes(head.value.key);
      if (last === undefined || compareKeys(kb, last) !== 0) yield head.value;
      last = kb;
      heads[best] = await (its[best] as AsyncIterator<Entry>).next();
    }
  }

  read(value: ValueLocation) {
    return (this.dbs[0] as OcdbtDatabase).readValue(value);
  }

  describe(key: string) {
    return `${this.where} (unmerged ocdbt) key ${JSON.stringify(key)}`;
  }
}

/** The non-OCDBT layout: each key is an object under the item directory. */
export class DirectorySource implements KvSource {
  readonly kind = "directory";
  constructor(
    readonly store: Store,
    readonly root: string,
  ) {}

  async get(key: string): Promise<Entry | undefined> {
    const info = await this.store.stat(joinKey(this.root, key));
    return info === undefined ? undefined : { key, value: { kind: "file", key: info.key, offset: 0, length: info.size } };
  }

  async *list(prefix: string): AsyncIterable<Entry> {
    const base = this.root === "" ? "" : `${this.root}/`;
    for await (const o of this.store.list(base + prefix)) {
      yield { key: o.key.slice(base.length), value: { kind: "file", key: o.key, offset: 0, length: o.size } };
    }
  }

  read(value: ValueLocation): Promise<Uint8Array> {
    if (value.kind === "inline") return Promise.resolve(value.bytes);
    return this.store.read(value.key);
  }

  describe(key: string) {
    return describe(this.store, joinKey(this.root, key));
  }
}
