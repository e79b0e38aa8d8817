import { afterEach, describe, expect, it } from "vitest";
import { FormatError, StorageIoError } from "../../src/errors.js";
import { AGAIN, resetRetryStats, retrying, retryingStream, retryStats, TransientError, transientStatus } from "../../src/store/retry.js";

const quick = { firstDelayMs: 1, maxDelayMs: 1, deadlineMs: 60_000 };
const PATH = "gs://b/p/key";

describe("retrying, the one retry loop", () => {
  afterEach(() => resetRetryStats());

  it("returns what the first attempt that succeeds returns, counting each failure before it by kind", async () => {
    let calls = 0;
    const out = await retrying("download", PATH, quick, async () => {
      if (++calls < 3) throw new TransientError("HTTP 503", "http-503");
      return "bytes";
    });
    expect([out, calls]).toEqual(["bytes", 3]);
    expect(retryStats()).toEqual({ retries: 2, byKind: { "http-503": 2 }, gaveUp: 0 });
  });

  it("throws a failure that is not transient as it is, without trying again", async () => {
    let calls = 0;
    const refused = new FormatError("short read", { path: PATH });
    const attempt = async () => {
      calls++;
      throw refused;
    };
    await expect(retrying("download", PATH, quick, attempt)).rejects.toBe(refused);
    expect(calls).toBe(1);
  });

  it("gives up past the deadline with a StorageIoError naming the operation, the object and the last cause", async () => {
    const attempt = async (): Promise<never> => {
      throw new TransientError("connection failed: ECONNRESET", "reset");
    };
    const failed = retrying("listing", PATH, { ...quick, deadlineMs: 0 }, attempt);
    await expect(failed).rejects.toBeInstanceOf(StorageIoError);
    await expect(failed).rejects.toThrow(/^gs:\/\/b\/p\/key: listing failed after 1 attempt in [\d.]+ s: connection failed: ECONNRESET$/);
    expect(retryStats().gaveUp).toBe(1);
  });

  it("runs an attempt that returns AGAIN once more at once, counting no failure", async () => {
    let calls = 0;
    const out = await retrying("resumable upload", PATH, quick, async () => (++calls < 3 ? AGAIN : calls));
    expect(out).toBe(3);
    expect(retryStats().retries).toBe(0);
  });

  it("after progress, an operation counts as not retried again (its deadline starts afresh)", async () => {
    const seen: boolean[] = [];
    await retrying("resumable upload", PATH, quick, async (r) => {
      seen.push(r.retried);
      if (seen.length === 1) throw new TransientError("HTTP 503", "http-503");
      if (seen.length === 2) {
        r.progressed();
        return AGAIN;
      }
      return undefined;
    });
    expect(seen).toEqual([false, true, false]);
  });
});

describe("retryingStream", () => {
  afterEach(() => resetRetryStats());

  it("passes each attempt's pieces on and retries a failed attempt, which goes on where the last one stopped", async () => {
    const pieces = ["a", "b", "c"];
    let done = 0;
    let failures = 0;
    const out: string[] = [];
    for await (const p of retryingStream("streamed download", PATH, quick, async function* () {
      while (done < pieces.length) {
        if (done === 1 && failures++ === 0) throw new TransientError("connection failed: ECONNRESET", "reset");
        yield pieces[done++] as string;
      }
    })) {
      out.push(p);
    }
    expect(out).toEqual(pieces);
    expect(retryStats().byKind).toEqual({ reset: 1 });
  });
});

describe("transientStatus, the one table of HTTP statuses worth another attempt", () => {
  it("holds 408, 429 and every 5xx, and no other status from 100 to 599", () => {
    const transient: number[] = [];
    for (let status = 100; status < 600; status++) if (transientStatus(status)) transient.push(status);
    expect(transient).toEqual([408, 429, ...Array.from({ length: 100 }, (_, i) => 500 + i)]);
  });
});
