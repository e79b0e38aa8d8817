import { NotFoundError, UsageError } from "../errors.js";

export interface ObjectInfo {
  /** Key relative to the store's root, `/`-separated. */
  readonly key: string;
  readonly size: number;
  /** CRC-32C of the stored bytes, where the store keeps one (GCS does for every object; a local directory does not). */
  readonly crc32c?: number;
  /**
   * The version listed or stat'ed (a GCS generation), where the store has versions (`versioned`): what
   * `deleteSeen` deletes and nothing newer.
   */
  readonly version?: string;
}

/**
 * What a write stored: its size and the CRC-32C of its bytes (computed while writing), which a store may leave out
 * only when the caller asked for none (WriteOptions.checksum).
 */
export interface WriteResult {
  readonly size: number;
  readonly crc32c?: number;
}

/** How a write may go about it. */
export interface WriteOptions {
  /**
   * The most a streamed write may hold in memory (the caller's budget for it): a store that buffers a stream
   * (GCS: one resumable chunk) buffers no more than this; without it, the store's own default.
   */
  readonly bufferBytes?: number;
  /**
   * The object is scratch, deleted before the caller's operation ends: a store that flushes each write to disk
   * in the background (a local directory) need not, since nothing will rely on it after a crash.
   */
  readonly scratch?: boolean;
  /**
   * false: the caller checks nothing against the bytes' CRC-32C, so a store that computes it only to return it (a
   * local directory) skips it. import-hf's chunks (1.8 GB for the 2 GB benchmark source; a resumed import keeps
   * every chunk under its name, it records no checksum): the CRC was 3-5 % of its CPU. GCS computes it anyway, to
   * have each upload checked against it.
   */
  readonly checksum?: false;
}

export interface DirListing {
  readonly files: ObjectInfo[];
  readonly dirs: string[];
  /**
   * True when the directory itself does not exist (a local store; an empty GCS prefix is only empty), so that
   * a mistyped path can be said to be one rather than "nothing useful here".
   */
  readonly absent?: boolean;
  /** True when a file is there instead of a directory (a local store), so that a message can say so. */
  readonly file?: boolean;
}

/**
 * All I/O goes through this: a flat namespace of objects under one root URL (a local directory or a
 * gs://bucket/prefix). Keys are relative, `/`-separated, and never contain `.`/`..` or empty segments.
 */
export interface Store {
  /** The root, as the user gave it (used in messages). */
  readonly url: string;
  /** The whole object; NotFoundError if absent. */
  read(key: string): Promise<Uint8Array>;
  /** Exactly `length` bytes from `offset`; FormatError if the object is shorter, NotFoundError if absent. */
  readRange(key: string, offset: number, length: number): Promise<Uint8Array>;
  /**
   * Optional capability: readRange's bytes read into `into` (at least `length` long), resolving to its first
   * `length` bytes; same errors as readRange. A caller reading thousands of small ranges it is done with at once
   * (a finely cut source's compressed chunks) reuses its buffers instead of leaving a fresh one per read to the
   * garbage collector. A local directory and GCS have it (export-hf's small chunks and import-hf's rows from either
   * are read through it); a store without it is read with readRange.
   */
  readRangeInto?(key: string, offset: number, length: number, into: Uint8Array): Promise<Uint8Array>;
  /**
   * The object's first `max` bytes (all of it when shorter) and its whole size, in one request; undefined if
   * absent. Reads a small object whose size is not to be trusted (a plan's head, checked every 500 ms while a
   * conversion writes) in bounded memory, without a stat first.
   */
  readHead(key: string, max: number): Promise<{ bytes: Uint8Array; size: number } | undefined>;
  /**
   * The same bytes as readRange, as a stream of pieces, so a large range never sits in memory whole.
   * Ends with a FormatError if the object is shorter than `offset + length`. Each piece is the reader's: the
   * store never writes into it again (an upload's socket may still hold one while the next is read).
   */
  readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array>;
  /** Every object whose key starts with `prefix` (a plain string prefix, not only a directory), sorted by key. */
  list(prefix: string): AsyncIterable<ObjectInfo>;
  /**
   * The immediate children of a directory-like key prefix ("" for the root): objects directly inside it,
   * and the names of sub-"directories" (without a trailing slash). Cheap even when the tree below is huge.
   */
  listDir(dir: string): Promise<DirListing>;
  /**
   * Creates or replaces the object from bytes or a stream of pieces. Atomic: until it resolves, readers
   * see the old object (or none), never a partial one.
   */
  write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>, options?: WriteOptions): Promise<WriteResult>;
  /**
   * Optional property: the bytes a streamed write buffers at most beyond the piece in hand (GCS: one chunk of a
   * resumable upload). A caller budgeting memory reserves this much for each, or passes less as bufferBytes.
   */
  readonly writeBuffer?: number;
  /**
   * Creates the object only if no object has that key (atomically: of two concurrent callers exactly one
   * wins). Returns false when the key already exists. Used for claims that must be taken once.
   */
  createExclusive(key: string, data: Uint8Array): Promise<boolean>;
  /** Removes the object if it exists. */
  delete(key: string): Promise<void>;
  /** The object's size if it exists: the store's "exists". */
  stat(key: string): Promise<ObjectInfo | undefined>;
  /**
   * Optional capability: compare-and-swap on small objects, for the pipeline's claims. GCS has it (object
   * generations); a local directory does not, and callers that need it say so (check before use).
   */
  readonly versioned?: VersionedObjects;
  /**
   * Optional capability: make every object under `prefix` (a directory's key, or one object's), and its
   * name, durable: called before a commit marker is written, and for the marker after. A local directory
   * flushes its files and fsyncs its directories (a renamed file's name lives in its directory, not in the
   * file); GCS objects are durable once their upload completes, so GCS has nothing to do and omits this.
   */
  makeDurable?(prefix: string): Promise<void>;
  /**
   * Optional capability: resolves once the background work this store's writes started is done (a local
   * directory's flushes after each rename), and rejects with the first of them that failed: a write is not
   * done until its bytes are on disk, so a caller's operation ends with this, failed or not.
   */
  flushed?(): Promise<void>;
  /**
   * Optional capability: removes temporary files under `prefix` whose writer is certainly gone (a local
   * directory's write-then-rename leaves them when killed; GCS uploads leave nothing). Never removes a
   * live writer's. Returns how many were removed.
   */
  removeAbandoned?(prefix: string): Promise<number>;
  /**
   * Optional capability: the keys of the temporary files directly in directory `dir` ("" for the root) whose
   * writer is certainly gone, sorted; `delete` removes one. Where removeAbandoned cleans up, this says what there
   * is (an export-hf folder's leftovers, which an upload of the folder would publish). GCS omits it (see above).
   */
  abandonedIn?(dir: string): Promise<string[]>;
  /**
   * Optional capability: removes the directories under `prefix` (and the one it names) that hold nothing,
   * after its objects were deleted. A local directory keeps empty directories; GCS has none, so it omits this.
   */
  removeEmptyDirectories?(prefix: string): Promise<void>;
  /**
   * Optional capability: a direct copy of byte ranges from this store into `target`, or undefined where
   * this store has none into that target (then read a stream and write it). A local directory copies into
   * another local directory through a buffer the caller reuses from copy to copy (a fresh buffer per piece
   * costs more in allocation and page faults than the copy itself).
   */
  rangeCopyTo?(target: Store): RangeCopy | undefined;
  /**
   * Optional property: true where a directory can be renamed atomically (a local filesystem), so a writer
   * may commit a directory by renaming it into place and a directory under its final name is complete.
   * Object stores (GCS) have no rename: they omit this, and their writers commit with a marker object.
   */
  readonly renamesAtomically?: boolean;
}

/**
 * Copies `length` bytes at `offset` of the source store's `key` to `targetKey` of the target store, through
 * `buffer` (the caller's, reused across copies). Atomic and durable like `write`; verbatim, so no CRC-32C is
 * computed: what the copy is checked against later is its source. Resolves to the size stored.
 */
export type RangeCopy = (key: string, offset: number, length: number, targetKey: string, buffer: Uint8Array) => Promise<{ size: number }>;

/** One version of an object: its bytes and an opaque token (a GCS generation) naming exactly that version. */
export interface Versioned {
  readonly data: Uint8Array;
  readonly version: string;
}

/** Conditional operations that succeed only while the object is at the version the caller last saw. */
export interface VersionedObjects {
  /** The current version, or undefined when there is no object. */
  get(key: string): Promise<Versioned | undefined>;
  /** Creates the object if absent; its version, or undefined when an object already exists. */
  create(key: string, data: Uint8Array): Promise<string | undefined>;
  /** Replaces version `version`; the new version, or undefined when the object is no longer at `version`. */
  replace(key: string, data: Uint8Array, version: string): Promise<string | undefined>;
  /** Deletes version `version`; false when the object is gone or at another version. */
  delete(key: string, version: string): Promise<boolean>;
}

/**
 * Deletes the object as `info` saw it: on a store with versions only that version (GCS: `ifGenerationMatch`), so
 * that a retried delete, or one that comes after someone rewrote the object, never removes a newer version. Google
 * counts a delete idempotent, and safe to retry, only with such a precondition
 * (https://cloud.google.com/storage/docs/retry-strategy). False when the object was rewritten or is gone; a store
 * without versions deletes whatever is there. That is a local directory, where it stays safe: a delete is one
 * unlink, never retried (no lost answers to retry after), and whatever it could still remove of another writer's
 * is trusted by nobody: a step commits only after finalize has found every planned object as recorded under the
 * plan on record, so a removed one is rewritten by a re-run, never committed missing.
 */
export async function deleteSeen(store: Store, info: ObjectInfo): Promise<boolean> {
  if (store.versioned !== undefined && info.version !== undefined) return store.versioned.delete(info.key, info.version);
  await store.delete(info.key);
  return true;
}

/** The whole object, or undefined when there is none: one request, where a stat then a read would take two. */
export async function readIfPresent(store: Store, key: string): Promise<Uint8Array | undefined> {
  try {
    return await store.read(key);
  } catch (e) {
    if (e instanceof NotFoundError) return undefined;
    throw e;
  }
}

/** `store.url` joined with `key`, for error messages. */
export function describe(store: Store, key: string): string {
  if (key === "") return store.url;
  return store.url.endsWith("/") ? store.url + key : `${store.url}/${key}`;
}

/**
 * Refuses keys that could address anything outside the store's root: absolute keys, `.`/`..` segments,
 * empty segments, backslashes and NUL bytes. Every store implementation calls this on every key.
 */
export function checkKey(store: { readonly url: string }, key: string, allowEmpty = false): string {
  if (key === "" && allowEmpty) return key;
  const bad = (why: string): never => {
    throw new UsageError(`refusing key ${JSON.stringify(key)}: ${why}`, { path: store.url });
  };
  if (key === "") bad("empty key");
  if (key.startsWith("/")) bad("absolute key");
  if (key.includes("\\")) bad("backslash in key");
  if (key.includes("\0")) bad("NUL byte in key");
  for (const segment of key.split("/")) {
    if (segment === "") bad("empty path segment");
    if (segment === "." || segment === "..") bad(`"${segment}" path segment`);
  }
  return key;
}

/** Keys under a directory-like prefix: `joinKey("a/b", "c")` = `a/b/c`; either side may be empty. */
export function joinKey(...parts: string[]): string {
  return parts
    .filter((p) => p !== "")
    .map((p) => p.replace(/^\/+|\/+$/g, ""))
    .filter((p) => p !== "")
    .join("/");
}
