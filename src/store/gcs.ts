import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { type Bucket, Storage } from "@google-cloud/storage";
import { crc32c } from "../codecs/crc32c.js";
import { FormatError, NotFoundError } from "../errors.js";
import {
  checkKey,
  type DirListing,
  describe,
  joinKey,
  type ObjectInfo,
  type Store,
  type Versioned,
  type VersionedObjects,
  type WriteResult,
} from "./store.js";

let sharedClient: Storage | undefined;

/**
 * One client per process. ORBAX2REG_GCS_ENDPOINT (e.g. http://127.0.0.1:4443) points it at a GCS emulator
 * such as fake-gcs-server; the client library's own STORAGE_EMULATOR_HOST does not route every call there.
 */
export function storageClient(): Storage {
  const endpoint = process.env.ORBAX2REG_GCS_ENDPOINT;
  sharedClient ??= endpoint
    ? new Storage({ apiEndpoint: endpoint, projectId: process.env.GOOGLE_CLOUD_PROJECT ?? "local" })
    : new Storage();
  return sharedClient;
}

/** Objects under gs://bucket/prefix. */
export class GcsStore implements Store {
  private readonly bucket: Bucket;

  constructor(
    readonly bucketName: string,
    readonly prefix: string,
    readonly url: string = `gs://${bucketName}/${prefix}`,
    client: Storage = storageClient(),
  ) {
    this.bucket = client.bucket(bucketName);
  }

  private name(key: string): string {
    return joinKey(this.prefix, checkKey(this, key));
  }

  async read(key: string): Promise<Uint8Array> {
    try {
      const [data] = await this.bucket.file(this.name(key)).download();
      return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
    } catch (e) {
      throw this.translate(e, key);
    }
  }

  async readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    const name = this.name(key);
    if (length === 0) return new Uint8Array(0);
    let data: Buffer;
    try {
      // The client's `end` is inclusive.
      [data] = await this.bucket.file(name).download({ start: offset, end: offset + length - 1, validation: false });
    } catch (e) {
      const status = (e as { code?: number }).code;
      if (status === 416) {
        throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object is shorter`, {
          path: describe(this, key),
          offset,
        });
      }
      throw this.translate(e, key);
    }
    if (data.length !== length) {
      throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, got ${data.length}`, {
        path: describe(this, key),
        offset,
      });
    }
    return new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
  }

  async *readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array> {
    const name = this.name(key);
    if (length === 0) return;
    let done = 0;
    try {
      const stream = this.bucket.file(name).createReadStream({ start: offset, end: offset + length - 1, validation: false });
      for await (const piece of stream) {
        done += (piece as Buffer).length;
        yield new Uint8Array((piece as Buffer).buffer, (piece as Buffer).byteOffset, (piece as Buffer).length);
      }
    } catch (e) {
      if ((e as { code?: number }).code === 416) done = -1;
      else throw this.translate(e, key);
    }
    if (done !== length) {
      throw new FormatError(`short read: wanted ${length} bytes at offset ${offset}, the object is shorter`, {
        path: describe(this, key),
        offset,
      });
    }
  }

  async *list(prefix: string): AsyncIterable<ObjectInfo> {
    const full = this.prefix === "" ? prefix : `${this.prefix.replace(/\/+$/, "")}/${prefix}`;
    const strip = this.prefix === "" ? 0 : this.prefix.replace(/\/+$/, "").length + 1;
    let pageToken: string | undefined;
    do {
      const [files, next] = await this.bucket.getFiles({ prefix: full, autoPaginate: false, maxResults: 1000, pageToken });
      for (const f of files) yield { key: f.name.slice(strip), size: Number(f.metadata.size ?? 0), ...storedCrc(f.metadata.crc32c) };
      pageToken = (next as { pageToken?: string } | null)?.pageToken;
    } while (pageToken);
  }

  async listDir(dir: string): Promise<DirListing> {
    const base = dir === "" ? this.prefix.replace(/\/+$/, "") : this.name(dir);
    const full = base === "" ? "" : `${base}/`;
    const strip = this.prefix === "" ? 0 : this.prefix.replace(/\/+$/, "").length + 1;
    const files: ObjectInfo[] = [];
    const dirs: string[] = [];
    let pageToken: string | undefined;
    do {
      const [page, next, response] = await this.bucket.getFiles({
        prefix: full,
        delimiter: "/",
        autoPaginate: false,
        maxResults: 1000,
        pageToken,
      });
      for (const f of page) files.push({ key: f.name.slice(strip), size: Number(f.metadata.size ?? 0), ...storedCrc(f.metadata.crc32c) });
      for (const p of (response as { prefixes?: string[] } | undefined)?.prefixes ?? []) dirs.push(p.slice(full.length).replace(/\/$/, ""));
      pageToken = (next as { pageToken?: string } | null)?.pageToken;
    } while (pageToken);
    return { files, dirs: dirs.sort() };
  }

  async write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>): Promise<WriteResult> {
    const file = this.bucket.file(this.name(key));
    if (data instanceof Uint8Array) {
      await file.save(Buffer.from(data.buffer, data.byteOffset, data.byteLength), { resumable: false, validation: false });
      return { size: data.length, crc32c: crc32c(data) };
    }
    // One upload request; GCS makes the object visible only when it completes.
    const sum = { size: 0, crc32c: 0 };
    const summed = (async function* () {
      for await (const piece of data) {
        sum.size += piece.length;
        sum.crc32c = crc32c(piece, sum.crc32c);
        yield piece;
      }
    })();
    await pipeline(Readable.from(summed, { objectMode: false }), file.createWriteStream({ resumable: false, validation: false }));
    return sum;
  }

  async createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    try {
      // Generation 0 means "no live object": GCS refuses the upload (412) if the name exists.
      await this.bucket.file(this.name(key)).save(Buffer.from(data.buffer, data.byteOffset, data.byteLength), {
        resumable: false,
        validation: false,
        preconditionOpts: { ifGenerationMatch: 0 },
      });
      return true;
    } catch (e) {
      if ((e as { code?: number }).code === 412) return false;
      throw e;
    }
  }

  /**
   * Compare-and-swap through object generations: every write carries ifGenerationMatch (0 = "no live
   * object"), and GCS answers 412 when the object moved on
   * (https://cloud.google.com/storage/docs/request-preconditions). Generations are microsecond timestamps
   * (~1.8e15), exact as JavaScript numbers until 2^53 (in about two centuries); the client wants numbers.
   */
  readonly versioned: VersionedObjects = {
    get: async (key: string): Promise<Versioned | undefined> => {
      const file = this.bucket.file(this.name(key));
      try {
        const [meta] = await file.getMetadata();
        const version = String(meta.generation);
        // Read exactly the generation whose metadata we saw, so data and version always agree.
        const [data] = await this.bucket.file(this.name(key), { generation: version }).download();
        return { data: new Uint8Array(data.buffer, data.byteOffset, data.byteLength), version };
      } catch (e) {
        if ((e as { code?: number }).code === 404) return undefined;
        throw e;
      }
    },
    create: (key: string, data: Uint8Array) => this.saveIf(key, data, 0),
    replace: (key: string, data: Uint8Array, version: string) => this.saveIf(key, data, Number(version)),
    delete: async (key: string, version: string): Promise<boolean> => {
      try {
        await this.bucket.file(this.name(key)).delete({ ifGenerationMatch: Number(version) });
        return true;
      } catch (e) {
        const code = (e as { code?: number }).code;
        if (code === 412 || code === 404) return false;
        throw e;
      }
    },
  };

  private async saveIf(key: string, data: Uint8Array, generation: number): Promise<string | undefined> {
    const file = this.bucket.file(this.name(key));
    try {
      await file.save(Buffer.from(data.buffer, data.byteOffset, data.byteLength), {
        resumable: false,
        validation: false,
        preconditionOpts: { ifGenerationMatch: generation },
      });
    } catch (e) {
      if ((e as { code?: number }).code === 412) return undefined;
      throw e;
    }
    return String(file.metadata.generation);
  }

  async delete(key: string): Promise<void> {
    try {
      await this.bucket.file(this.name(key)).delete();
    } catch (e) {
      if ((e as { code?: number }).code !== 404) throw e;
    }
  }

  async stat(key: string): Promise<ObjectInfo | undefined> {
    try {
      const [meta] = await this.bucket.file(this.name(key)).getMetadata();
      return { key, size: Number(meta.size ?? 0), ...storedCrc(meta.crc32c) };
    } catch (e) {
      if ((e as { code?: number }).code === 404) return undefined;
      throw e;
    }
  }

  private translate(e: unknown, key: string): unknown {
    if ((e as { code?: number }).code === 404) return new NotFoundError("no such object", { path: describe(this, key) });
    return e;
  }
}

/** GCS's crc32c metadata: base64 of the big-endian CRC-32C (https://cloud.google.com/storage/docs/json_api/v1/objects). */
function storedCrc(base64: string | undefined): { crc32c?: number } {
  if (!base64) return {};
  const b = Buffer.from(base64, "base64");
  return b.length === 4 ? { crc32c: b.readUInt32BE(0) } : {};
}
