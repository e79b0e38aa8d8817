import { describe, expect, it } from "vitest";
import { WorkerPool } from "../../src/codecs/worker-pool.js";

// What the zstd pools' own tests do not reach: the pool's dispatch, its failure when a worker dies, and close.

/**
 * A worker answering `{ value }` with its workerData's `name`, holding `hold` requests unanswered, and dying as
 * asked (`exit` with that code, `throw` that message uncaught).
 */
const CODE = `
const { parentPort, workerData } = require("node:worker_threads");
require(workerData.binding);
parentPort.on("message", (m) => {
  if (m.exit !== undefined) process.exit(m.exit);
  if (m.throw !== undefined) throw new Error(m.throw);
  if (!m.hold) parentPort.postMessage({ slot: m.slot, value: m.value, name: workerData.name });
});
`;

interface Answer {
  readonly value: unknown;
  readonly name: string;
}

function pool(threads: number, slots?: number): WorkerPool<Answer> {
  return new WorkerPool<Answer>({ code: CODE, threads, workerData: (i) => ({ name: `w${i}` }), ...(slots === undefined ? {} : { slots }) });
}

/** A request's answer and where it ran. */
function ask(p: WorkerPool<Answer>, message: Record<string, unknown>) {
  return p.request(message, [], (answer, place) => ({ ...place, value: answer.value, name: answer.name }));
}

describe("WorkerPool: zstd-napi worker threads answering requests", () => {
  it("gives each worker its own workerData and zstd-napi's binding to require", async () => {
    const p = pool(2);
    try {
      const got = await Promise.all([ask(p, { value: 1 }), ask(p, { value: 2 })]);
      expect(got.map((g) => [g.worker, g.name, g.value])).toEqual([
        [0, "w0", 1],
        [1, "w1", 2],
      ]);
    } finally {
      await p.close();
    }
  });

  it("sends each request to the least busy worker, the first of those tied", async () => {
    const p = pool(2);
    try {
      void ask(p, { hold: true });
      const got = await Promise.all([ask(p, {}), ask(p, {}), ask(p, {})]);
      expect(got.map((g) => g.worker)).toEqual([1, 0, 1]);
    } finally {
      await p.close();
    }
  });

  it("a worker that exits fails every request pending, sent or queued, with its exit code", async () => {
    const p = pool(1, 3);
    try {
      const pending = [ask(p, { hold: true }), ask(p, { hold: true }), ask(p, { exit: 3 }), ask(p, { value: 4 })];
      const settled = await Promise.allSettled(pending);
      expect(settled.map((s) => s.status === "rejected" && (s.reason as Error).message)).toEqual(
        Array(4).fill("a zstd worker thread exited with code 3"),
      );
    } finally {
      await p.close();
    }
  });

  it("a worker's uncaught error fails every request pending with that error", async () => {
    const p = pool(1);
    try {
      const held = ask(p, { hold: true });
      const thrown = ask(p, { throw: "boom" });
      await expect(held).rejects.toThrow(/^boom$/);
      await expect(thrown).rejects.toThrow(/^boom$/);
    } finally {
      await p.close();
    }
  });

  it("once failed, fails every later request with the first failure", async () => {
    const p = pool(2);
    try {
      await expect(ask(p, { exit: 5 })).rejects.toThrow("exited with code 5");
      expect(p.failure?.message).toBe("a zstd worker thread exited with code 5");
      await expect(ask(p, { value: 1 })).rejects.toBe(p.failure);
    } finally {
      await p.close();
    }
  });

  it("closing is no failure: its workers' exits fail nothing", async () => {
    const p = pool(2);
    await p.close();
    expect(p.failure).toBeUndefined();
  });

  it("closes twice without complaint, leaving no workers", async () => {
    const p = pool(2);
    await Promise.all([p.close(), p.close()]);
    await p.close();
    expect(p.threads).toBe(0);
  });
});
