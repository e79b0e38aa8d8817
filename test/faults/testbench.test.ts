// The real executable, gs:// to gs://, on Google's storage-testbench, with the testbench itself injecting
// faults into a seeded 7% of requests (test/faults/instructions.ts): ten conversions of a ~28 MB fuji-shaped
// step whose largest chunks are 6 MiB, so streamed uploads too (bench/gen_fuji.py, scaled down), all succeed,
// say how many retries they needed, and verify, reading through the same faults.
import { spawnSync } from "node:child_process";
import { Storage } from "@google-cloud/storage";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { GcsStore } from "../../src/store/gcs.js";
import { resetRetryStats, retryStats } from "../../src/store/retry.js";
import { runBinAsync } from "../helpers/cli.js";
import { uploadDir } from "../helpers/gcs.js";
import { PYTHON } from "../helpers/paths.js";
import { newTestbenchBucket, testbenchEndpoint, testbenchMissing, testbenchStorage } from "../helpers/testbench.js";
import { type InstructionProxy, startInstructionProxy } from "./instructions.js";

const STEP_DIR = "test/.generated/fuji-small";
const DIMS = "dim=512,layers=1,heads=2,head_dim=128,ffn=256,vocab=3072";
const STEP = "ckpt/step_00001000";
const RATE = 0.07;
/** Short timeouts, so that a stall costs a second, not half a minute. */
const FAST_ENV = { ORBAX2REG_GCS_STALL_MS: "1000", ORBAX2REG_GCS_RETRY_DEADLINE_MS: "60000" };
const missing = testbenchMissing();

describe.skipIf(missing !== undefined)("convert through the storage-testbench's own faults", () => {
  let src: string;
  let dst: string;
  const rows: string[] = [];

  beforeAll(async () => {
    // Cached: a rerun with the same dimensions does nothing.
    const gen = spawnSync(PYTHON, ["bench/gen_fuji.py", STEP_DIR, "--dims", DIMS], { encoding: "utf8" });
    if (gen.status !== 0) throw new Error(`bench/gen_fuji.py failed: ${gen.stderr}`);
    src = await newTestbenchBucket("src");
    dst = await newTestbenchBucket("dst");
    await uploadDir(`${STEP_DIR}/${STEP}`, src, STEP, undefined, testbenchStorage());
  }, 300_000);
  afterAll(() => {
    if (rows.length > 0) process.stderr.write(`storage-testbench, ${RATE * 100}% of requests instructed:\n${rows.join("\n")}\n`);
  });

  for (let seed = 1; seed <= 10; seed++) {
    test(`seed ${seed}: the conversion survives, reports its retries, and verifies`, async () => {
      const proxy: InstructionProxy = await startInstructionProxy({
        upstream: testbenchEndpoint() as string,
        seed,
        rate: RATE,
        instructChunks: true,
      });
      try {
        const env = { ORBAX2REG_GCS_ENDPOINT: proxy.url, ...FAST_ENV };
        const out = `gs://${dst}/seed-${seed}`;
        const convert = await runBinAsync(["convert", `gs://${src}/${STEP}`, out, "--json"], env);
        expect(convert.stderr).not.toMatch(/error/i);
        expect(convert.code, convert.stderr).toBe(0);
        const report = JSON.parse(convert.stdout) as { committed: boolean; storageRetries: number; storageRetriesByKind: object };
        expect(report).toMatchObject({ step: 1000, committed: true, storageRetries: expect.any(Number) });
        const verify = await runBinAsync(["verify", `gs://${src}/${STEP}`, `${out}/step_00001000`], env);
        expect(verify.stdout).toMatch(/ 0 failed/);
        expect(verify.code, verify.stderr).toBe(0);
        rows.push(
          `  seed ${seed}: ${proxy.stats.requests} requests, instructed ${JSON.stringify(proxy.stats.instructed)}; ` +
            `convert retried ${report.storageRetries} ${JSON.stringify(report.storageRetriesByKind)}`,
        );
      } finally {
        await proxy.close();
        // The testbench holds every object in memory: drop this run's copy.
        await testbenchStorage()
          .bucket(dst)
          .deleteFiles({ prefix: `seed-${seed}/` });
      }
    }, 180_000);
  }
});

// Faults the testbench answers otherwise than fake-gcs-server: each once made GcsStore fail with a TypeError.
describe.skipIf(missing !== undefined)("GcsStore on the testbench's own faults", () => {
  let bucket: string;
  let proxy: InstructionProxy | undefined;
  const FAST = { retry: { firstDelayMs: 5, maxDelayMs: 50, deadlineMs: 5_000 }, timeouts: { stallMs: 1_000 } };
  const through = async (o: { only: string[]; rawErrors?: boolean }) => {
    proxy = await startInstructionProxy({ upstream: testbenchEndpoint() as string, seed: 1, rate: 1, limit: 1, ...o });
    return new GcsStore(bucket, "gaps", undefined, new Storage({ apiEndpoint: proxy.url, projectId: "test-project" }), FAST);
  };
  beforeAll(async () => {
    bucket = await newTestbenchBucket("gaps");
  });
  afterAll(() => proxy?.close());

  test("a 503 whose error body nests an object in error.message is retried", async () => {
    const s = await through({ only: ["return-503"], rawErrors: true });
    resetRetryStats();
    expect(await s.stat("nothing")).toBeUndefined();
    expect(retryStats().byKind).toEqual({ "http-503": 1 });
  });

  test("an upload damaged on its way is refused for its CRC-32C (412 from the testbench, 400 from GCS) and sent again", async () => {
    const s = await through({ only: ["inject-upload-data-error"] });
    resetRetryStats();
    const data = new Uint8Array(100_000).map((_, i) => i % 251);
    expect((await s.write("damaged-once", data)).size).toBe(data.length);
    expect(retryStats().byKind).toEqual({ checksum: 1 });
    expect(Buffer.from(await s.read("damaged-once")).equals(data)).toBe(true);
  });
});

// Resumable uploads as Google's own emulator implements them: a chunk that fails part-way is resumed from the
// offset the testbench says it persisted (Content-Range: bytes */*), in the same session, not started over.
describe.skipIf(missing !== undefined)("resumable uploads on the testbench", () => {
  const MiB = 1 << 20;
  const SIZE = 24 * MiB + 12_345;
  const CHUNK = 2 * MiB;
  let bucket: string;
  let proxy: InstructionProxy | undefined;
  beforeAll(async () => {
    bucket = await newTestbenchBucket("resumable");
  });
  afterAll(() => proxy?.close());

  /** `size` bytes of a fixed pattern, in pieces of 1 MiB (never in memory whole). */
  async function* pattern(size: number): AsyncGenerator<Uint8Array> {
    for (let at = 0; at < size; at += MiB) {
      const piece = new Uint8Array(Math.min(MiB, size - at));
      for (let i = 0; i < piece.length; i++) piece[i] = ((at + i) * 31 + ((at + i) >>> 13)) & 0xff;
      yield piece;
    }
  }
  const expected = async () => {
    let crc = 0;
    for await (const p of pattern(SIZE)) crc = crc32c(p, crc);
    return crc;
  };

  // The fourth upload request: the session's POST, then the third chunk (at 4 MiB) of a 24 MiB object, streamed
  // from a generator (held one chunk at a time) or from another object's download (re-read from the offset).
  test.each([
    ["return-503-after-256K", "http-503", "a stream"],
    ["return-reset-connection", "reset", "a stream"],
    ["return-503-after-256K", "http-503", "another object's download"],
    ["return-reset-connection", "reset", "another object's download"],
  ])(
    "a chunk failed mid-upload by %s (a %s) resumes from the persisted offset, re-sending at most that chunk, streamed from %s",
    async (instruction, kind, from) => {
      await proxy?.close();
      proxy = await startInstructionProxy({
        upstream: testbenchEndpoint() as string,
        seed: 1,
        rate: 1,
        limit: 1,
        skip: 3,
        only: [instruction],
        instructChunks: true,
      });
      const s = new GcsStore(bucket, "up", undefined, new Storage({ apiEndpoint: proxy.url, projectId: "test-project" }), {
        retry: { firstDelayMs: 5, maxDelayMs: 50, deadlineMs: 20_000 },
        timeouts: { stallMs: 5_000 },
        chunkBytes: CHUNK,
      });
      const ranged = from !== "a stream";
      const name = `${instruction}${ranged ? "-ranged" : ""}`;
      if (ranged) await new GcsStore(bucket, "up", undefined, testbenchStorage()).write("source", pattern(SIZE));
      resetRetryStats();
      const before = proxy.stats.uploadBytes;
      const w = await s.write(name, ranged ? s.readStream("source", 0, SIZE) : pattern(SIZE));
      const crc = await expected();
      expect(w).toEqual({ size: SIZE, crc32c: crc });
      expect(proxy.stats.instructed).toEqual({ [instruction]: 1 });
      expect(retryStats().byKind).toEqual({ [kind]: 1 });
      // The object once, plus at most the failed chunk (and the session's few bytes of metadata).
      const received = proxy.stats.uploadBytes - before;
      expect(received).toBeGreaterThanOrEqual(SIZE);
      expect(received - SIZE).toBeLessThanOrEqual(CHUNK + 1024);
      expect(await s.stat(name)).toMatchObject({ size: SIZE, crc32c: crc });
      const back = await s.read(name);
      let at = 0;
      for await (const p of pattern(SIZE)) {
        expect(Buffer.from(back.subarray(at, at + p.length)).equals(p)).toBe(true);
        at += p.length;
      }
    },
    120_000,
  );
});

// Where it is missing, one skipped test says why (npm test lists it); where it is there, nothing.
if (missing !== undefined) test.skip(missing, () => {});
