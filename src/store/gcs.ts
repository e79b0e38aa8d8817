import { randomBytes } from "node:crypto";
import { crc32c } from "../codecs/crc32c.js";
import { DestinationError, FormatError, NotFoundError, StorageIoError } from "../errors.js";
import { type ChunkSource, type CrcPoint, memoryChunks, RangeReader, streamChunks } from "./chunks.js";
import { type Answer, defaultTimeouts, Http, type Timeouts } from "./http.js";
import { rangedOf, replayable, replayOf } from "./replay.js";
import { Attempts, defaultRetryPolicy, type RetryPolicy, TransientError } from "./retry.js";
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

/**
 * What GcsStore takes from a client: the endpoint and the credentials (a @google-cloud/storage `Storage` is
 * one, as the tests pass it). Requests go through http.ts, retried by retry.ts, not through a client library.
 */
export interface GcsClient {
  readonly apiEndpoint: string;
  /** An emulator: no credentials are sent (as in the client library, unless told otherwise). */
  readonly customEndpoint: boolean;
  readonly authClient: { getRequestHeaders(): Promise<unknown> };
}

let sharedClient: GcsClient | undefined;

/**
 * One client per process. ORBAX2REG_GCS_ENDPOINT (e.g. http://127.0.0.1:4443) points it at a GCS emulator
 * such as fake-gcs-server (STORAGE_EMULATOR_HOST, the client library's variable, too). Otherwise the JSON
 * API at https://storage.googleapis.com, with Application Default Credentials from google-auth-library,
 * loaded only then: @google-cloud/storage itself, ~30 MiB resident, is not loaded at all.
 */
export function storageClient(): GcsClient {
  const endpoint = process.env.ORBAX2REG_GCS_ENDPOINT || process.env.STORAGE_EMULATOR_HOST;
  sharedClient ??= endpoint
    ? { apiEndpoint: sanitizeEndpoint(endpoint), customEndpoint: true, authClient: { getRequestHeaders: async () => ({}) } }
    : { apiEndpoint: "https://storage.googleapis.com", customEndpoint: false, authClient: lazyAuth() };
  return sharedClient;
}

/** As the client library takes an endpoint: https:// unless it names a scheme, no trailing slash. */
const sanitizeEndpoint = (url: string) => (/^\w+:\/\//.test(url) ? url : `https://${url}`).replace(/\/+$/, "");

/** Application Default Credentials, google-auth-library loaded on the first request that needs them. */
function lazyAuth(): GcsClient["authClient"] {
  let auth: Promise<{ getRequestHeaders(): Promise<unknown> }> | undefined;
  return {
    getRequestHeaders: async () => {
      auth ??= import("google-auth-library").then(
        ({ GoogleAuth }) =>
          new GoogleAuth({
            scopes: ["https://www.googleapis.com/auth/cloud-platform", "https://www.googleapis.com/auth/devstorage.full_control"],
          }),
      );
      return (await auth).getRequestHeaders();
    },
  };
}

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
const START: CrcPoint = { at: 0, crc: 0 };
/** Besides its chunk, a streamed write holds the source's next piece (a local read's is 1 MiB). */
const PIECE_SLACK = 1 << 20;

export interface GcsOptions {
  readonly retry?: RetryPolicy;
  readonly timeouts?: Timeouts;
  /** The largest resumable chunk (default DEFAULT_CHUNK), rounded down to a multiple of 256 KiB. */
  readonly chunkBytes?: number;
}

interface ObjectResource {
  name: string;
  size?: string;
  crc32c?: string;
  generation?: string;
}

/** Objects under gs://bucket/prefix, through the JSON API (https://cloud.google.com/storage/docs/json_api/v1/objects). */
export class GcsStore implements Store {
  private readonly http: Http;
  private readonly objects: string;
  private readonly uploads: string;
  private readonly retry: RetryPolicy;
  private readonly chunk: number;
  /** What a streamed write buffers: one chunk and the piece after it. */
  readonly writeBuffer: number;

  constructor(
    readonly bucketName: string,
    readonly prefix: string,
    readonly url: string = `gs://${bucketName}/${prefix}`,
    client: GcsClient = storageClient(),
    options: GcsOptions = {},
  ) {
    const endpoint = client.apiEndpoint.replace(/\/+$/, "");
    const bucket = encodeURIComponent(bucketName);
    this.objects = `${endpoint}/storage/v1/b/${bucket}/o`;
    this.uploads = `${endpoint}/upload/storage/v1/b/${bucket}/o`;
    this.retry = options.retry ?? defaultRetryPolicy();
    this.chunk = Math.max(CHUNK_UNIT, Math.floor((options.chunkBytes ?? defaultChunk()) / CHUNK_UNIT) * CHUNK_UNIT);
    this.writeBuffer = this.chunk + PIECE_SLACK;
    // An emulator endpoint takes no credentials (as in the library, unless told otherwise).
    const auth = client.customEndpoint ? async () => ({}) : async () => headerRecord(await client.authClient.getRequestHeaders());
    this.http = new Http(auth, options.timeouts ?? defaultTimeouts());
  }

  private name(key: string): string {
    return joinKey(this.prefix, checkKey(this, key));
  }

  private objectUrl(name: string, query: Record<string, string> = {}): string {
    const q = new URLSearchParams(query).toString();
    return `${this.objects}/${encodeURIComponent(name)}${q ? `?${q}` : ""}`;
  }

  private attempts(what: string, key: string): Attempts {
    return new Attempts(what, describe(this, key), this.retry);
  }

  async read(key: string): Promise<Uint8Array> {
    const url = this.objectUrl(this.name(key), { alt: "media" });
    const path = describe(this, key);
    for (const r = this.attempts("download", key); ; ) {
      try {
        const a = await this.http.send("GET", url, { accept: [200, 404], path });
        if (a.status === 404) return await notFound(a, path);
        const data = await a.bytes();
        // A whole download can be checked against the object's own CRC-32C, which GCS sends along (of the
        // stored bytes: not comparable when they were served decompressed).
        const stored = a.headers.get("content-encoding") ? undefined : hashHeader(a.headers);
        if (stored !== undefined && crc32c(data) !== stored)
          throw new TransientError("downloaded bytes do not match the object's CRC-32C", "checksum");
        return data;
      } catch (e) {
        await r.failed(e);
      }
    }
  }

  async readRange(key: string, offset: number, length: number): Promise<Uint8Array> {
    const name = this.name(key);
    if (length === 0) return new Uint8Array(0);
    const path = describe(this, key);
    for (const r = this.attempts("ranged download", key); ; ) {
      try {
        const range = await this.openRange(name, path, offset, length);
        if (range === undefined) throw shortRead(path, offset, length);
        const data = (await range.answer.bytes()).subarray(range.skip, range.skip + length);
        // A body shorter than announced was retried above; a short announced range means a short object.
        if (data.length !== length) throw shortRead(path, offset, length, data.length);
        return data;
      } catch (e) {
        await r.failed(e);
      }
    }
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
    const answer = await this.http.send("GET", this.objectUrl(name, { alt: "media" }), {
      headers: { range: `bytes=${offset}-${offset + length - 1}` }, // inclusive end
      accept: [200, 206, 404, 416],
      path,
    });
    if (answer.status === 404) return notFound(answer, path);
    if (answer.status === 416) return void (await answer.discard());
    const size =
      answer.status === 200
        ? Number(answer.headers.get("content-length") ?? Number.NaN)
        : Number(/\/(\d+)$/.exec(answer.headers.get("content-range") ?? "")?.[1] ?? Number.NaN);
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
    for (const r = this.attempts("streamed download", key); ; ) {
      try {
        const range = await this.openRange(name, path, offset + done, length - done);
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
        return;
      } catch (e) {
        await r.failed(e);
      }
    }
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

  private async listPage(
    what: string,
    query: Record<string, string>,
  ): Promise<{ items?: ObjectResource[]; prefixes?: string[]; nextPageToken?: string }> {
    const q = new URLSearchParams({ ...query, maxResults: "1000" }).toString();
    const path = describe(this, what);
    for (const r = new Attempts("listing", path, this.retry); ; ) {
      try {
        const a = await this.http.send("GET", `${this.objects}?${q}`, { accept: [200, 404], path });
        if (a.status === 404) return await noSuchBucket(a, path);
        return await a.json();
      } catch (e) {
        await r.failed(e);
      }
    }
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
    const chunk = this.chunkFor(options.bufferBytes);
    if (data instanceof Uint8Array) {
      if (data.length <= chunk) return this.put(key, name, data);
      return this.resumable(key, name, chunk, () => memoryChunks(data));
    }
    // A source readable from any offset (another store's ranged download) is streamed, nothing buffered.
    const ranged = rangedOf(data);
    if (ranged !== undefined) {
      const reader = new RangeReader(ranged, (got) => shortRead(describe(this, key), 0, ranged.length, got));
      try {
        return ranged.length <= this.chunk
          ? await this.streamedPut(key, name, reader)
          : await this.streamedResumable(key, name, this.chunk, reader);
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
    if (first.last) return this.put(key, name, first.bytes);
    const replay = replayOf(data);
    let opened = false;
    return this.resumable(key, name, chunk, () => {
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

  /** An unconditional upload (it cannot fail a precondition). */
  private async put(key: string, name: string, data: Uint8Array | Uint8Array[]): Promise<WriteResult> {
    return ((await this.upload(key, name, data)) as { written: WriteResult }).written;
  }

  /**
   * One multipart upload of known bytes, carrying their CRC-32C in the object resource (base64 of the
   * big-endian value): GCS refuses the upload with 400 if the bytes it received do not match
   * (https://cloud.google.com/storage/docs/data-validation). The same bytes can be sent again, so every
   * transient failure is retried. With `ifGenerationMatch`, undefined when the precondition fails. The body
   * is sent as its parts (`data` may be the pieces of a gathered stream), never copied into one buffer.
   */
  private async upload(
    key: string,
    name: string,
    data: Uint8Array | Uint8Array[],
    ifGenerationMatch?: number,
  ): Promise<{ written: WriteResult; generation: string } | undefined> {
    const pieces = data instanceof Uint8Array ? [data] : data;
    const written = { size: 0, crc32c: 0 };
    for (const p of pieces) {
      written.size += p.length;
      written.crc32c = crc32c(p, written.crc32c);
    }
    const path = describe(this, key);
    const boundary = randomBytes(12).toString("hex");
    const parts = [multipartHead(boundary, { name, crc32c: crcBase64(written.crc32c) }), ...pieces, multipartTail(boundary)];
    const length = parts.reduce((n, p) => n + p.length, 0);
    const query = new URLSearchParams({
      uploadType: "multipart",
      ...(ifGenerationMatch !== undefined ? { ifGenerationMatch: String(ifGenerationMatch) } : {}),
    });
    for (const r = this.attempts("upload", key); ; ) {
      try {
        const a = await this.http.send("POST", `${this.uploads}?${query}`, {
          headers: { "content-type": `multipart/related; boundary=${boundary}`, "content-length": String(length) },
          body: (async function* () {
            yield* parts;
          })(),
          accept: [200, 400, 404, 412],
          path,
        });
        if (a.status === 404) return await noSuchBucket(a, path);
        if (a.status === 400) throw await refused(a, path);
        if (a.status === 412) {
          // The storage-testbench refuses a CRC-32C mismatch with 412 where GCS says 400: damaged on the way
          // either way, so sent again. Without a precondition of ours, any other 412 is no answer we expect.
          const why = await refused(a, path, 412);
          if (why instanceof TransientError || ifGenerationMatch === undefined) throw why;
          // After a lost answer, the object that fails the precondition may be the one our first attempt wrote.
          if (r.retried) {
            const now = await this.resource(key);
            if (now && Number(now.size) === written.size && storedCrc(now.crc32c).crc32c === written.crc32c) {
              return { written, generation: String(now.generation) };
            }
          }
          return undefined;
        }
        const stored = await a.json<ObjectResource>();
        checkStored(stored, name, written);
        return { written, generation: String(stored.generation) };
      } catch (e) {
        await r.failed(e);
      }
    }
  }

  /**
   * A resumable upload (https://cloud.google.com/storage/docs/performing-resumable-uploads): a session is
   * opened, then the object is sent in chunks of `chunk` bytes with `Content-Range: bytes FIRST-LAST/TOTAL`
   * (TOTAL `*` until the last chunk, as the size of a stream is known only at its end). GCS answers 308 with a
   * `Range: bytes=0-N` of what it kept (possibly less than sent: the rest goes again with the next chunk), and
   * the object resource after the last. After a failed request, a PUT without a body asks GCS how much it has
   * (see session), and the upload goes on from there, so a failure costs at most one chunk. A
   * session GCS no longer knows (404 or 410: expired, or refused) restarts the object from its first byte in
   * a new session, which needs the bytes again: `open` gives them (undefined: they cannot be had again, and
   * the write fails; a re-run resumes). The whole object's CRC-32C is compared with the one GCS stored, and an
   * object that differs is deleted (that generation only) and uploaded again.
   */
  private async resumable(key: string, name: string, chunk: number, open: () => ChunkSource | undefined): Promise<WriteResult> {
    const path = describe(this, key);
    let source = open() as ChunkSource;
    try {
      for (const restarts = this.attempts("resumable upload", key); ; ) {
        const outcome = await this.session(key, name, chunk, source, path);
        if ("written" in outcome) return outcome.written;
        await source.close();
        await restarts.failed(outcome.restart);
        const again = open();
        if (again === undefined) {
          throw new StorageIoError(`resumable upload failed and its source cannot be read again: ${outcome.restart.message}`, { path });
        }
        source = again;
      }
    } finally {
      await source.close();
    }
  }

  /** One upload session: the object written, or why it must start over. */
  private async session(
    key: string,
    name: string,
    chunk: number,
    source: ChunkSource,
    path: string,
  ): Promise<{ written: WriteResult } | { restart: TransientError }> {
    const uri = await this.startSession(key, name, path);
    let kept = 0; // bytes GCS confirmed
    let ask = false; // the last request failed: ask GCS what it has before sending more
    for (let r = this.attempts("resumable upload", key); ; ) {
      try {
        let a: Answer;
        const asked = ask;
        if (ask) {
          // The status query: Content-Range "bytes */TOTAL", or "bytes */*" while the size is not known yet.
          const total = source.total?.size;
          a = await this.http.send("PUT", uri, {
            headers: { "content-range": `bytes */${total ?? "*"}` },
            accept: [200, 201, 308, 404, 410],
            path,
          });
        } else {
          const { bytes, last } = await source.take(kept, chunk);
          const end = kept + bytes.length;
          a = await this.http.send("PUT", uri, {
            headers: { "content-range": bytes.length > 0 ? `bytes ${kept}-${end - 1}/${last ? end : "*"}` : `bytes */${end}` },
            body: bytes,
            accept: [200, 201, 308, 404, 410],
            path,
          });
        }
        ask = false;
        if (a.status === 404 || a.status === 410) {
          await a.discard();
          return { restart: new TransientError(`the upload session is gone (${a.status})`, `http-${a.status}`) };
        }
        if (a.status === 308) {
          await a.discard();
          const now = keptBytes(a.headers);
          if (now < kept) return { restart: new TransientError(`GCS says it has ${now} bytes of the upload, after ${kept}`, "bad-answer") };
          if (now === kept) {
            if (asked) continue; // nothing of the failed request arrived: send it again
            throw new TransientError(`GCS kept none of the chunk sent at ${kept}`, "no-progress");
          }
          kept = now;
          r = this.attempts("resumable upload", key); // progress: the deadline counts from here
          continue;
        }
        const stored = await a.json<ObjectResource>();
        const written = source.total;
        if (written === undefined) {
          return { restart: new TransientError(`GCS finished the upload at ${stored.size} bytes, before its end`, "bad-answer") };
        }
        try {
          checkStored(stored, name, written);
        } catch (e) {
          await this.deleteIf(key, String(stored.generation));
          return { restart: e as TransientError };
        }
        return { written };
      } catch (e) {
        await r.failed(e);
        ask = true;
      }
    }
  }

  /** Opens a resumable upload session: its URI, from the Location header. */
  private async startSession(key: string, name: string, path: string): Promise<string> {
    for (const r = this.attempts("resumable upload", key); ; ) {
      try {
        const a = await this.http.send("POST", `${this.uploads}?uploadType=resumable`, {
          headers: { "content-type": "application/json; charset=UTF-8" },
          body: Buffer.from(JSON.stringify({ name })),
          accept: [200, 201, 404],
          path,
        });
        if (a.status === 404) return await noSuchBucket(a, path);
        await a.discard();
        const uri = a.headers.get("location");
        if (!uri) throw new TransientError("GCS opened an upload session without a Location", "bad-answer");
        return uri;
      } catch (e) {
        await r.failed(e);
      }
    }
  }

  /**
   * One multipart upload streamed from a ranged source. Its CRC-32C is known only once the bytes are sent,
   * so it is compared with the one GCS stored (https://cloud.google.com/storage/docs/data-validation): a
   * mismatch, like any transient failure, uploads the object again from its first byte (unconditional, so
   * the good bytes replace the bad).
   */
  private async streamedPut(key: string, name: string, reader: RangeReader): Promise<WriteResult> {
    const path = describe(this, key);
    const size = reader.source.length;
    const boundary = randomBytes(12).toString("hex");
    const head = multipartHead(boundary, { name });
    const tail = multipartTail(boundary);
    for (const r = this.attempts("upload", key); ; ) {
      try {
        await reader.seek(START, 0);
        const a = await this.http.send("POST", `${this.uploads}?uploadType=multipart`, {
          headers: {
            "content-type": `multipart/related; boundary=${boundary}`,
            "content-length": String(head.length + size + tail.length),
          },
          body: (async function* () {
            yield head;
            yield* reader.pieces(size);
            yield tail;
          })(),
          accept: [200, 400],
          path,
        });
        if (a.status === 400) throw await refused(a, path);
        const stored = await a.json<ObjectResource>();
        const sent = reader.position;
        if (sent?.at !== size) throw new TransientError("GCS answered an upload before its last byte", "bad-answer");
        const written = { size, crc32c: sent.crc };
        checkStored(stored, name, written);
        return written;
      } catch (e) {
        await r.failed(e);
      }
    }
  }

  /**
   * A resumable upload streamed from a ranged source: as resumable(), but each chunk is read from the source as
   * it is sent (nothing held in memory), and after a failure the source is reopened where GCS says it has the
   * bytes (from the last confirmed chunk, hashing up to there). The size is known, so every chunk says it.
   */
  private async streamedResumable(key: string, name: string, chunk: number, reader: RangeReader): Promise<WriteResult> {
    const path = describe(this, key);
    const size = reader.source.length;
    for (const restarts = this.attempts("resumable upload", key); ; ) {
      const outcome = await this.streamedSession(key, name, chunk, reader, path, size);
      if ("written" in outcome) return outcome.written;
      await restarts.failed(outcome.restart);
    }
  }

  private async streamedSession(
    key: string,
    name: string,
    chunk: number,
    reader: RangeReader,
    path: string,
    size: number,
  ): Promise<{ written: WriteResult } | { restart: TransientError }> {
    const uri = await this.startSession(key, name, path);
    let known: CrcPoint = START; // the CRC-32C of the bytes GCS confirmed, as far as it was taken
    let kept = 0; // bytes GCS confirmed
    let ask = false; // the last request failed: ask GCS what it has before sending more
    for (let r = this.attempts("resumable upload", key); ; ) {
      try {
        let a: Answer;
        const asked = ask;
        if (ask) {
          a = await this.http.send("PUT", uri, {
            headers: { "content-range": `bytes */${size}` },
            accept: [200, 201, 308, 404, 410],
            path,
          });
        } else {
          await reader.seek(known, kept);
          const n = Math.min(chunk, size - kept);
          a = await this.http.send("PUT", uri, {
            headers: { "content-range": `bytes ${kept}-${kept + n - 1}/${size}`, "content-length": String(n) },
            body: reader.pieces(n),
            accept: [200, 201, 308, 404, 410],
            path,
          });
        }
        ask = false;
        if (a.status === 404 || a.status === 410) {
          await a.discard();
          return { restart: new TransientError(`the upload session is gone (${a.status})`, `http-${a.status}`) };
        }
        if (a.status === 308) {
          await a.discard();
          const now = keptBytes(a.headers);
          if (now < kept || now > size) {
            return { restart: new TransientError(`GCS says it has ${now} bytes of the upload, after ${kept}`, "bad-answer") };
          }
          if (now === kept) {
            if (asked) continue; // nothing of the failed request arrived: send it again
            throw new TransientError(`GCS kept none of the chunk sent at ${kept}`, "no-progress");
          }
          kept = now;
          const at = reader.position;
          if (at?.at === kept) known = at; // the whole chunk: its CRC-32C is known; otherwise re-hashed from `known`
          r = this.attempts("resumable upload", key); // progress: the deadline counts from here
          continue;
        }
        const stored = await a.json<ObjectResource>();
        // The whole object's CRC-32C: already taken if the last chunk's bytes all went through the reader.
        await reader.seek(known, size);
        const written = { size, crc32c: (reader.position as CrcPoint).crc };
        try {
          checkStored(stored, name, written);
        } catch (e) {
          await this.deleteIf(key, String(stored.generation));
          return { restart: e as TransientError };
        }
        return { written };
      } catch (e) {
        await r.failed(e);
        ask = true;
      }
    }
  }

  async createExclusive(key: string, data: Uint8Array): Promise<boolean> {
    // Generation 0 means "no live object": GCS refuses the upload (412) if the name exists.
    return (await this.upload(key, this.name(key), data, 0)) !== undefined;
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
      const url = this.objectUrl(this.name(key), { alt: "media", generation: version });
      const path = describe(this, key);
      for (const r = this.attempts("download", key); ; ) {
        try {
          const a = await this.http.send("GET", url, { accept: [200, 404], path });
          if (a.status === 404) return void (await a.discard());
          return { data: await a.bytes(), version };
        } catch (e) {
          await r.failed(e);
        }
      }
    },
    create: async (key: string, data: Uint8Array) => (await this.upload(key, this.name(key), data, 0))?.generation,
    replace: async (key: string, data: Uint8Array, version: string) =>
      (await this.upload(key, this.name(key), data, Number(version)))?.generation,
    delete: (key: string, version: string) => this.deleteIf(key, version),
  };

  private async deleteIf(key: string, version: string): Promise<boolean> {
    const url = this.objectUrl(this.name(key), { ifGenerationMatch: version });
    const path = describe(this, key);
    for (const r = this.attempts("delete", key); ; ) {
      try {
        const a = await this.http.send("DELETE", url, { accept: [200, 204, 404, 412], path });
        await a.discard();
        // A 404 after a lost answer is most likely our own delete having happened.
        return a.status === 200 || a.status === 204 || (a.status === 404 && r.retried);
      } catch (e) {
        await r.failed(e);
      }
    }
  }

  async delete(key: string): Promise<void> {
    const url = this.objectUrl(this.name(key));
    const path = describe(this, key);
    for (const r = this.attempts("delete", key); ; ) {
      try {
        return await (await this.http.send("DELETE", url, { accept: [200, 204, 404], path })).discard();
      } catch (e) {
        await r.failed(e);
      }
    }
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
  private async resource(key: string): Promise<ObjectResource | undefined> {
    const url = this.objectUrl(this.name(key));
    const path = describe(this, key);
    for (const r = this.attempts("metadata request", key); ; ) {
      try {
        const a = await this.http.send("GET", url, { accept: [200, 404], path });
        if (a.status === 404) return void (await a.discard());
        return await a.json<ObjectResource>();
      } catch (e) {
        await r.failed(e);
      }
    }
  }
}

async function notFound(a: Answer, path: string): Promise<never> {
  await a.discard();
  throw new NotFoundError("no such object", { path });
}

/**
 * A 404 to a request on the bucket itself (a listing, an upload's start): the bucket does not exist, which
 * the user fixes at the destination. Named with GCS's own words, as any other refused request is.
 */
async function noSuchBucket(a: Answer, path: string): Promise<never> {
  const text = new TextDecoder().decode(await a.bytes().catch(() => new Uint8Array()));
  let message = text.slice(0, 300);
  try {
    const m = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    if (m !== undefined && m !== null) message = typeof m === "string" ? m : JSON.stringify(m);
  } catch {
    // not JSON: keep the text
  }
  message = message.replace(/\s+/g, " ").trim();
  throw new DestinationError(`no such bucket (HTTP 404${message ? ` (${message})` : ""})`, { path });
}

function shortRead(path: string, offset: number, length: number, got?: number): FormatError {
  const what = got === undefined ? "the object is shorter" : `got ${got}`;
  return new FormatError(`short read: wanted ${length} bytes at offset ${offset}, ${what}`, { path, offset });
}

/** A 400 to an upload: a CRC-32C mismatch means bytes damaged on the way (send them again); anything else is final. */
async function refused(a: Answer, path: string, status = 400): Promise<Error> {
  const text = new TextDecoder().decode(await a.bytes().catch(() => new Uint8Array()));
  const message = /"message"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(text)?.[1] ?? text.slice(0, 300);
  if (/crc32c/i.test(message) || /crc32c/i.test(text)) return new TransientError(`GCS refused the upload: ${message}`, "checksum");
  return new StorageIoError(`GCS refused the upload: HTTP ${status} (${message})`, { path });
}

/** What GCS says it stored must be what we sent (name, size and CRC-32C): otherwise the request was damaged. */
function checkStored(stored: ObjectResource, name: string, sent: WriteResult): void {
  if (stored.name !== name) throw new TransientError(`GCS stored the upload as ${JSON.stringify(stored.name)}`, "bad-answer");
  const crc = storedCrc(stored.crc32c).crc32c;
  if (Number(stored.size) !== sent.size || (crc !== undefined && crc !== sent.crc32c)) {
    throw new TransientError(
      `GCS stored ${stored.size} bytes with CRC-32C ${stored.crc32c}, we sent ${sent.size} with ${crcBase64(sent.crc32c)}`,
      "checksum",
    );
  }
}

function multipartHead(boundary: string, metadata: Record<string, string>): Buffer {
  return Buffer.from(
    `--${boundary}\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n${JSON.stringify(metadata)}\r\n` +
      `--${boundary}\r\ncontent-type: application/octet-stream\r\n\r\n`,
  );
}

const multipartTail = (boundary: string) => Buffer.from(`\r\n--${boundary}--\r\n`);

/** What a 308 says GCS kept of a resumable upload: `Range: bytes=0-N` is N + 1 bytes, no Range none. */
function keptBytes(headers: Headers): number {
  const m = /bytes=0-(\d+)/.exec(headers.get("range") ?? "");
  return m ? Number(m[1]) + 1 : 0;
}

/** GCS's crc32c metadata: base64 of the big-endian CRC-32C (https://cloud.google.com/storage/docs/json_api/v1/objects). */
function storedCrc(base64: string | undefined): { crc32c?: number } {
  if (!base64) return {};
  const b = Buffer.from(base64, "base64");
  return b.length === 4 ? { crc32c: b.readUInt32BE(0) } : {};
}

function crcBase64(value: number): string {
  const b = Buffer.alloc(4);
  b.writeUInt32BE(value >>> 0, 0);
  return b.toString("base64");
}

/** The crc32c in an X-Goog-Hash header ("crc32c=...,md5=..."), which GCS sends with every download. */
function hashHeader(headers: Headers): number | undefined {
  const m = /crc32c=([A-Za-z0-9+/=]+)/.exec(headers.get("x-goog-hash") ?? "");
  return m ? storedCrc(m[1]).crc32c : undefined;
}

/**
 * google-auth-library 9 (what @google-cloud/storage 7 bundles, in the tests' clients) returns request headers
 * as a plain object, version 10 (ours) as a fetch `Headers`: accept both, so an upgrade cannot silently drop the Authorization header.
 */
function headerRecord(h: unknown): Record<string, string> {
  const out: Record<string, string> = {};
  if (h && typeof (h as Headers).forEach === "function")
    (h as Headers).forEach((v, k) => {
      out[k] = v;
    });
  else for (const [k, v] of Object.entries((h ?? {}) as Record<string, unknown>)) out[k] = String(v);
  return out;
}
