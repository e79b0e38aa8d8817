// A resumable upload session's answers, as both session loops take them (bytes in memory, and a ranged source
// streamed chunk by chunk), against a stub that plays GCS's session protocol
// (https://cloud.google.com/storage/docs/performing-resumable-uploads) over HTTPS and can bend one answer: answers
// fake-gcs-server and the fault proxy cannot give (a 404 session, a Range that goes back or past the end).
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer, type Server } from "node:https";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { type ChunkSource, memoryChunks, RangeReader } from "../../src/store/chunks.js";
import { crcBase64, JsonApi } from "../../src/store/gcs/json-api.js";
import { Uploads } from "../../src/store/gcs/uploads.js";
import { Http, NO_CREDENTIALS } from "../../src/store/http.js";
import { resetRetryStats, retryStats } from "../../src/store/retry.js";
import { serverTls } from "../helpers/tls.mjs";

const CHUNK = 256 * 1024;
const SIZE = 3 * CHUNK + 17;
const DATA = Uint8Array.from({ length: SIZE }, (_, i) => (i * 7 + (i >>> 11)) & 0xff);
const PATH = "gs://b/obj";

/** One request's answer, bent: given the session's number (1-based) and its request's, or undefined to answer as GCS. */
type Bend = (session: number, request: number, kept: number) => { status: number; range?: string } | undefined;

let server: Server;
let endpoint: string;
let bend: Bend = () => undefined;
/** Per session: its requests' Content-Range headers. */
let sessions: string[][] = [];

function handle(req: IncomingMessage, res: ServerResponse): void {
  const body: Buffer[] = [];
  req.on("data", (b: Buffer) => body.push(b));
  req.on("end", () => {
    const url = new URL(req.url ?? "/", endpoint);
    if (req.method === "POST" && url.searchParams.get("uploadType") === "resumable") {
      sessions.push([]);
      res.writeHead(200, { location: `${endpoint}/session/${sessions.length}` }).end();
      return;
    }
    const n = Number(/^\/session\/(\d+)$/.exec(url.pathname)?.[1]);
    const log = sessions[n - 1];
    if (req.method !== "PUT" || log === undefined) {
      res.writeHead(400).end();
      return;
    }
    const range = req.headers["content-range"] ?? "";
    log.push(range);
    const stored = (state.get(n) ?? Buffer.alloc(0)) as Buffer;
    const m = /^bytes (\d+)-(\d+)\/(\d+|\*)$/.exec(range);
    let now = stored;
    if (m && Number(m[1]) <= stored.length) now = Buffer.concat([stored.subarray(0, Number(m[1])), ...body]);
    const bent = bend(n, log.length, now.length);
    if (bent !== undefined) {
      res.writeHead(bent.status, bent.range ? { range: bent.range } : {}).end();
      return;
    }
    state.set(n, now);
    const total = m?.[3] ?? /\/(\d+|\*)$/.exec(range)?.[1];
    if (total !== undefined && total !== "*" && now.length === Number(total)) {
      const resource = JSON.stringify({ name: "obj", size: String(now.length), crc32c: crcBase64(crc32c(now)), generation: "1" });
      res.writeHead(200, { "content-type": "application/json" }).end(resource);
      return;
    }
    res.writeHead(308, now.length > 0 ? { range: `bytes=0-${now.length - 1}` } : {}).end();
  });
}
/** What each session holds. */
const state = new Map<number, Buffer>();

beforeAll(async () => {
  server = createServer(serverTls(), handle); // HTTPS, as GCS answers (the test CA's loopback certificate)
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const a = server.address();
  endpoint = `https://127.0.0.1:${typeof a === "object" && a ? a.port : 0}`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));
afterEach(() => {
  bend = () => undefined;
  sessions = [];
  state.clear();
  resetRetryStats();
});

function uploads(): Uploads {
  const http = new Http(NO_CREDENTIALS, { stallMs: 5_000 });
  return new Uploads(new JsonApi(endpoint, "b", http, { firstDelayMs: 1, maxDelayMs: 5, deadlineMs: 10_000 }));
}

const SOURCES = {
  "bytes in memory": (u: Uploads) => u.resumable("obj", PATH, CHUNK, (): ChunkSource => memoryChunks(DATA)),
  "a ranged source": async (u: Uploads) => {
    const ranged = {
      length: SIZE,
      async *from(skip: number) {
        for (let at = skip; at < SIZE; at += 100_000) yield DATA.slice(at, Math.min(SIZE, at + 100_000));
      },
    };
    const reader = new RangeReader(ranged, (got) => new Error(`short at ${got}`));
    try {
      return await u.streamedResumable("obj", PATH, CHUNK, reader);
    } finally {
      await reader.close();
    }
  },
};

// The total in a chunk's Content-Range: a ranged source's size is known from the start, a buffered one's at its end.
describe.each([
  ["bytes in memory", "*"],
  ["a ranged source", String(SIZE)],
] as const)("a resumable session's answers, uploading %s", (from, total) => {
  const upload = SOURCES[from];
  const written = { size: SIZE, crc32c: crc32c(DATA) };

  test("each 308's Range says where the next chunk starts, and the last chunk's answer is the object", async () => {
    expect(await upload(uploads())).toEqual(written);
    expect(sessions).toEqual([
      [
        `bytes 0-${CHUNK - 1}/${total}`,
        `bytes ${CHUNK}-${2 * CHUNK - 1}/${total}`,
        `bytes ${2 * CHUNK}-${3 * CHUNK - 1}/${total}`,
        `bytes ${3 * CHUNK}-${SIZE - 1}/${SIZE}`,
      ],
    ]);
    expect(retryStats().retries).toBe(0);
  });

  test.each([404, 410])("a session that is gone (%i) restarts the object from its first byte in a new session", async (status) => {
    bend = (session, request) => (session === 1 && request === 2 ? { status } : undefined);
    expect(await upload(uploads())).toEqual(written);
    expect(sessions.length).toBe(2);
    expect(sessions[1]?.[0]).toMatch(/^bytes 0-/);
    expect(retryStats().byKind).toEqual({ [`http-${status}`]: 1 });
  });

  test("a 308 whose Range is behind what GCS had confirmed restarts the object in a new session", async () => {
    bend = (session, request) => (session === 1 && request === 3 ? { status: 308, range: "bytes=0-9" } : undefined);
    expect(await upload(uploads())).toEqual(written);
    expect(sessions.length).toBe(2);
    expect(retryStats().byKind).toEqual({ "bad-answer": 1 });
  });

  test("a 308 whose Range is past the bytes sent so far restarts the object in a new session", async () => {
    bend = (session, request) => (session === 1 && request === 1 ? { status: 308, range: `bytes=0-${CHUNK}` } : undefined);
    expect(await upload(uploads())).toEqual(written);
    expect(sessions.length).toBe(2);
    expect(retryStats().byKind).toEqual({ "bad-answer": 1 });
  });

  test("a chunk of which nothing was kept is retried: GCS is asked what it has, and the chunk sent again", async () => {
    bend = (session, request, kept) =>
      session === 1 && request === 2 ? { status: 308, range: `bytes=0-${Math.min(kept, CHUNK) - 1}` } : undefined;
    expect(await upload(uploads())).toEqual(written);
    expect(sessions.length).toBe(1);
    expect(sessions[0]?.slice(1, 4)).toEqual([
      `bytes ${CHUNK}-${2 * CHUNK - 1}/${total}`,
      `bytes */${total}`,
      `bytes ${CHUNK}-${2 * CHUNK - 1}/${total}`,
    ]);
    expect(retryStats().byKind).toEqual({ "no-progress": 1 });
  });
});
