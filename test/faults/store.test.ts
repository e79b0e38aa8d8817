// GcsStore against fake-gcs-server behind the fault-injecting proxy: each kind of fault, on each kind of
// request, is survived by a retry (and counted), or, when it outlasts the deadline, ends in one error naming
// the object and the cause, with no request left open.
import { Storage } from "@google-cloud/storage";
import { afterAll, afterEach, beforeAll, describe, expect, inject, test } from "vitest";
import { FormatError, StorageIoError } from "../../src/errors.js";
import { type GcsOptions, GcsStore } from "../../src/store/gcs.js";
import { resetRetryStats, retryStats } from "../../src/store/retry.js";
import { newBucket } from "../helpers/gcs.js";
import { type FaultKind, type FaultProxy, isChunk, isDownload, isListing, isMetadata, isUpload, startFaultProxy } from "./proxy.js";

let proxy: FaultProxy;
let bucket: string;
const bytes = Uint8Array.from({ length: 64 << 10 }, (_, i) => (i * 7) & 0xff);
const FAST = { retry: { firstDelayMs: 5, maxDelayMs: 50, deadlineMs: 3_000 }, timeouts: { stallMs: 300 } };
const isStall = (f: FaultKind) => f === "stall" || f === "stall-headers";

/**
 * For what does not test the stall limit itself: one that a busy machine does not pass by chance. Under two
 * suites at once the proxy (in this process) and fake-gcs-server pause for more than 300 ms now and then, which
 * the short limit counts as a stall: one retry more than the test expects, or the stall named as the last cause
 * instead of the fault injected (seen in bash scripts/repeat-suites.sh, 2026-12-02).
 */
const PATIENT = { ...FAST, timeouts: { stallMs: 5_000 } };
function store(options: GcsOptions = PATIENT): GcsStore {
  return new GcsStore(bucket, "faults", undefined, new Storage({ apiEndpoint: proxy.url, projectId: "test-project" }), options);
}

const once = (fault: FaultKind, match: (m: string, u: string) => boolean, times = 1) =>
  proxy.configure({ rules: [{ fault, match, times }] });

async function drain(it: AsyncIterable<Uint8Array>): Promise<Buffer> {
  const pieces: Uint8Array[] = [];
  for await (const p of it) pieces.push(Buffer.from(p)); // a piece is valid until the next is asked for
  return Buffer.concat(pieces);
}

beforeAll(async () => {
  proxy = await startFaultProxy({ upstream: inject("gcsEndpoint"), seed: 1 });
  bucket = await newBucket("faults");
  await store().write("obj", bytes);
});
afterAll(() => proxy.close());
afterEach(async () => {
  proxy.configure({ rules: [], rates: {} });
  // Whatever happened, the store let go of every request it made.
  await new Promise((r) => setTimeout(r, 50));
  expect(proxy.inFlight()).toBe(0);
});

describe("transient faults are retried, for every kind of request", () => {
  const faults: FaultKind[] = ["503", "429", "reset", "reset-mid-body", "truncate", "stall", "stall-headers"];
  for (const fault of faults) {
    test(`${fault}: whole, ranged, head and streamed downloads, uploads, stats and listings all succeed, one retry each`, async () => {
      const s = store(isStall(fault) ? FAST : PATIENT);
      const cases: [string, (m: string, u: string) => boolean, () => Promise<void>][] = [
        ["read", isDownload, async () => expect(Buffer.from(await s.read("obj"))).toEqual(Buffer.from(bytes))],
        ["readRange", isDownload, async () => expect([...(await s.readRange("obj", 1000, 3))]).toEqual([...bytes.subarray(1000, 1003)])],
        ["readHead", isDownload, async () => expect((await s.readHead("obj", 3))?.bytes).toEqual(bytes.subarray(0, 3))],
        [
          "readStream",
          isDownload,
          async () => expect(await drain(s.readStream("obj", 10, 40_000))).toEqual(Buffer.from(bytes.subarray(10, 40_010))),
        ],
        ["write", isUpload, async () => expect((await s.write("w", bytes)).size).toBe(bytes.length)],
        ["stat", isMetadata, async () => expect((await s.stat("obj"))?.size).toBe(bytes.length)],
        ["list", isListing, async () => expect((await s.listDir("")).files.map((f) => f.key)).toContain("obj")],
      ];
      for (const [what, match, run] of cases) {
        resetRetryStats();
        once(fault, match);
        await run();
        expect(retryStats().retries, what).toBe(1);
      }
    });
  }

  test("a streamed download broken mid-body resumes from the first byte it had not delivered", async () => {
    once("reset-mid-body", isDownload);
    const from = proxy.log.length;
    expect(await drain(store().readStream("obj", 0, bytes.length))).toEqual(Buffer.from(bytes));
    const ranges = proxy.log.slice(from).map((r) => r.range);
    expect(ranges).toHaveLength(2);
    expect(ranges[0]).toBe(`bytes=0-${bytes.length - 1}`);
    const resumed = Number(/^bytes=(\d+)-/.exec(ranges[1] ?? "")?.[1]);
    expect(resumed).toBeGreaterThan(0);
    expect(ranges[1]).toBe(`bytes=${resumed}-${bytes.length - 1}`);
  });

  test("a body damaged on its way to GCS is refused for its CRC-32C and sent again", async () => {
    resetRetryStats();
    once("corrupt-upload", isUpload);
    const written = await store().write("corrupted-once", bytes);
    expect(retryStats().byKind).toEqual({ checksum: 1 });
    expect(Buffer.from(await store().read("corrupted-once"))).toEqual(Buffer.from(bytes));
    expect((await store().stat("corrupted-once"))?.crc32c).toBe(written.crc32c);
  });

  test("a whole download damaged on the way does not match the object's CRC-32C and is read again", async () => {
    resetRetryStats();
    once("corrupt-download", isDownload);
    expect(Buffer.from(await store().read("obj"))).toEqual(Buffer.from(bytes));
    expect(retryStats().byKind).toEqual({ checksum: 1 });
  });

  test("a large streamed upload carries no CRC up front but is checked against what GCS stored, and retried", async () => {
    const big = new Uint8Array(6 << 20).map((_, i) => i % 251);
    // Larger than a chunk: a resumable upload, of several requests (no stall counted on a busy machine).
    const s = store({ ...FAST, timeouts: { stallMs: 10_000 }, chunkBytes: 2 << 20 });
    await s.write("big-source", big);
    resetRetryStats();
    once("reset", isChunk);
    const w = await s.write("big-copy", s.readStream("big-source", 0, big.length));
    expect(w.size).toBe(big.length);
    expect(retryStats().retries).toBe(1);
    expect((await s.stat("big-copy"))?.crc32c).toBe(w.crc32c);
  });

  test("a conditional create whose answer was lost is recognised as ours, not as a lost race", async () => {
    once("reset-mid-body", isUpload);
    expect(await store().createExclusive("claim", new Uint8Array([1, 2, 3]))).toBe(true);
    expect(await store().createExclusive("claim", new Uint8Array([4]))).toBe(false);
  });
});

describe("faults that outlast the deadline", () => {
  const SHORT = { retry: { firstDelayMs: 5, maxDelayMs: 50, deadlineMs: 400 }, timeouts: { stallMs: 150 } };
  // The last attempt's cause is the one named: a pause of the busy machine must not be it (see PATIENT).
  const SHORT_PATIENT = { ...SHORT, timeouts: { stallMs: 2_000 } };
  const cases: [FaultKind, RegExp][] = [
    ["503", /HTTP 503/],
    ["429", /HTTP 429/],
    ["reset", /connection failed/],
    ["reset-mid-body", /connection failed|ended after/],
    ["truncate", /connection failed|ended after/],
    ["stall", /no progress for 0\.\d s/],
    ["stall-headers", /no progress for 0\.\d s/],
  ];
  for (const [fault, cause] of cases) {
    test(`${fault} on every request: each operation fails with one line naming the object and the cause`, async () => {
      proxy.configure({ rates: { [fault]: 1 } });
      const s = store(isStall(fault) ? SHORT : SHORT_PATIENT);
      const ops: [string, () => Promise<unknown>][] = [
        ["obj", () => s.read("obj")],
        ["obj", () => s.readRange("obj", 0, 10)],
        ["obj", () => drain(s.readStream("obj", 0, 1000))],
        ["new", () => s.write("new", bytes)],
        ["obj", () => s.stat("obj")],
      ];
      for (const [key, op] of ops) {
        const started = Date.now();
        const e = await op().then(
          () => undefined,
          (x: unknown) => x,
        );
        expect(e).toBeInstanceOf(StorageIoError);
        const message = (e as Error).message;
        expect(message).toContain(`gs://${bucket}/faults/${key}: `);
        expect(message).toMatch(/failed after \d+ attempts? in \d+\.\d s/);
        expect(message).toMatch(cause);
        expect(message).not.toContain("\n");
        expect((e as Error).stack).toBe(`StorageIoError: ${message}`);
        expect(Date.now() - started).toBeLessThan(3_000);
      }
    });
  }

  test("a missing object and a short object are answers, not faults: no retry", async () => {
    resetRetryStats();
    await expect(store().read("missing")).rejects.toThrow(/no such object/);
    await expect(store().readRange("obj", bytes.length - 2, 10)).rejects.toThrow(FormatError);
    expect(retryStats().retries).toBe(0);
  });
});
