import { crc32c } from "../codecs/crc32c.js";
import { FormatError } from "../errors.js";
import { memoryChunks, RangeReader, streamChunks } from "./chunks.js";
import { credentialsOf, type GcsClient, storageClient } from "./gcs/auth.js";
import { type GcsRequest, hashHeader, JsonApi, type ObjectResource, storedCrc } from "./gcs/json-api.js";
import { Uploads } from "./gcs/uploads.js";
import { type Answer, defaultTimeouts, Http, type Timeouts } from "./http.js";
import { rangedOf, replayable, replayOf } from "./replay.js";
import { defaultRetryPolicy, type RetryPolicy, TransientError } from "./retry.js";
import {
  checkKey,
  type DirListing,
  describe,
  joinKey,
  type ObjectInfo,
  type Store,
  type Versioned,
  type VersionedObjects,
  type WriteOptions,
  type WriteResult,
} from "./store.js";

// The Store over GCS. Its parts are in gcs/: auth.ts (endpoint and credentials), json-api.ts (every request,
// its statuses and its retries), uploads.ts (multipart and resumable uploads).
export { type GcsClient, storageClient };

/**
 * Uploads larger than one chunk are resumable (https://cloud.google.com/storage/docs/resumable-uploads), sent
 * in chunks of this size (a multiple of 256 KiB, as GCS requires of every chunk but the last), each held in
 * memory until GCS confirms it, so that a failure re-sends at most one chunk. A caller with less memory for
 * the write gets smaller chunks (see chunkFor); smaller objects are one multipart request.
 */
export const DEFAULT_CHUNK = 8 << 20;
const CHUNK_UNIT = 256 << 10;
/** ORBAX2REG_GCS_CHUNK_MIB sets the chunk (an emulator that rehashes the whole upload per chunk wants it larger). */
function defaultChunk(): number {
  const v = process.env.ORBAX2REG_GCS_CHUNK_MIB;
  return v !== undefined && /^\d+$/.test(v) && Number(v) > 0 ? Number(v) * 2 ** 20 : DEFAULT_CHUNK;
}
/**
 * A write streamed from another store's ranged download holds none of its bytes (after a failure they are read
 * again from the source), so its chunks need not fit in memory: this size, unless a chunk size is set (option or
 * ORBAX2REG_GCS_CHUNK_MIB). An object up to it is one request, a larger one has a quarter of the round trips,
 * during which its download waits. Google: "Larger chunk sizes typically make uploads faster"
 * (https://cloud.google.com/storage/docs/performing-resumable-uploads).
 */
export const STREAMED_CHUNK = 32 << 20;
/** Besides its chunk, a streamed write holds the source's next piece (a local read's is 1 MiB). */
const PIECE_SLACK = 1 << 20;

export interface GcsOptions {
  /**
   * What the store is to the command: an input it reads (a source, the step `verify` checks), or the destination
   * (the default). A bucket that does not exist is bad input in the first (NotFoundError, exit 2), something to
   * fix at the destination in the second (DestinationError, exit 3).
   */
  readonly role?: "input" | "destination";
  readonly retry?: RetryPolicy;
  readonly timeouts?: Timeouts;
  /** The largest resumable chunk (default DEFAULT_CHUNK), rounded down to a multiple of 256 KiB. */
  readonly chunkBytes?: number;
}

/** The whole object's size as a download's answer gives it: a 206's Content-Range total, a 200's length (NaN if absent). */
function objectSize(answer: Answer): number {
  return answer.status === 206
    ? Number(/\/(\d+)$/.exec(answer.headers.get("content-range") ?? "")?.[1] ?? Number.NaN)
    : Number(answer.headers.get("content-length") ?? Number.NaN);
}

/** Objects under gs://bucket/prefix, through the JSON API (https://cloud.google.com/storage/docs/json_api/v1/objects). */
export class GcsStore implements Store {
  private readonly api: JsonApi;
  private readonly uploads: Uploads;
  private readonly chunk: number;
  /** The chunk of a write streamed from a ranged source (nothing buffered). */
  private readonly streamedChunk: number;
  /** What a streamed write buffers: one chunk and the piece after it. */
  readonly writeBuffer: number;

  constructor(
    readonly bucketName: string,
    readonly prefix: string,
    readonly url: string = `gs://${bucketName}/${prefix}`,
    client: GcsClient = storageClient(),
    options: GcsOptions = {},
  ) {
    const http = new Http(credentialsOf(client), options.timeouts ?? defaultTimeouts());
    this.api = new JsonApi(client.apiEndpoint, bucketName, http, options.retry ?? defaultRetryPolicy(), options.role);
    this.uploads = new Uploads(this.api);
    this.chunk = Math.max(CHUNK_UNIT, Math.floor((options.chunkBytes ?? defaultChunk()) / CHUNK_UNIT) * CHUNK_UNIT);
    this.writeBuffer = this.chunk + PIECE_SLACK;
    const chunkSet = options.chunkBytes !== undefined || process.env.ORBAX2REG_GCS_CHUNK_MIB !== undefined;
    this.streamedChunk = chunkSet ? this.chunk : Math.max(this.chunk, STREAMED_CHUNK);
  }

  /**
   * Whether the bucket has uniform bucket-level access, which IAM Conditions on its objects need
   * (https://cloud.google.com/storage/docs/uniform-bucket-level-access): the bucket resource's
   * iamConfiguration.uniformBucketLevelAccess.enabled; undefined when the answer has no iamConfiguration (Cloud
   * Storage always sends it; an emulator may not).
   */
  async uniformBucketLevelAccess(): Promise<boolean | undefined> {
    const b = await this.api.bucketResource("iamConfiguration", `gs://${this.bucketName}`);
    if (b.iamConfiguration === undefined) return undefined;
    return b.iamConfiguration.uniformBucketLevelAccess?.enabled === true;
  }

  private name(key: string): string {
    return joinKey(this.prefix, checkKey(this, key));
  }

  async read(key: string): Promise<Uint8Array> {
    const name = this.name(key);
    const path = describe(this, key);
    const req: GcsRequest = { method: "GET", to: { object: name }, query: { alt: "media" }, accept: [200], missing: "object", path };
    return this.api.request("download", req, async (a) => {
      const data = await a.bytes();
      // A whole download can be checked against the object's own CRC-32C, which GCS sends along (of the
      // stored bytes: not comparable when they were served decompressed).
      const stored = a.headers.get("content-encoding") ? undefined : hashHeader(a.headers);
      if (stored !== undefined && crc32c(data) !== stored)
        throw new TransientError("downloaded bytes do not match the object's CRC-32C", "checksum");
      return data;
    });
  }

  async readHead(key: string, max: number): Promise<{ bytes: Uint8Array; size: number } | undefined> {
    if (!Number.isSafeInteger(max) || max < 1) throw new RangeError(`readHead takes a positive length, got ${max}`);
    const path = describe(this, key);
    const req: GcsRequest = {
      method: "GET",
      to: { object: this.name(key) },
      query: { alt: "media" },
      // A range past the end is cut to the object's end; an empty object has no first byte to range over (416).
      headers: { range: `bytes=0-${max - 1}` },
      accept: [200, 206, 404, 416],
      path,
    };
    return this.api.request("ranged download", req, async (a) => {
      if (a.status === 404) return void (await a.discard());
      if (a.status === 416) {
        await a.discard();
        return { bytes: new Uint8Array(0), size: 0 };
      }
      const announced = objectSize(a);
      // At most `max` bytes kept, whatever the server sends (a 200 ignored the range: the rest is not read).
      const out = new Uint8Array(Math.min(max, Number.isFinite(announced) ? announced : max));
      let got = 0;
      let ended = true;
      for await (const piece of a.body()) {
        const n = Math.min(piece.length, out.length - got);
        out.set(piece.subarray(0, n), got);
        got += n;
        if (got === out.length && n < piece.length) {
          ended = false;
          break;
        }
      }
      const size = Number.isFinite(announced) ? announced : ended ? got : Number.POSITIVE_INFINITY;
      return { bytes: out.subarray(0, got), size };
    });
  }

  async readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    const name = this.name(key);
    if (length === 0) return new Uint8Array(0);
    const path = describe(this, key);
    return this.api.retrying("ranged download", path, async () => {
      const range = await this.openRange(name, path, offset, length);
      if (range === undefined) throw shortRead(path, offset, length);
      const data = (await range.answer.bytes()).subarray(range.skip, range.skip + length);
      // A body shorter than announced was retried above; a short announced range means a short object.
      if (data.length !== length) throw shortRead(path, offset, length, data.length);
      return data;
    });
  }

  /**
   * readRange's bytes copied into `into` piece by piece as the body arrives (streamRange: a reset resumes from the
   * first byte missing), instead of into a buffer of the range's own size first: an import reading every source
   * tensor allocated one per chunk, 16 MiB each, and copied it once more into its own; V8 counted every one against
   * its next garbage collection.
   */
  async readRangeInto(key: string, offset: number, length: number, into: Uint8Array): Promise<Uint8Array> {
    if (into.length < length) throw new RangeError(`readRangeInto: a buffer of ${into.length} bytes for ${length}`);
    let at = 0;
    for await (const piece of this.streamRange(key, offset, length)) {
      into.set(piece, at);
      at += piece.length;
    }
    return into.subarray(0, length);
  }

  /**
   * A ranged GET: the answer, and how many bytes of its body precede `offset` (0, unless the server ignored
   * the Range header and sent the whole object); undefined when the object ends before `offset + length`.
   */
  private async openRange(
    name: string,
    path: string,
    offset: number,
    length: number,
  ): Promise<{ answer: Answer; skip: number } | undefined> {
    const answer = await this.api.send({
      method: "GET",
      to: { object: name },
      query: { alt: "media" },
      headers: { range: `bytes=${offset}-${offset + length - 1}` }, // inclusive end
      accept: [200, 206, 416],
      missing: "object",
      path,
    });
    if (answer.status === 416) return void (await answer.discard());
    const size = objectSize(answer);
    if (size < offset + length) return void (await answer.discard());
    return { answer, skip: answer.status === 200 ? offset : 0 };
  }

  /**
   * A ranged download as a stream. A connection that fails mid-body is resumed from the first byte not yet
   * delivered, so a reset costs a retry, not the object; and the stream can be replayed (see replay.ts).
   */
  readStream(key: string, offset: number, length: number): AsyncIterable<Uint8Array> {
    return replayable(() => this.streamRange(key, offset, length), {
      length,
      from: (skip) => this.streamRange(key, offset + skip, length - skip),
    });
  }

  private async *streamRange(key: string, offset: number, length: number): AsyncGenerator<Uint8Array> {
    const name = this.name(key);
    if (length === 0) return;
    const path = describe(this, key);
    let done = 0;
    const api = this.api;
    const openRange = (at: number, n: number) => this.openRange(name, path, at, n);
    yield* api.retryingStream("streamed download", path, async function* () {
      const range = await openRange(offset + done, length - done);
      if (range === undefined) throw shortRead(path, offset, length);
      let skip = range.skip;
      for await (const body of range.answer.body()) {
        const piece = body.subarray(Math.min(skip, body.length), Math.min(body.length, skip + length - done));
        skip = Math.max(0, skip - body.length);
        done += piece.length;
        if (piece.length > 0) yield piece;
        if (done === length) break; // the rest of a whole-object answer is not ours
      }
      if (done !== length) throw shortRead(path, offset, length, done);
    });
  }

  async *list(prefix: string): AsyncIterable<ObjectInfo> {
    const root = this.prefix.replace(/\/+$/, "");
    const full = root === "" ? prefix : `${root}/${prefix}`;
    let pageToken: string | undefined;
    do {
      const page = await this.listPage(prefix, { prefix: full, ...(pageToken ? { pageToken } : {}) });
      for (const o of page.items ?? []) yield this.info(o);
      pageToken = page.nextPageToken;
    } while (pageToken);
  }

  async listDir(dir: string): Promise<DirListing> {
    const base = dir === "" ? this.prefix.replace(/\/+$/, "") : this.name(dir);
    const full = base === "" ? "" : `${base}/`;
    const files: ObjectInfo[] = [];
    const dirs: string[] = [];
    let pageToken: string | undefined;
    do {
      const page = await this.listPage(dir, { prefix: full, delimiter: "/", ...(pageToken ? { pageToken } : {}) });
      for (const o of page.items ?? []) files.push(this.info(o));
      for (const p of page.prefixes ?? []) dirs.push(p.slice(full.length).replace(/\/$/, ""));
      pageToken = page.nextPageToken;
    } while (pageToken);
    return { files, dirs: dirs.sort() };
  }

  private listPage(
    what: string,
    query: Record<string, string>,
  ): Promise<{ items?: ObjectResource[]; prefixes?: string[]; nextPageToken?: string }> {
    const req: GcsRequest = {
      method: "GET",
      to: "objects",
      query: { ...query, maxResults: "1000" },
      accept: [200],
      missing: "bucket",
      path: describe(this, what),
    };
    return this.api.request("listing", req, (a) => a.json());
  }

  private info(o: ObjectResource): ObjectInfo {
    const strip = this.prefix === "" ? 0 : this.prefix.replace(/\/+$/, "").length + 1;
    return {
      key: o.name.slice(strip),
      size: Number(o.size ?? 0),
      ...storedCrc(o.crc32c),
      ...(o.generation !== undefined ? { version: String(o.generation) } : {}),
    };
  }

  async write(key: string, data: Uint8Array | AsyncIterable<Uint8Array>, options: WriteOptions = {}): Promise<WriteResult> {
    const name = this.name(key);
    const path = describe(this, key);
    const chunk = this.chunkFor(options.bufferBytes);
    if (data instanceof Uint8Array) {
      if (data.length <= chunk) return this.uploads.put(name, path, data);
      return this.uploads.resumable(name, path, chunk, () => memoryChunks(data));
    }
    // A source readable from any offset (another store's ranged download) is streamed, nothing buffered.
    const ranged = rangedOf(data);
    if (ranged !== undefined) {
      const reader = new RangeReader(ranged, (got) => shortRead(path, 0, ranged.length, got));
      try {
        return ranged.length <= this.streamedChunk
          ? await this.uploads.streamedPut(name, path, reader)
          : await this.uploads.streamedResumable(name, path, this.streamedChunk, reader);
      } finally {
        await reader.close();
      }
    }
    // Read the first chunk into the one buffer the upload uses: all of a small stream (one multipart upload of
    // it), or the start of a larger one, uploaded chunk by chunk as it is read.
    const source = streamChunks([], data[Symbol.asyncIterator](), chunk);
    const first = await source.take(0, chunk).catch(async (e: unknown) => {
      await source.close();
      throw e;
    });
    if (first.last) return this.uploads.put(name, path, first.bytes);
    const replay = replayOf(data);
    let opened = false;
    return this.uploads.resumable(name, path, chunk, () => {
      if (!opened) {
        opened = true;
        return source;
      }
      return replay && streamChunks([], replay()[Symbol.asyncIterator](), chunk);
    });
  }

  /** The chunk for a write that may buffer `bufferBytes`: this store's chunk, or less, never under 256 KiB. */
  private chunkFor(bufferBytes: number | undefined): number {
    if (bufferBytes === undefined) return this.chunk;
    return Math.min(this.chunk, Math.max(CHUNK_UNIT, Math.floor((bufferBytes - PIECE_SLACK) / CHUNK_UNIT) * CHUNK_UNIT));
  }

  async createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    // Generation 0 means "no live object": GCS refuses the upload (412) if the name exists.
    return (await this.uploads.upload(this.name(key), describe(this, key), data, 0)) !== undefined;
  }

  /**
   * Compare-and-swap through object generations: every write carries ifGenerationMatch (0 = "no live
   * object"), and GCS answers 412 when the object moved on
   * (https://cloud.google.com/storage/docs/request-preconditions). Generations are microsecond timestamps
   * (~1.8e15), exact as JavaScript numbers until 2^53 (in about two centuries).
   */
  readonly versioned: VersionedObjects = {
    get: async (key: string): Promise<Versioned | undefined> => {
      const meta = await this.resource(key);
      if (meta === undefined) return undefined;
      const version = String(meta.generation);
      // Read exactly the generation whose metadata we saw, so data and version always agree.
      const req: GcsRequest = {
        method: "GET",
        to: { object: this.name(key) },
        query: { alt: "media", generation: version },
        accept: [200, 404],
        path: describe(this, key),
      };
      return this.api.request("download", req, async (a) => {
        if (a.status === 404) return void (await a.discard());
        return { data: await a.bytes(), version };
      });
    },
    create: async (key: string, data: Uint8Array) => (await this.uploads.upload(this.name(key), describe(this, key), data, 0))?.generation,
    replace: async (key: string, data: Uint8Array, version: string) =>
      (await this.uploads.upload(this.name(key), describe(this, key), data, Number(version)))?.generation,
    delete: (key: string, version: string) => this.api.deleteIf(this.name(key), describe(this, key), version),
  };

  async delete(key: string): Promise<void> {
    const req: GcsRequest = { method: "DELETE", to: { object: this.name(key) }, accept: [200, 204, 404], path: describe(this, key) };
    return this.api.request("delete", req, (a) => a.discard());
  }

  async stat(key: string): Promise<ObjectInfo | undefined> {
    const meta = await this.resource(key);
    return (
      meta && {
        key,
        size: Number(meta.size ?? 0),
        ...storedCrc(meta.crc32c),
        ...(meta.generation !== undefined ? { version: String(meta.generation) } : {}),
      }
    );
  }

  /** The object resource (size, crc32c, generation), or undefined if there is no object. */
  private resource(key: string): Promise<ObjectResource | undefined> {
    return this.api.resource(this.name(key), describe(this, key));
  }
}

function shortRead(path: string, offset: number, length: number, got?: number): FormatError {
  const what = got === undefined ? "the object is shorter" : `got ${got}`;
  return new FormatError(`short read: wanted ${length} bytes at offset ${offset}, ${what}`, { path, offset });
}
