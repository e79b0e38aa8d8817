import { close as closeFd, constants, type Dirent, fstat as fstatFd, open as openFd, read as readFd, type Stats } from "node:fs";
import { type FileHandle, link, mkdir, open, readdir, rename, rm, rmdir, stat, unlink } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { crc32c } from "../codecs/crc32c.js";
import { DestinationError, FormatError, ioCause, NotFoundError, Orbax2RegError, StorageIoError } from "../errors.js";
import { Budget, forEachLimited } from "../util/budget.js";
import { replayable } from "./replay.js";
import {
  checkKey,
  type DirListing,
  describe,
  type ObjectInfo,
  type RangeCopy,
  type Store,
  type WriteOptions,
  type WriteResult,
} from "./store.js";

const READ_PIECE = 1 << 30;
/** Ranges up to this long are read without a stat first (readSmall): the buffer is bounded by this, not by the file. */
const SMALL_READ = 4 << 20;
/** The pieces of a readStream: each is read through a descriptor of its own, held only while it is read. */
const STREAM_PIECE = 1 << 20;
/** stat calls a listing keeps in flight (each waits for a thread of libuv's pool, not for a descriptor). */
const STATS_AT_ONCE = 32;

/**
 * Descriptors this process's local stores hold at once, whatever the number of objects or the callers'
 * concurrency (a machine may allow a process only 1,024; each written file's flush holds one until the disk
 * has its bytes, and a slow disk once had thousands pending). Three pools, so that nothing waits for a
 * descriptor from a pool whose holders may wait for it: a flush waits only for the disk; a read holds its
 * descriptor for one call (a stream, for one piece) and waits for nothing else; a write holds its own while its
 * bytes arrive, and those may come from a read. A write waits for its flush's turn before it resolves, so
 * flushes a slow disk has not caught up with hold back the writer instead of piling up.
 */
const FLUSHES = new Budget(128);
const READS = new Budget(128);
const WRITES = new Budget(128);

async function holding<T>(pool: Budget, weight: number, fn: () => Promise<T>): Promise<T> {
  const release = await pool.acquire(weight);
  try {
    return await fn();
  } finally {
    release();
  }
}

/**
 * Temporary names of writes in flight: `<key>.tmp-<writer's pid, 8 hex><sequence, 4 hex>`. The pid lets a
 * cleanup tell a killed writer's leftovers from a live writer's file (which it must never delete); the
 * sequence keeps two writes of one key by one process apart.
 */
export const TEMPORARY = /\.tmp-([0-9a-f]{8})[0-9a-f]{4}$/;
let sequence = 0;

function temporaryName(path: string): string {
  sequence = (sequence + 1) & 0xffff;
  return `${path}.tmp-${process.pid.toString(16).padStart(8, "0")}${sequence.toString(16).padStart(4, "0")}`;
}

/** Whether the process that named a temporary file may still be writing it (on this machine). */
function writerAlive(tmpName: string): boolean {
  const pid = Number.parseInt(TEMPORARY.exec(tmpName)?.[1] ?? "0", 16);
  if (pid <= 0) return false;
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0); // signal 0: only asks whether the process exists
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === "EPERM"; // exists, owned by someone else
  }
}

/** A failure of the bytes being written (the source), kept apart from failures to write them. */
class SourceFailure {
  constructor(readonly cause: unknown) {}
}

async function* tagSourceErrors(data: AsyncIterable<Uint8Array>): AsyncIterable<Uint8Array> {
  try {
    yield* data;
  } catch (e) {
    throw new SourceFailure(e);
  }
}

/** fdatasync (a file's bytes) or fsync (a directory's names) through a descriptor of its own (the caller holds a FLUSHES slot). */
async function syncFile(path: string, data: boolean): Promise<void> {
  const h = await open(path, "r");
  try {
    await (data ? h.datasync() : h.sync());
  } finally {
    await h.close();
  }
}

/** Fills `out` from `position` of the file, stopping early at its end: the bytes read. */
async function readInto(handle: FileHandle, out: Uint8Array, position: number): Promise<number> {
  let done = 0;
  while (done < out.length) {
    // fs reads take an int32 length; read large ranges in pieces.
    const { bytesRead } = await handle.read(out, done, Math.min(out.length - done, READ_PIECE), position + done);
    if (bytesRead === 0) break;
    done += bytesRead;
  }
  return done;
}

/**
 * A descriptor's calls for readSmall: callbacks on a plain descriptor, not a FileHandle's promises (the handle, its
 * close promise and the request objects of each call were a third of what a read of a small chunk allocated).
 */
const fd = {
  open: (path: string) => new Promise<number>((res, rej) => openFd(path, READ_FLAGS, (e, f) => (e ? rej(e) : res(f)))),
  read: (f: number, out: Uint8Array, at: number, length: number, position: number) =>
    new Promise<number>((res, rej) => readFd(f, out, at, length, position, (e, n) => (e ? rej(e) : res(n)))),
  stat: (f: number) => new Promise<Stats>((res, rej) => fstatFd(f, (e, st) => (e ? rej(e) : res(st)))),
  close: (f: number) => new Promise<void>((res) => closeFd(f, () => res())),
};

async function writeAll(out: FileHandle, bytes: Uint8Array): Promise<void> {
  for (let done = 0; done < bytes.length; ) done += (await out.write(bytes, done, bytes.length - done)).bytesWritten;
}

/**
 * The bytes [`offset`, `offset + length`) of the file at `path` are not all there: it ends at `end` (its size,
 * or where a read found no more). The file is truncated or the reference to it is wrong: retrying cannot help.
 */
/**
 * Opened without waiting for a writer: a named pipe where an object belongs would otherwise block the open (and
 * the command) until something writes to it. A regular file opens as it always does.
 */
const READ_FLAGS = constants.O_RDONLY | constants.O_NONBLOCK;

/** What a path that is not a regular file (nor a directory) is, in words, for a refusal. */
function specialFile(st: Stats): string | undefined {
  if (st.isFile() || st.isDirectory()) return undefined;
  if (st.isFIFO()) return "a named pipe (FIFO)";
  if (st.isSocket()) return "a socket";
  if (st.isCharacterDevice() || st.isBlockDevice()) return "a device";
  return "a special file";
}

/** The refusal of a special file where an object belongs: reading it could block forever or never end. */
function notRegular(path: string, what: string): FormatError {
  return new FormatError(`is ${what}, not a regular file`, { path });
}

function shortRead(path: string, offset: number, length: number, end: number): FormatError {
  return new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object ends at ${end}`, { path, offset });
}

/** A path whose symbolic links lead back to themselves: nothing can be read there. */
function symlinkLoop(path: string): FormatError {
  return new FormatError("a symbolic link loop (too many levels of symbolic links): it never reaches a file or a directory", { path });
}

/** A directory on the local filesystem. */
export class LocalStore implements Store {
  readonly root: string;
  /** A directory renamed into place appears whole (see Store.renamesAtomically). */
  readonly renamesAtomically = true;
  /** fdatasyncs started after a write's rename (see replaceAtomically); makeDurable waits for them. */
  private readonly flushing = new Set<Promise<void>>();
  /** The first of those that failed: makeDurable reports it, so nothing is committed over it. */
  private flushFailure: unknown;

  /**
   * `sync` flushes one file (`data`: its bytes) or directory to the disk; tests pass one that fails, to see
   * a failed flush reported whatever the timing.
   */
  constructor(
    root: string,
    readonly url: string = root,
    private readonly sync: (path: string, data: boolean) => Promise<void> = syncFile,
  ) {
    this.root = resolve(root);
  }

  private file(key: string): string {
    // A checked key has no empty, "." or ".." segment and no backslash: joined as it is, it is what path.join
    // would make of it, without a normalization per call (a finely cut source reads thousands of chunks).
    checkKey(this, key);
    return this.root === "/" ? `/${key}` : `${this.root}/${key}`;
  }

  async read(key: string): Promise<Uint8Array> {
    return this.withFile(key, async (handle, info) => {
      if (info.isDirectory()) throw new NotFoundError("no such file", { path: describe(this, key) });
      return new Uint8Array(await handle.readFile());
    });
  }

  async readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    if (length === 0) return new Uint8Array(0);
    if (length <= SMALL_READ) return this.readSmall(key, offset, length);
    return this.readPiece(key, offset, length, offset, length);
  }

  async readRangeInto(key: string, offset: number, length: number, into: Uint8Array): Promise<Uint8Array> {
    if (into.length < length) throw new RangeError(`readRangeInto: a buffer of ${into.length} bytes for ${length}`);
    if (length === 0) return into.subarray(0, 0);
    if (length <= SMALL_READ) return this.readSmall(key, offset, length, into);
    return this.readPiece(key, offset, length, offset, length, into.subarray(0, length));
  }

  /**
   * A range of at most SMALL_READ bytes (a finely cut source's whole chunks: thousands of them, each read once):
   * opened, read and closed, with the stat readPiece makes first (which refuses what is not a regular file) made
   * at the same time as the read instead of before it: one thread-pool round trip fewer in line before each of a
   * finely cut source's chunks, and a named pipe or a device (/dev/zero reads "successfully") is still refused.
   * A file shorter than the range is a short read. Read into `into` (its first `length` bytes) when given.
   */
  private async readSmall(key: string, offset: number, length: number, into?: Uint8Array): Promise<Uint8Array> {
    const path = this.file(key);
    const release = await READS.acquire();
    let f: number;
    try {
      f = await fd.open(path);
    } catch (e) {
      release();
      throw this.translate(e, key);
    }
    // The bytes go to the caller as soon as they are read; the descriptor (and its READS slot) once it is closed.
    const stat = fd.stat(f);
    stat.catch(() => {}); // awaited below; a read that throws first must not leave it unhandled
    try {
      const out = into === undefined ? new Uint8Array(length) : into.subarray(0, length);
      let done = 0;
      let failed: unknown;
      try {
        while (done < length) {
          const n = await fd.read(f, out, done, length - done, offset + done);
          if (n === 0) break;
          done += n;
        }
      } catch (e) {
        failed = e; // a named pipe fails a positioned read (ESPIPE): said as what it is below
      }
      const info = await stat;
      const special = specialFile(info);
      if (special !== undefined) throw notRegular(describe(this, key), special);
      if (failed !== undefined) throw failed;
      if (done === length) return out;
      throw shortRead(describe(this, key), offset, length, info.size < offset + length ? info.size : offset + done);
    } catch (e) {
      throw this.translate(e, key);
    } finally {
      void fd.close(f).then(release); // read-only: nothing read depends on its close
    }
  }

  async readHead(key: string, max: number): Promise<{ bytes: Uint8Array; size: number } | undefined> {
    try {
      return await this.withFile(key, async (handle, info) => {
        if (!info.isFile()) return undefined; // a directory is no object (as stat says)
        const out = new Uint8Array(Math.min(info.size, max));
        // Truncated meanwhile: what is there.
        return { bytes: out.subarray(0, await readInto(handle, out, 0)), size: info.size };
      });
    } catch (e) {
      if (e instanceof NotFoundError) return undefined;
      throw e;
    }
  }

  /**
   * `length` bytes at `offset`, a piece of the range [`whole`, `whole + wholeLength`) the caller wants (checked
   * against the object's size first: a corrupted length must not become a huge buffer, and a stream fails
   * before its first piece), through a descriptor held only meanwhile, into a buffer of its own (or `into`, exactly
   * `length` long: readRangeInto's).
   */
  private readPiece(
    key: string,
    offset: number,
    length: number,
    whole: number,
    wholeLength: number,
    into?: Uint8Array,
  ): Promise<Uint8Array> {
    return this.withFile(key, async (handle, info) => {
      if (whole + wholeLength > info.size) {
        throw shortRead(describe(this, key), whole, wholeLength, info.size);
      }
      const out = into ?? new Uint8Array(length);
      const done = await readInto(handle, out, offset);
      if (done < length) throw shortRead(describe(this, key), whole, wholeLength, offset + done);
      return out;
    });
  }

  /**
   * `work` on the object's file (or directory), opened for reading and stat'ed, under a READS slot; its errors
   * as the store's. Anything else there (a named pipe, a device) is refused before a byte is read.
   */
  private withFile<T>(key: string, work: (handle: FileHandle, info: Stats) => Promise<T>): Promise<T> {
    const path = this.file(key);
    return holding(READS, 1, async () => {
      let handle: FileHandle;
      try {
        handle = await open(path, READ_FLAGS);
      } catch (e) {
        throw this.translate(e, key);
      }
      try {
        const info = await handle.stat();
        const special = specialFile(info);
        if (special !== undefined) throw notRegular(describe(this, key), special);
        return await work(handle, info);
      } catch (e) {
        throw this.translate(e, key);
      } finally {
        await handle.close();
      }
    });
  }

  /** Piece by piece, each through a descriptor of its own: a slow consumer holds none (see READS). */
  /** Readable again from any offset (see replay.ts): a GCS upload of it streams, holding no chunk in memory. */
  readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array> {
    return replayable(() => this.streamPieces(key, offset, length), {
      length,
      from: (skip) => this.streamPieces(key, offset + skip, length - skip),
    });
  }

  /** Each piece in a buffer of its own (Store.readStream): an upload's socket may still hold one when the next is read. */
  private async *streamPieces(key: string, offset: number, length: number): AsyncGenerator<Uint8Array> {
    for (let done = 0; done < length; ) {
      const piece = await this.readPiece(key, offset + done, Math.min(STREAM_PIECE, length - done), offset, length);
      done += piece.length;
      yield piece;
    }
  }

  async *list(prefix: string): AsyncIterable<ObjectInfo> {
    // Walk only the deepest directory the prefix names, then filter by the full prefix. Temporary files
    // of writes in flight are not objects: a listing never shows them.
    for await (const info of this.walkPrefix(prefix)) {
      if (info.key.startsWith(prefix) && !TEMPORARY.test(info.key)) yield info;
    }
  }

  private walkPrefix(prefix: string): AsyncIterable<ObjectInfo> {
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash >= 0 ? prefix.slice(0, slash) : "";
    return this.walkSorted(dirKey === "" ? this.root : this.file(dirKey), dirKey);
  }

  /**
   * The files below `dir` (keys under `dirKey`) in key order, as they are found: memory holds the directories
   * on the way down, not every file (a step may hold millions). A directory sorts as its name and "/", which
   * is where its keys fall among its siblings'. Each directory walked joins `dirs`. Symbolic links are followed,
   * but one that leads back to a directory on the way down (`python/python_0/loop -> .`) is refused: followed, it
   * would list the same files under ever longer keys, 40 levels deep, and a conversion would copy each level.
   * `above` holds the directories on the way down (device and inode).
   */
  private async *walkSorted(dir: string, dirKey: string, dirs?: string[], above?: ReadonlySet<string>): AsyncIterable<ObjectInfo> {
    let names: string[];
    let path = above;
    try {
      names = await holding(READS, 1, () => readdir(dir));
      if (path === undefined) {
        const st = await stat(dir);
        path = new Set([`${st.dev}:${st.ino}`]);
      }
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return;
      throw this.translate(e, dirKey);
    }
    dirs?.push(dir);
    const stats: (Stats | undefined)[] = new Array(names.length);
    await forEachLimited(names, STATS_AT_ONCE, async (name, i) => {
      stats[i] = await stat(join(dir, name)).catch(() => undefined);
    });
    const entries: { name: string; sortKey: string; st: Stats }[] = [];
    for (const [i, name] of names.entries()) {
      const st = stats[i];
      if (st !== undefined && (st.isDirectory() || st.isFile())) entries.push({ name, sortKey: st.isDirectory() ? `${name}/` : name, st });
    }
    names = [];
    entries.sort((a, b) => (a.sortKey < b.sortKey ? -1 : a.sortKey > b.sortKey ? 1 : 0));
    for (const { name, st } of entries) {
      const key = dirKey === "" ? name : `${dirKey}/${name}`;
      if (st.isDirectory()) {
        const id = `${st.dev}:${st.ino}`;
        if (path.has(id)) {
          throw new FormatError("a symbolic link cycle: this directory leads back to a directory above it", { path: describe(this, key) });
        }
        yield* this.walkSorted(join(dir, name), key, dirs, new Set([...path, id]));
      } else yield { key, size: st.size };
    }
  }

  /**
   * The entries of the directory at key `dir`, in name order, or why it has none: it does not exist (ENOENT), or it
   * or a directory above it is a file (ENOTDIR). Any other error as translate() makes it.
   */
  private async dirEntries(dir: string): Promise<{ path: string; entries: Dirent[] } | { path: string; missing: "ENOENT" | "ENOTDIR" }> {
    const path = dir === "" ? this.root : this.file(dir);
    try {
      const entries = await holding(READS, 1, () => readdir(path, { withFileTypes: true }));
      return { path, entries: entries.sort((a, b) => (a.name < b.name ? -1 : 1)) };
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return { path, missing: code };
      throw this.translate(e, dir);
    }
  }

  async listDir(dir: string): Promise<DirListing> {
    const listed = await this.dirEntries(dir);
    const { path } = listed;
    if ("missing" in listed) {
      if (listed.missing === "ENOENT") return { files: [], dirs: [], absent: true };
      // Below a file, or the file itself: only the latter is a key.
      return { files: [], dirs: [], ...((await stat(path).catch(() => undefined))?.isFile() ? { file: true } : {}) };
    }
    const files: ObjectInfo[] = [];
    const dirs: string[] = [];
    for (const e of listed.entries) {
      const key = dir === "" ? e.name : `${dir}/${e.name}`;
      if (e.isDirectory()) dirs.push(e.name);
      else if (e.isFile() && !TEMPORARY.test(e.name)) files.push({ key, size: (await stat(join(path, e.name))).size });
    }
    return { files, dirs };
  }

  /** The CRC-32C is computed for the result only (nothing stores it), so not when the caller wants none. */
  async write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>, options?: WriteOptions): Promise<WriteResult> {
    const checksum = options?.checksum !== false;
    return this.replaceAtomically(
      key,
      async (out) => {
        if (data instanceof Uint8Array) {
          await writeAll(out, data);
          return checksum ? { size: data.length, crc32c: crc32c(data) } : { size: data.length };
        }
        let size = 0;
        let sum = 0;
        for await (const piece of tagSourceErrors(data)) {
          if (checksum) sum = crc32c(piece, sum);
          size += piece.length;
          await writeAll(out, piece);
        }
        return checksum ? { size, crc32c: sum } : { size };
      },
      false,
      options?.scratch === true,
    );
  }

  /**
   * Writes through `fill` into a temporary file and renames it over `key`, so no reader ever sees a partial
   * object under its final name. The file's fdatasync starts right after the rename and runs on while the
   * caller writes the next objects: the disk catches up in the background instead of holding every writer
   * (waiting for each object before its rename made the benchmark conversion 1.1-1.6x slower). makeDurable waits for
   * them before a commit. A crash may therefore leave a name over bytes that never reached the disk; a
   * resumed conversion reads every object it did not write itself back and compares it with its record or
   * source (convert/done.ts), so such an object is written again, never committed. Failures to write are
   * DestinationErrors naming `key`.
   */
  private async replaceAtomically<T>(key: string, fill: (out: FileHandle) => Promise<T>, holdsSlot = false, scratch = false): Promise<T> {
    const path = this.file(key);
    const tmp = temporaryName(path);
    const release = holdsSlot ? () => undefined : await WRITES.acquire();
    let out: FileHandle | undefined;
    let result: T;
    try {
      await mkdir(dirname(path), { recursive: true });
      out = await open(tmp, "w");
      result = await fill(out);
      await out.close();
      out = undefined;
      await rename(tmp, path);
    } catch (e) {
      await out?.close().catch(() => undefined);
      await rm(tmp, { force: true }).catch(() => undefined);
      throw e instanceof SourceFailure ? e.cause : this.destinationError(e, key);
    } finally {
      release();
    }
    if (!scratch) await this.flushSoon(path, key);
    return result;
  }

  async createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    const path = this.file(key);
    // Write the content under a temporary name, then hard-link it into place: link() fails if the name
    // exists, so the object appears whole and only once.
    const tmp = temporaryName(path);
    const release = await WRITES.acquire();
    try {
      await mkdir(dirname(path), { recursive: true });
      const out = await open(tmp, "w");
      try {
        await writeAll(out, data);
        await out.sync();
      } finally {
        await out.close();
      }
      await link(tmp, path);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST" && (await this.stat(key)) !== undefined) return false;
      throw this.destinationError(e, key);
    } finally {
      await rm(tmp, { force: true }).catch(() => undefined);
      release();
    }
  }

  /** Between local directories only: copyRangeTo. */
  rangeCopyTo(target: Store): RangeCopy | undefined {
    if (!(target instanceof LocalStore)) return undefined;
    return (key, offset, length, targetKey, buffer) => this.copyRangeTo(key, offset, length, target, targetKey, buffer);
  }

  /**
   * Copies `length` bytes at `offset` of `key` into `target`'s `targetKey` through `buffer` (reused by the
   * caller across copies). Between local directories this avoids a fresh buffer per piece, whose
   * allocation and page faults cost more than the copy itself. Atomic and durable like `write`, but no
   * CRC-32C is computed: the copy is verbatim, so its source is what to compare it with later.
   */
  async copyRangeTo(
    key: string,
    offset: number,
    length: number,
    target: LocalStore,
    targetKey: string,
    buffer: Uint8Array,
  ): Promise<{ size: number }> {
    // Two descriptors: the write's first, then the read's (the pools' order; see READS).
    const releaseWrite = await WRITES.acquire();
    let releaseRead: () => void = () => undefined;
    let input: FileHandle | undefined;
    try {
      releaseRead = await READS.acquire();
      try {
        input = await open(this.file(key), READ_FLAGS);
      } catch (e) {
        throw this.translate(e, key);
      }
      const info = await input.stat();
      const special = specialFile(info);
      if (special !== undefined) throw notRegular(describe(this, key), special);
      const size = info.size;
      if (offset + length > size) throw shortRead(describe(this, key), offset, length, size);
      const from = input;
      await target.replaceAtomically(
        targetKey,
        async (out) => {
          for (let done = 0; done < length; ) {
            const { bytesRead } = await from
              .read(buffer, 0, Math.min(buffer.length, length - done), offset + done)
              .catch((e) => Promise.reject(new SourceFailure(this.translate(e, key))));
            if (bytesRead === 0) throw new SourceFailure(shortRead(describe(this, key), offset, length, offset + done));
            await writeAll(out, buffer.subarray(0, bytesRead));
            done += bytesRead;
          }
          input = undefined;
          await from.close().catch(() => undefined); // read-only: nothing of the copy depends on it
          releaseRead();
        },
        true,
      );
      return { size: length };
    } finally {
      await input?.close();
      releaseRead();
      releaseWrite();
    }
  }

  async flushed(): Promise<void> {
    await Promise.all([...this.flushing]); // each has caught its own failure into flushFailure
    if (this.flushFailure !== undefined) throw this.flushFailure;
  }

  /**
   * Starts the fdatasync of a file just renamed into place once a FLUSHES slot is free; flushed and
   * makeDurable wait for it (it counts as started from this call on). Resolves once the slot is taken.
   */
  private flushSoon(path: string, key: string): Promise<void> {
    let started: () => void = () => undefined;
    const slot = new Promise<void>((resolve) => {
      started = resolve;
    });
    const flush = (async () => {
      const release = await FLUSHES.acquire();
      started();
      try {
        await this.sync(path, true);
      } finally {
        release();
      }
    })().catch((e) => {
      // fdatasync's own errors (EIO) carry no path: name the object the disk refused.
      const failure = this.destinationError(e, key);
      this.flushFailure ??=
        failure instanceof Orbax2RegError
          ? failure
          : new StorageIoError(`flush to disk failed: ${(e as Error).message ?? String(e)}`, { path: describe(this, key) }, { cause: e });
    });
    this.flushing.add(flush);
    void flush.finally(() => this.flushing.delete(flush));
    return slot;
  }

  /**
   * Makes every object under `prefix` and every name there durable: waits for this process's flushes, then
   * fdatasyncs every file (another process, perhaps killed, may have written some without waiting for the
   * disk) and fsyncs every directory under `prefix` and the one holding it (a renamed file's name lives in
   * its directory, not in the file). `prefix` may name one object: then that object and its directory.
   */
  async makeDurable(prefix: string): Promise<void> {
    await this.flushed();
    const key = prefix.replace(/\/+$/, "");
    const top = key === "" ? this.root : this.file(key);
    const dirs = [dirname(top)];
    // Synced as the walk finds them by a fixed pool of workers sharing the walk: a step may hold millions of
    // files (a directory joins `dirs`; an object's key lists nothing).
    const walk = this.walkSorted(top, key, dirs)[Symbol.asyncIterator]();
    const worker = async () => {
      for (let r = await walk.next(); r.done !== true; r = await walk.next()) {
        const k = r.value.key;
        await holding(FLUSHES, 1, () => this.sync(this.file(k), true));
      }
    };
    await Promise.all(Array.from({ length: FLUSHES.capacity }, worker));
    if (dirs.length === 1 && (await stat(top).catch(() => undefined))?.isFile()) await holding(FLUSHES, 1, () => this.sync(top, true));
    await forEachLimited(dirs, FLUSHES.capacity, (d) => holding(FLUSHES, 1, () => this.sync(d, false)));
  }

  async removeAbandoned(prefix: string): Promise<number> {
    let removed = 0;
    for await (const info of this.walkPrefix(prefix)) {
      if (!info.key.startsWith(prefix) || !TEMPORARY.test(info.key) || writerAlive(info.key)) continue;
      await rm(join(this.root, ...info.key.split("/")), { force: true });
      removed++;
    }
    return removed;
  }

  async abandonedIn(dir: string): Promise<string[]> {
    const listed = await this.dirEntries(dir);
    if ("missing" in listed) return [];
    return listed.entries
      .filter((e) => e.isFile() && TEMPORARY.test(e.name) && !writerAlive(e.name))
      .map((e) => (dir === "" ? e.name : `${dir}/${e.name}`));
  }

  async removeEmptyDirectories(prefix: string): Promise<void> {
    const dirKey = prefix.replace(/\/+$/, "");
    if (dirKey === "") return; // never the root itself
    const dirs: string[] = [];
    try {
      for await (const _ of this.walkSorted(this.file(dirKey), dirKey, dirs)); // only the directories are wanted
    } catch (e) {
      throw this.translate(e, dirKey);
    }
    // Deepest first, so a directory whose subdirectories were all empty is empty by its turn. rmdir refuses
    // a directory that holds anything, so a file written meanwhile is never lost.
    for (const d of dirs.sort((a, b) => b.length - a.length)) {
      await rmdir(d).catch((e) => {
        const code = (e as NodeJS.ErrnoException).code;
        if (code !== "ENOTEMPTY" && code !== "EEXIST" && code !== "ENOENT") throw this.destinationError(e, dirKey);
      });
    }
  }

  async delete(key: string): Promise<void> {
    await unlink(this.file(key)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw this.destinationError(e, key);
    });
  }

  async stat(key: string): Promise<ObjectInfo | undefined> {
    let st: Stats;
    try {
      st = await stat(this.file(key));
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return undefined;
      throw this.translate(e, key);
    }
    // A directory is no object; a named pipe or a device where one belongs is refused, never read.
    const special = specialFile(st);
    if (special !== undefined) throw notRegular(describe(this, key), special);
    return st.isFile() ? { key, size: st.size } : undefined;
  }

  private translate(e: unknown, key: string): unknown {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR" || code === "EISDIR") {
      return new NotFoundError("no such file", { path: describe(this, key) });
    }
    if (code === "ELOOP") return symlinkLoop(describe(this, key));
    return e;
  }

  /** An OS error the user fixes at the destination (ENOTDIR, EACCES, ENOSPC...) as one line naming `key`. */
  private destinationError(e: unknown, key: string): unknown {
    const cause = ioCause(e);
    if (e instanceof Orbax2RegError || cause === undefined) return e;
    return new DestinationError(cause, { path: describe(this, key) }, { cause: e });
  }
}
