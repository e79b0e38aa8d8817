import { randomBytes } from "node:crypto";
import type { Dirent } from "node:fs";
import { createReadStream, createWriteStream } from "node:fs";
import { link, mkdir, open, readdir, readFile, rename, rm, stat, unlink, writeFile } from "node:fs/promises";
import { dirname, join, resolve } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { crc32c } from "../codecs/crc32c.js";
import { FormatError, NotFoundError } from "../errors.js";
import { checkKey, type DirListing, describe, type ObjectInfo, type Store, type WriteResult } from "./store.js";

const READ_PIECE = 1 << 30;

/** A directory on the local filesystem. */
export class LocalStore implements Store {
  readonly root: string;

  constructor(
    root: string,
    readonly url: string = root,
  ) {
    this.root = resolve(root);
  }

  private file(key: string): string {
    return join(this.root, ...checkKey(this, key).split("/"));
  }

  async read(key: string): Promise<Uint8Array> {
    try {
      return new Uint8Array(await readFile(this.file(key)));
    } catch (e) {
      throw this.translate(e, key);
    }
  }

  async readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    const path = this.file(key);
    if (length === 0) return new Uint8Array(0);
    let handle: Awaited<ReturnType<typeof open>>;
    try {
      handle = await open(path, "r");
    } catch (e) {
      throw this.translate(e, key);
    }
    try {
      // Check the size before allocating: a corrupted length must not become a huge buffer.
      const size = (await handle.stat()).size;
      if (offset + length > size) {
        throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object has ${size}`, {
          path: describe(this, key),
          offset,
        });
      }
      const out = new Uint8Array(length);
      let done = 0;
      while (done < length) {
        // fs reads take an int32 length; read large ranges in pieces.
        const { bytesRead } = await handle.read(out, done, Math.min(length - done, READ_PIECE), offset + done);
        if (bytesRead === 0) {
          throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object ends at ${offset + done}`, {
            path: describe(this, key),
            offset,
          });
        }
        done += bytesRead;
      }
      return out;
    } catch (e) {
      throw this.translate(e, key);
    } finally {
      await handle.close();
    }
  }

  async *readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array> {
    const path = this.file(key);
    if (length === 0) return;
    let done = 0;
    try {
      for await (const piece of createReadStream(path, { start: offset, end: offset + length - 1, highWaterMark: 1 << 20 })) {
        done += (piece as Buffer).length;
        yield new Uint8Array((piece as Buffer).buffer, (piece as Buffer).byteOffset, (piece as Buffer).length);
      }
    } catch (e) {
      throw this.translate(e, key);
    }
    if (done !== length) {
      throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object ends at ${offset + done}`, {
        path: describe(this, key),
        offset,
      });
    }
  }

  async *list(prefix: string): AsyncIterable<ObjectInfo> {
    // Walk only the deepest directory the prefix names, then filter by the full prefix.
    const slash = prefix.lastIndexOf("/");
    const dirKey = slash >= 0 ? prefix.slice(0, slash) : "";
    const start = dirKey === "" ? this.root : this.file(dirKey);
    for (const info of await this.walk(start, dirKey)) {
      if (info.key.startsWith(prefix)) yield info;
    }
  }

  private async walk(dir: string, dirKey: string): Promise<ObjectInfo[]> {
    let names: string[];
    try {
      names = (await readdir(dir)).sort();
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return [];
      throw e;
    }
    const out: ObjectInfo[] = [];
    for (const name of names) {
      const key = dirKey === "" ? name : `${dirKey}/${name}`;
      const st = await stat(join(dir, name)).catch(() => undefined);
      if (st === undefined) continue;
      if (st.isDirectory()) out.push(...(await this.walk(join(dir, name), key)));
      else if (st.isFile()) out.push({ key, size: st.size });
    }
    // Directory order puts "a/b" after "a.b"-like names differently from key order; sort by key bytes.
    return out.sort((a, b) => (a.key < b.key ? -1 : a.key > b.key ? 1 : 0));
  }

  async listDir(dir: string): Promise<DirListing> {
    const path = dir === "" ? this.root : this.file(dir);
    let entries: Dirent[];
    try {
      entries = await readdir(path, { withFileTypes: true });
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return { files: [], dirs: [] };
      throw e;
    }
    const files: ObjectInfo[] = [];
    const dirs: string[] = [];
    for (const e of entries.sort((a, b) => (a.name < b.name ? -1 : 1))) {
      const key = dir === "" ? e.name : `${dir}/${e.name}`;
      if (e.isDirectory()) dirs.push(e.name);
      else if (e.isFile()) files.push({ key, size: (await stat(join(path, e.name))).size });
    }
    return { files, dirs };
  }

  async write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>): Promise<WriteResult> {
    const path = this.file(key);
    await mkdir(dirname(path), { recursive: true });
    // Write then rename, so a reader (or a crash) never sees a partial object under its final name.
    const tmp = `${path}.tmp-${randomBytes(6).toString("hex")}`;
    try {
      let result: WriteResult;
      if (data instanceof Uint8Array) {
        await writeFile(tmp, data);
        result = { size: data.length, crc32c: crc32c(data) };
      } else {
        const sum = { size: 0, crc32c: 0 };
        const summed = (async function* () {
          for await (const piece of data) {
            sum.size += piece.length;
            sum.crc32c = crc32c(piece, sum.crc32c);
            yield piece;
          }
        })();
        await pipeline(Readable.from(summed, { objectMode: false }), createWriteStream(tmp));
        result = sum;
      }
      await rename(tmp, path);
      return result;
    } catch (e) {
      await rm(tmp, { force: true });
      throw e;
    }
  }

  async createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    const path = this.file(key);
    await mkdir(dirname(path), { recursive: true });
    // Write the content under a temporary name, then hard-link it into place: link() fails if the name
    // exists, so the object appears whole and only once.
    const tmp = `${path}.tmp-${randomBytes(6).toString("hex")}`;
    await writeFile(tmp, data);
    try {
      await link(tmp, path);
      return true;
    } catch (e) {
      if ((e as NodeJS.ErrnoException).code === "EEXIST") return false;
      throw e;
    } finally {
      await rm(tmp, { force: true });
    }
  }

  /**
   * Copies `length` bytes at `offset` of `key` into `target`'s `targetKey` through `buffer` (reused by the
   * caller across copies). Between local directories this avoids a fresh buffer per piece, whose
   * allocation and page faults cost more than the copy itself. Atomic like `write`.
   */
  async copyRangeTo(
    key: string,
    offset: number,
    length: number,
    target: LocalStore,
    targetKey: string,
    buffer: Uint8Array,
  ): Promise<WriteResult> {
    const from = this.file(key);
    const to = target.file(targetKey);
    await mkdir(dirname(to), { recursive: true });
    const tmp = `${to}.tmp-${randomBytes(6).toString("hex")}`;
    let input: Awaited<ReturnType<typeof open>> | undefined;
    let output: Awaited<ReturnType<typeof open>> | undefined;
    try {
      input = await open(from, "r");
      if (offset + length > (await input.stat()).size) {
        throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object is shorter`, {
          path: describe(this, key),
          offset,
        });
      }
      output = await open(tmp, "w");
      let sum = 0;
      for (let done = 0; done < length; ) {
        const { bytesRead } = await input.read(buffer, 0, Math.min(buffer.length, length - done), offset + done);
        if (bytesRead === 0) throw new FormatError(`short read at offset ${offset + done}`, { path: describe(this, key), offset });
        sum = crc32c(buffer.subarray(0, bytesRead), sum);
        let written = 0;
        while (written < bytesRead) written += (await output.write(buffer, written, bytesRead - written)).bytesWritten;
        done += bytesRead;
      }
      await output.close();
      output = undefined;
      await rename(tmp, to);
      return { size: length, crc32c: sum };
    } catch (e) {
      await output?.close().catch(() => undefined);
      await rm(tmp, { force: true });
      throw this.translate(e, key);
    } finally {
      await input?.close();
    }
  }

  async delete(key: string): Promise<void> {
    await unlink(this.file(key)).catch((e: NodeJS.ErrnoException) => {
      if (e.code !== "ENOENT") throw e;
    });
  }

  async stat(key: string): Promise<ObjectInfo | undefined> {
    try {
      const st = await stat(this.file(key));
      return st.isFile() ? { key, size: st.size } : undefined;
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === "ENOENT" || code === "ENOTDIR") return undefined;
      throw e;
    }
  }

  private translate(e: unknown, key: string): unknown {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR" || code === "EISDIR") {
      return new NotFoundError("no such file", { path: describe(this, key) });
    }
    return e;
  }
}
