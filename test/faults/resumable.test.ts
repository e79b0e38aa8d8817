// Resumable uploads of large objects (GcsStore against fake-gcs-server behind the fault proxy): a failure
// costs at most one chunk, an expired session restarts the object, and what is stored is what was sent.
// (fake-gcs-server finalizes an upload when asked for its status; the proxy answers those queries as GCS
// does, from the server's last 308: see proxy.ts.)
import { Storage } from "@google-cloud/storage";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { StorageIoError } from "../../src/errors.js";
import { type GcsOptions, GcsStore } from "../../src/store/gcs.js";
import { replayable } from "../../src/store/replay.js";
import { resetRetryStats, retryStats } from "../../src/store/retry.js";
import { newBucket } from "../helpers/gcs.js";
import { type FaultProxy, isChunk, isUpload, startFaultProxy } from "./proxy.js";

let proxy: FaultProxy;
let bucket: string;
const FAST = { retry: { firstDelayMs: 5, maxDelayMs: 50, deadlineMs: 10_000 }, timeouts: { stallMs: 5_000 } };
const MiB = 1 << 20;

function store(options: GcsOptions): GcsStore {
  return new GcsStore(bucket, "resumable", undefined, new Storage({ apiEndpoint: proxy.url, projectId: "test-project" }), {
    ...FAST,
    ...options,
  });
}

/** `size` bytes of a fixed pattern, in pieces of 1 MiB (never in memory whole). */
async function* pattern(size: number): AsyncGenerator<Uint8Array> {
  const piece = new Uint8Array(MiB);
  for (let at = 0; at < size; at += MiB) {
    const n = Math.min(MiB, size - at);
    for (let i = 0; i < n; i++) piece[i] = ((at + i) * 31 + ((at + i) >>> 13)) & 0xff;
    yield piece.slice(0, n);
  }
}

async function crcOf(data: AsyncIterable<Uint8Array>): Promise<number> {
  let crc = 0;
  for await (const p of data) crc = crc32c(p, crc);
  return crc;
}

/** The n-th request (1-based) that `match` accepts. */
const nth = (n: number, match: (m: string, u: string) => boolean) => {
  let seen = 0;
  return (m: string, u: string) => match(m, u) && ++seen === n;
};

const sessions = (from: number) => proxy.log.slice(from).filter((r) => r.method === "POST" && /uploadType=resumable/.test(r.url)).length;

beforeAll(async () => {
  proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), seed: 1 });
  bucket = await newBucket("resumable");
});
afterAll(() => proxy.close());
afterEach(async () => {
  proxy.configure({ rules: [], rates: {} });
  await new Promise((r) => setTimeout(r, 50));
  expect(proxy.inFlight()).toBe(0);
});

describe("resumable uploads", () => {
  test("an object that fits in one chunk is one multipart request", async () => {
    const from = proxy.log.length;
    const w = await store({ chunkBytes: MiB }).write("small", pattern(MiB));
    expect(w.size).toBe(MiB);
    expect(proxy.log.slice(from).map((r) => r.method + (/uploadType=multipart/.test(r.url) ? " multipart" : ""))).toEqual([
      "POST multipart",
    ]);
  });

  test("a larger one is sent in chunks of the chunk size, each a multiple of 256 KiB but the last", async () => {
    const from = proxy.log.length;
    const size = 5 * MiB + 1000;
    const w = await store({ chunkBytes: 2 * MiB }).write("chunked", pattern(size));
    expect(w).toEqual({ size, crc32c: await crcOf(pattern(size)) });
    const ranges = proxy.log
      .slice(from)
      .filter((r) => isChunk(r.method, r.url))
      .map((r) => r.contentRange);
    expect(ranges).toEqual([`bytes 0-${2 * MiB - 1}/*`, `bytes ${2 * MiB}-${4 * MiB - 1}/*`, `bytes ${4 * MiB}-${size - 1}/${size}`]);
    expect((await store({}).stat("chunked"))?.crc32c).toBe(w.crc32c);
  });

  test("a reset in the middle of a 300 MB upload re-sends at most one chunk", async () => {
    const size = 300_000_000;
    const chunk = 32 * MiB;
    resetRetryStats();
    proxy.configure({ rules: [{ fault: "reset-mid-upload", match: nth(5, isChunk), times: 1 }] });
    const before = proxy.stats.uploadBytes;
    const from = proxy.log.length;
    // Clocks with room: fake-gcs-server hashes the whole object so far on every chunk (seconds for the last
    // ones when the machine is busy), and a chunk answered after the stall clock ran out is a second fault.
    const patient = { retry: { ...FAST.retry, deadlineMs: 100_000 }, timeouts: { stallMs: 60_000 } };
    const w = await store({ chunkBytes: chunk, ...patient }).write("large", pattern(size));
    expect(w).toEqual({ size, crc32c: await crcOf(pattern(size)) });
    expect(proxy.stats.faults["reset-mid-upload"]).toBe(1);
    expect(retryStats().retries).toBe(1);
    // Asked GCS what it had instead of starting over...
    expect(proxy.log.slice(from).some((r) => r.contentRange === "bytes */*")).toBe(true);
    expect(sessions(from)).toBe(1);
    // ...so the emulator received the object once, plus at most one chunk (and the session's metadata).
    const received = proxy.stats.uploadBytes - before;
    expect(received).toBeGreaterThan(size);
    expect(received - size).toBeLessThanOrEqual(chunk + 1024);
    const stored = await store({}).stat("large");
    expect(stored).toMatchObject({ size, crc32c: w.crc32c });
  }, 120_000);

  test("an object streamed from another GCS object goes chunk by chunk straight from its download; after a reset mid-chunk the source is re-read from the persisted offset", async () => {
    const size = 20 * MiB + 4321;
    const chunk = 2 * MiB;
    const s = store({ chunkBytes: chunk });
    await s.write("ranged-source", pattern(size));
    const crc = await crcOf(pattern(size));
    resetRetryStats();
    proxy.configure({ rules: [{ fault: "reset-mid-upload", match: nth(4, isChunk), times: 1 }] });
    const before = proxy.stats.uploadBytes;
    const from = proxy.log.length;
    const w = await s.write("ranged-copy", s.readStream("ranged-source", 0, size));
    expect(w).toEqual({ size, crc32c: crc });
    expect(retryStats().retries).toBe(1);
    expect(sessions(from)).toBe(1);
    const log = proxy.log.slice(from);
    // Every chunk says the size, known from the start.
    expect(
      log.filter((r) => isChunk(r.method, r.url) && r.contentRange !== undefined).every((r) => r.contentRange?.endsWith(`/${size}`)),
    ).toBe(true);
    // One download for the object, and one more from where the failed chunk began (at 6 MiB).
    expect(log.filter((r) => r.method === "GET" && /alt=media/.test(r.url)).map((r) => r.range)).toEqual([
      `bytes=0-${size - 1}`,
      `bytes=${6 * MiB}-${size - 1}`,
    ]);
    const received = proxy.stats.uploadBytes - before;
    expect(received - size).toBeLessThanOrEqual(chunk + 1024);
    expect(await s.stat("ranged-copy")).toMatchObject({ size, crc32c: crc });
  });

  test("a small object streamed from another GCS object is one simple (media) request, checked against the stored CRC-32C", async () => {
    const size = MiB + 7;
    const s = store({ chunkBytes: 2 * MiB });
    await s.write("ranged-small", pattern(size));
    const from = proxy.log.length;
    const w = await s.write("ranged-small-copy", s.readStream("ranged-small", 0, size));
    expect(w).toEqual({ size, crc32c: await crcOf(pattern(size)) });
    expect(
      proxy.log
        .slice(from)
        .filter((r) => isUpload(r.method, r.url))
        .map((r) => r.method + (/uploadType=media/.test(r.url) ? " media" : "")),
    ).toEqual(["POST media"]);
    expect((await s.stat("ranged-small-copy"))?.crc32c).toBe(w.crc32c);
  });

  test("at the default chunk, an object streamed from a ranged source is one request up to 32 MiB, where a stream that cannot be re-read goes in 8 MiB chunks", async () => {
    const size = 20 * MiB;
    const s = store({});
    await s.write("ranged-default", pattern(size));
    const uploads = (from: number) =>
      proxy.log
        .slice(from)
        .filter((r) => isUpload(r.method, r.url))
        .map((r) => (/uploadType=media/.test(r.url) ? "media" : isChunk(r.method, r.url) ? "chunk" : "session"));
    const from = proxy.log.length;
    await s.write("ranged-default-copy", s.readStream("ranged-default", 0, size));
    expect(uploads(from)).toEqual(["media"]);
    const again = proxy.log.length;
    await s.write("buffered-default-copy", pattern(size));
    expect(uploads(again)).toEqual(["session", "chunk", "chunk", "chunk"]);
    expect((await s.stat("ranged-default-copy"))?.crc32c).toBe((await s.stat("buffered-default-copy"))?.crc32c);
  });

  test("an upload session that expired (410) restarts the object from its first byte in a new session", async () => {
    const size = 3 * MiB;
    resetRetryStats();
    proxy.configure({ rules: [{ fault: "410", match: nth(2, isChunk), times: 1 }] });
    const from = proxy.log.length;
    const data = replayable(() => pattern(size));
    const w = await store({ chunkBytes: MiB }).write("expired", data);
    expect(w).toEqual({ size, crc32c: await crcOf(pattern(size)) });
    expect(sessions(from)).toBe(2);
    expect(retryStats().byKind).toEqual({ "http-410": 1 });
    expect((await store({}).stat("expired"))?.crc32c).toBe(w.crc32c);
  });

  test("a session that is gone (410) when its stream cannot be read again fails the write, naming the object", async () => {
    proxy.configure({ rules: [{ fault: "410", match: nth(1, isChunk), times: 1 }] });
    const e = await store({ chunkBytes: MiB })
      .write("gone", pattern(3 * MiB))
      .catch((x: unknown) => x);
    expect(e).toBeInstanceOf(StorageIoError);
    expect((e as Error).message).toMatch(
      /resumable\/gone: resumable upload failed and its source cannot be read again: .*session is gone \(410\)/,
    );
  });

  test("bytes in memory larger than a chunk are uploaded in chunks without a copy, and retried from memory", async () => {
    const data = new Uint8Array(3 * MiB + 5).map((_, i) => (i * 13) & 0xff);
    resetRetryStats();
    proxy.configure({ rules: [{ fault: "reset", match: nth(2, isUpload), times: 1 }] });
    const w = await store({ chunkBytes: MiB }).write("from-memory", data);
    expect(w).toEqual({ size: data.length, crc32c: crc32c(data) });
    expect(retryStats().retries).toBe(1);
    expect((await store({}).stat("from-memory"))?.crc32c).toBe(w.crc32c);
  });
});
