// Uploads to GCS: one multipart request for an object that fits in a chunk, a resumable session for a larger
// one; from bytes in memory, a stream read chunk by chunk, or a ranged source streamed with nothing buffered.
// Every request goes through json-api.ts, and so through its one retry loop.
import { randomBytes } from "node:crypto";
import { crc32c } from "../../codecs/crc32c.js";
import { StorageIoError } from "../../errors.js";
import type { ChunkSource, CrcPoint, RangeReader } from "../chunks.js";
import type { Answer } from "../http.js";
import { AGAIN, type Attempts, TransientError } from "../retry.js";
import type { WriteResult } from "../store.js";
import { crcBase64, type GcsRequest, type JsonApi, type ObjectResource, storedCrc } from "./json-api.js";

const START: CrcPoint = { at: 0, crc: 0 };

/** A resumable session's answers: 308 for a chunk kept, 200/201 with the object after the last, 404/410 when it is gone. */
const SESSION_STATUSES = [200, 201, 308, 404, 410];

/** What an upload sent: its size and CRC-32C, which GCS checks every upload against (so always computed). */
type Sent = Required<WriteResult>;
/** One upload session's end: the object written, or why it must start over. */
type SessionOutcome = { written: Sent } | { restart: TransientError };

export class Uploads {
  constructor(private readonly api: JsonApi) {}

  /** An unconditional upload (it cannot fail a precondition). */
  async put(name: string, path: string, data: Uint8Array | Uint8Array[]): Promise<Sent> {
    return ((await this.upload(name, path, data)) as { written: Sent }).written;
  }

  /**
   * One multipart upload of known bytes, carrying their CRC-32C in the object resource (base64 of the
   * big-endian value): GCS refuses the upload with 400 if the bytes it received do not match
   * (https://cloud.google.com/storage/docs/data-validation). The same bytes can be sent again, so every
   * transient failure is retried. With `ifGenerationMatch`, undefined when the precondition fails. The body
   * is sent as its parts (`data` may be the pieces of a gathered stream), never copied into one buffer.
   */
  async upload(
    name: string,
    path: string,
    data: Uint8Array | Uint8Array[],
    ifGenerationMatch?: number,
  ): Promise<{ written: Sent; generation: string } | undefined> {
    const pieces = data instanceof Uint8Array ? [data] : data;
    const written = { size: 0, crc32c: 0 };
    for (const p of pieces) {
      written.size += p.length;
      written.crc32c = crc32c(p, written.crc32c);
    }
    const boundary = randomBytes(12).toString("hex");
    const parts = [multipartHead(boundary, { name, crc32c: crcBase64(written.crc32c) }), ...pieces, multipartTail(boundary)];
    const length = parts.reduce((n, p) => n + p.length, 0);
    const req: GcsRequest = {
      method: "POST",
      to: "upload",
      query: { uploadType: "multipart", ...(ifGenerationMatch !== undefined ? { ifGenerationMatch: String(ifGenerationMatch) } : {}) },
      headers: { "content-type": `multipart/related; boundary=${boundary}`, "content-length": String(length) },
      body: () =>
        (async function* () {
          yield* parts;
        })(),
      accept: [200, 400, 412],
      missing: "bucket",
      path,
    };
    return this.api.request("upload", req, async (a, r) => {
      if (a.status === 400) throw await refused(a, path);
      if (a.status === 412) {
        // The storage-testbench refuses a CRC-32C mismatch with 412 where GCS says 400: damaged on the way
        // either way, so sent again. Without a precondition of ours, any other 412 is no answer we expect.
        const why = await refused(a, path, 412);
        if (why instanceof TransientError || ifGenerationMatch === undefined) throw why;
        // After a lost answer, the object that fails the precondition may be the one our first attempt wrote.
        if (r.retried) {
          const now = await this.api.resource(name, path);
          if (now && Number(now.size) === written.size && storedCrc(now.crc32c).crc32c === written.crc32c) {
            return { written, generation: String(now.generation) };
          }
        }
        return undefined;
      }
      const stored = await a.json<ObjectResource>();
      checkStored(stored, name, written);
      return { written, generation: String(stored.generation) };
    });
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
  async resumable(name: string, path: string, chunk: number, open: () => ChunkSource | undefined): Promise<Sent> {
    let source = open() as ChunkSource;
    let restart: TransientError | undefined;
    try {
      return await this.api.retrying("resumable upload", path, async () => {
        if (restart !== undefined) {
          const again = open();
          if (again === undefined) {
            throw new StorageIoError(`resumable upload failed and its source cannot be read again: ${restart.message}`, { path });
          }
          source = again;
        }
        const outcome = await this.session(name, path, chunk, source);
        if ("written" in outcome) return outcome.written;
        await source.close();
        restart = outcome.restart;
        throw restart;
      });
    } finally {
      await source.close();
    }
  }

  private async session(name: string, path: string, chunk: number, source: ChunkSource): Promise<SessionOutcome> {
    const uri = await this.startSession(name, path);
    let kept = 0; // bytes GCS confirmed
    let sent = 0; // the furthest byte sent in this session: GCS cannot have more
    let ask = false; // the last request failed: ask GCS what it has before sending more
    return this.api.retrying<SessionOutcome>("resumable upload", path, async (r) => {
      try {
        let a: Answer;
        const asked = ask;
        if (ask) {
          // The status query: Content-Range "bytes */TOTAL", or "bytes */*" while the size is not known yet.
          const total = source.total?.size;
          a = await this.api.send({
            method: "PUT",
            to: { session: uri },
            headers: { "content-range": `bytes */${total ?? "*"}` },
            accept: SESSION_STATUSES,
            path,
          });
        } else {
          const { bytes, last } = await source.take(kept, chunk);
          const end = kept + bytes.length;
          sent = Math.max(sent, end);
          a = await this.api.send({
            method: "PUT",
            to: { session: uri },
            headers: { "content-range": bytes.length > 0 ? `bytes ${kept}-${end - 1}/${last ? end : "*"}` : `bytes */${end}` },
            body: bytes,
            accept: SESSION_STATUSES,
            path,
          });
        }
        ask = false;
        const next = await sessionAnswer(a, kept, asked, r, sent);
        if (next === AGAIN || "restart" in next) return next;
        if ("kept" in next) {
          kept = next.kept;
          return AGAIN;
        }
        const written = source.total;
        if (written === undefined) {
          return { restart: new TransientError(`GCS finished the upload at ${next.stored.size} bytes, before its end`, "bad-answer") };
        }
        return await this.finished(next.stored, name, path, written);
      } catch (e) {
        ask = true;
        throw e;
      }
    });
  }

  /** A session's last answer: the object, if GCS stored what was sent; otherwise it is deleted (that generation only) and written again. */
  private async finished(stored: ObjectResource, name: string, path: string, written: Sent): Promise<SessionOutcome> {
    try {
      checkStored(stored, name, written);
    } catch (e) {
      await this.api.deleteIf(name, path, String(stored.generation));
      return { restart: e as TransientError };
    }
    return { written };
  }

  /** Opens a resumable upload session: its URI, from the Location header. */
  private startSession(name: string, path: string): Promise<string> {
    const req: GcsRequest = {
      method: "POST",
      to: "upload",
      query: { uploadType: "resumable" },
      headers: { "content-type": "application/json; charset=UTF-8" },
      body: Buffer.from(JSON.stringify({ name })),
      accept: [200, 201],
      missing: "bucket",
      path,
    };
    return this.api.request("resumable upload", req, async (a) => {
      await a.discard();
      const uri = a.headers.get("location");
      if (!uri) throw new TransientError("GCS opened an upload session without a Location", "bad-answer");
      return uri;
    });
  }

  /**
   * One upload streamed from a ranged source, as a simple upload (`uploadType=media`, the name in the query:
   * https://cloud.google.com/storage/docs/json_api/v1/objects/insert): the body is the object's bytes alone, with
   * no multipart framing for the server to parse and buffer. Its CRC-32C is known only once the bytes are sent, so
   * it is compared with the one GCS stored (https://cloud.google.com/storage/docs/data-validation): a mismatch,
   * like any transient failure, uploads the object again from its first byte (unconditional, so the good bytes
   * replace the bad).
   */
  async streamedPut(name: string, path: string, reader: RangeReader): Promise<Sent> {
    const size = reader.source.length;
    const req: GcsRequest = {
      method: "POST",
      to: "upload",
      query: { uploadType: "media", name },
      headers: { "content-type": "application/octet-stream", "content-length": String(size) },
      body: () => reader.pieces(size),
      accept: [200, 400],
      missing: "bucket",
      path,
    };
    const url = this.api.url(req.to, req.query);
    return this.api.retrying("upload", path, async () => {
      await reader.seek(START, 0);
      const a = await this.api.send(req, url);
      if (a.status === 400) throw await refused(a, path);
      const stored = await a.json<ObjectResource>();
      const sent = reader.position;
      if (sent?.at !== size) throw new TransientError("GCS answered an upload before its last byte", "bad-answer");
      const written = { size, crc32c: sent.crc };
      checkStored(stored, name, written);
      return written;
    });
  }

  /**
   * A resumable upload streamed from a ranged source: as resumable(), but each chunk is read from the source as
   * it is sent (nothing held in memory), and after a failure the source is reopened where GCS says it has the
   * bytes (from the last confirmed chunk, hashing up to there). The size is known, so every chunk says it.
   */
  streamedResumable(name: string, path: string, chunk: number, reader: RangeReader): Promise<Sent> {
    const size = reader.source.length;
    return this.api.retrying("resumable upload", path, async () => {
      const outcome = await this.streamedSession(name, path, chunk, reader, size);
      if ("written" in outcome) return outcome.written;
      throw outcome.restart;
    });
  }

  private async streamedSession(name: string, path: string, chunk: number, reader: RangeReader, size: number): Promise<SessionOutcome> {
    const uri = await this.startSession(name, path);
    let known: CrcPoint = START; // the CRC-32C of the bytes GCS confirmed, as far as it was taken
    let kept = 0; // bytes GCS confirmed
    let sent = 0; // the furthest byte sent in this session: GCS cannot have more
    let ask = false; // the last request failed: ask GCS what it has before sending more
    return this.api.retrying<SessionOutcome>("resumable upload", path, async (r) => {
      try {
        let a: Answer;
        const asked = ask;
        if (ask) {
          a = await this.api.send({
            method: "PUT",
            to: { session: uri },
            headers: { "content-range": `bytes */${size}` },
            accept: SESSION_STATUSES,
            path,
          });
        } else {
          await reader.seek(known, kept);
          const n = Math.min(chunk, size - kept);
          sent = Math.max(sent, kept + n);
          a = await this.api.send({
            method: "PUT",
            to: { session: uri },
            headers: { "content-range": `bytes ${kept}-${kept + n - 1}/${size}`, "content-length": String(n) },
            body: () => reader.pieces(n),
            accept: SESSION_STATUSES,
            path,
          });
        }
        ask = false;
        const next = await sessionAnswer(a, kept, asked, r, sent);
        if (next === AGAIN || "restart" in next) return next;
        if ("kept" in next) {
          kept = next.kept;
          const at = reader.position;
          if (at?.at === kept) known = at; // the whole chunk: its CRC-32C is known; otherwise re-hashed from `known`
          return AGAIN;
        }
        // The whole object's CRC-32C: already taken if the last chunk's bytes all went through the reader.
        await reader.seek(known, size);
        return await this.finished(next.stored, name, path, { size, crc32c: (reader.position as CrcPoint).crc });
      } catch (e) {
        ask = true;
        throw e;
      }
    });
  }
}

/** A 400 to an upload: a CRC-32C mismatch means bytes damaged on the way (send them again); anything else is final. */
async function refused(a: Answer, path: string, status = 400): Promise<Error> {
  const text = new TextDecoder().decode(await a.bytes().catch(() => new Uint8Array()));
  const message = /"message"\s*:\s*"((?:[^"\\]|\\.)*)"/.exec(text)?.[1] ?? text.slice(0, 300);
  if (/crc32c/i.test(message) || /crc32c/i.test(text)) return new TransientError(`GCS refused the upload: ${message}`, "checksum");
  return new StorageIoError(`GCS refused the upload: HTTP ${status} (${message})`, { path });
}

/** What GCS says it stored must be what we sent (name, size and CRC-32C): otherwise the request was damaged. */
function checkStored(stored: ObjectResource, name: string, sent: Sent): void {
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

/**
 * What an answer in a resumable session (to a chunk, or to a status query if `asked`) says, for both session
 * loops: the session is gone (404/410: the object starts over in a new one), GCS has more than `kept` (a
 * 308's Range; the deadline counts afresh), nothing of a failed request arrived (AGAIN: send it again), or
 * the object is written (its resource). A Range behind `kept` or past the bytes `sent` in the session is a bad
 * answer, and a chunk of which nothing was kept a transient failure.
 */
async function sessionAnswer(
  a: Answer,
  kept: number,
  asked: boolean,
  r: Attempts,
  sent: number,
): Promise<{ restart: TransientError } | { kept: number } | typeof AGAIN | { stored: ObjectResource }> {
  if (a.status === 404 || a.status === 410) {
    await a.discard();
    return { restart: new TransientError(`the upload session is gone (${a.status})`, `http-${a.status}`) };
  }
  if (a.status === 308) {
    await a.discard();
    const now = keptBytes(a.headers);
    if (now < kept || now > sent) {
      return { restart: new TransientError(`GCS says it has ${now} bytes of the upload, after ${kept}`, "bad-answer") };
    }
    if (now === kept) {
      if (asked) return AGAIN; // nothing of the failed request arrived: send it again
      throw new TransientError(`GCS kept none of the chunk sent at ${kept}`, "no-progress");
    }
    r.progressed(); // the deadline counts from here
    return { kept: now };
  }
  return { stored: await a.json<ObjectResource>() };
}

/** What a 308 says GCS kept of a resumable upload: `Range: bytes=0-N` is N + 1 bytes, no Range none. */
function keptBytes(headers: Headers): number {
  const m = /bytes=0-(\d+)/.exec(headers.get("range") ?? "");
  return m ? Number(m[1]) + 1 : 0;
}
