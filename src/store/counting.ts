import type { DirListing, ObjectInfo, Store, VersionedObjects, WriteOptions, WriteResult } from "./store.js";

export interface StoreCounts {
  reads: number;
  rangeReads: number;
  bytesRead: number;
  writes: number;
  bytesWritten: number;
  lists: number;
  stats: number;
  deletes: number;
}

/**
 * Wraps a store and counts its operations (the benchmark reports reads per chunk and writes per object).
 * With `log`, it also records each whole read and each ranged read, for tests that check what was touched.
 */
export class CountingStore implements Store {
  readonly counts: StoreCounts = { reads: 0, rangeReads: 0, bytesRead: 0, writes: 0, bytesWritten: 0, lists: 0, stats: 0, deletes: 0 };
  readonly reads: string[] = [];
  readonly ranges: { key: string; offset: number; length: number }[] = [];

  // The optional capabilities exist exactly where the inner store has them (callers test for them), and
  // count as the operations they are: a conditional read is a read, a conditional write a write.
  readonly versioned?: VersionedObjects;
  readonly removeAbandoned?: (prefix: string) => Promise<number>;
  readonly abandonedIn?: (dir: string) => Promise<string[]>;
  readonly removeEmptyDirectories?: (prefix: string) => Promise<void>;
  readonly readRangeInto?: (key: string, offset: number, length: number, into: Uint8Array) => Promise<Uint8Array>;

  constructor(
    readonly inner: Store,
    private readonly options: { log?: boolean } = {},
  ) {
    const versioned = inner.versioned;
    if (versioned !== undefined) {
      const counts = this.counts;
      this.versioned = {
        get: async (key) => {
          counts.reads++;
          const out = await versioned.get(key);
          if (out !== undefined) counts.bytesRead += out.data.length;
          return out;
        },
        create: (key, data) => {
          counts.writes++;
          counts.bytesWritten += data.length;
          return versioned.create(key, data);
        },
        replace: (key, data, version) => {
          counts.writes++;
          counts.bytesWritten += data.length;
          return versioned.replace(key, data, version);
        },
        delete: (key, version) => {
          counts.deletes++;
          return versioned.delete(key, version);
        },
      };
    }
    const { removeAbandoned, abandonedIn, removeEmptyDirectories, readRangeInto } = inner;
    if (readRangeInto !== undefined) {
      this.readRangeInto = (key, offset, length, into) => {
        this.countRange(key, offset, length);
        return readRangeInto.call(inner, key, offset, length, into);
      };
    }
    if (removeAbandoned !== undefined) this.removeAbandoned = (prefix) => removeAbandoned.call(inner, prefix);
    if (abandonedIn !== undefined) {
      this.abandonedIn = (dir) => {
        this.counts.lists++;
        return abandonedIn.call(inner, dir);
      };
    }
    if (removeEmptyDirectories !== undefined) {
      this.removeEmptyDirectories = (prefix) => removeEmptyDirectories.call(inner, prefix);
    }
  }

  get url(): string {
    return this.inner.url;
  }

  get renamesAtomically(): boolean | undefined {
    return this.inner.renamesAtomically;
  }

  get writeBuffer(): number | undefined {
    return this.inner.writeBuffer;
  }

  // No rangeCopyTo: a direct copy would bypass the counts (every byte goes through readStream and write).

  // Durability passes through (it moves no bytes the counts would miss): a counted run is as durable as any.
  async makeDurable(prefix: string): Promise<void> {
    await this.inner.makeDurable?.(prefix);
  }

  async flushed(): Promise<void> {
    await this.inner.flushed?.();
  }

  async read(key: string): Promise<Uint8Array> {
    this.counts.reads++;
    if (this.options.log) this.reads.push(key);
    const out = await this.inner.read(key);
    this.counts.bytesRead += out.length;
    return out;
  }

  async readHead(key: string, max: number): Promise<{ bytes: Uint8Array; size: number } | undefined> {
    this.counts.rangeReads++;
    if (this.options.log) this.ranges.push({ key, offset: 0, length: max });
    const head = await this.inner.readHead(key, max);
    this.counts.bytesRead += head?.bytes.length ?? 0;
    return head;
  }

  readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    this.countRange(key, offset, length);
    return this.inner.readRange(key, offset, length);
  }

  readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array> {
    this.countRange(key, offset, length);
    return this.inner.readStream(key, offset, length);
  }

  /** A ranged read, however it is made (readRange, readRangeInto, readStream). */
  private countRange(key: string, offset: number, length: number): void {
    this.counts.rangeReads++;
    this.counts.bytesRead += length;
    if (this.options.log) this.ranges.push({ key, offset, length });
  }

  list(prefix: string): AsyncIterable<ObjectInfo> {
    this.counts.lists++;
    return this.inner.list(prefix);
  }

  listDir(dir: string): Promise<DirListing> {
    this.counts.lists++;
    return this.inner.listDir(dir);
  }

  write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>, options?: WriteOptions): Promise<WriteResult> {
    this.counts.writes++;
    if (data instanceof Uint8Array) {
      this.counts.bytesWritten += data.length;
      return this.inner.write(key, data, options);
    }
    const counts = this.counts;
    return this.inner.write(
      key,
      (async function* () {
        for await (const piece of data) {
          counts.bytesWritten += piece.length;
          yield piece;
        }
      })(),
      options,
    );
  }

  stat(key: string): Promise<ObjectInfo | undefined> {
    this.counts.stats++;
    return this.inner.stat(key);
  }

  createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    this.counts.writes++;
    this.counts.bytesWritten += data.length;
    return this.inner.createExclusive(key, data);
  }

  delete(key: string): Promise<void> {
    this.counts.deletes++;
    return this.inner.delete(key);
  }
}
