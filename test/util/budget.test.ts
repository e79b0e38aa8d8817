import { describe, expect, test } from "vitest";
import { allInOrder, Budget, mapLimited } from "../../src/util/budget.js";

/** Whether `p` has resolved once pending callbacks have run. */
async function resolved(p: Promise<unknown>): Promise<boolean> {
  let done = false;
  void p.then(() => {
    done = true;
  });
  await new Promise((r) => setImmediate(r));
  return done;
}

describe("Budget", () => {
  test("an acquire within the capacity resolves at once", async () => {
    const b = new Budget(10);
    expect(await resolved(b.acquire(4))).toBe(true);
    expect(await resolved(b.acquire(6))).toBe(true);
  });

  test("the default weight is 1", async () => {
    const b = new Budget(2);
    await b.acquire();
    await b.acquire();
    expect(await resolved(b.acquire())).toBe(false);
  });

  test("an acquire past what is free waits until enough is released", async () => {
    const b = new Budget(10);
    const release = await b.acquire(7);
    const waiting = b.acquire(5);
    expect(await resolved(waiting)).toBe(false);
    release();
    expect(await resolved(waiting)).toBe(true);
  });

  test("a weight larger than the capacity is capped: it waits for the whole budget, then holds all of it", async () => {
    const b = new Budget(10);
    const small = await b.acquire(1);
    const huge = b.acquire(1000);
    expect(await resolved(huge)).toBe(false);
    small();
    expect(await resolved(huge)).toBe(true);
    expect(await resolved(b.acquire(1))).toBe(false);
  });

  test("a capped weight gives back only the capacity on release", async () => {
    const b = new Budget(10);
    (await b.acquire(1000))();
    await b.acquire(10);
    expect(await resolved(b.acquire(1))).toBe(false);
  });

  test("thousands of waiters, queued while others are served, are served in the order they came", async () => {
    const b = new Budget(1);
    const order: number[] = [];
    const all: Promise<void>[] = [];
    const queue = (i: number) =>
      all.push(
        b.acquire().then((release) => {
          order.push(i);
          if (i < 3000) queue(i + 5000); // joins the queue while its served prefix is being dropped
          release();
        }),
      );
    for (let i = 0; i < 5000; i++) queue(i);
    while (order.length < 8000) await Promise.all(all.slice());
    expect(order.slice(0, 5000)).toEqual(Array.from({ length: 5000 }, (_, i) => i));
    expect(order.slice(5000)).toEqual(Array.from({ length: 3000 }, (_, i) => i + 5000));
  });

  test("waiters are served first in, first out: a large head is not overtaken by smaller ones", async () => {
    const b = new Budget(10);
    const first = await b.acquire(6);
    const large = b.acquire(8);
    const small = b.acquire(1); // would fit now (4 free), but waits behind `large`
    expect(await resolved(large)).toBe(false);
    expect(await resolved(small)).toBe(false);
    first();
    expect(await resolved(large)).toBe(true);
    expect(await resolved(small)).toBe(true);
  });

  test("waiters resolve in the order they asked", async () => {
    const b = new Budget(1);
    const hold = await b.acquire(1);
    const order: number[] = [];
    const waiters = [1, 2, 3].map((i) =>
      b.acquire(1).then((release) => {
        order.push(i);
        return release;
      }),
    );
    hold();
    for (const w of waiters) (await w)();
    expect(order).toEqual([1, 2, 3]);
  });

  test("one release wakes every waiter that now fits", async () => {
    const b = new Budget(4);
    const hold = await b.acquire(4);
    const a = b.acquire(2);
    const c = b.acquire(2);
    hold();
    expect(await resolved(a)).toBe(true);
    expect(await resolved(c)).toBe(true);
  });

  test("releasing twice gives the units back once", async () => {
    const b = new Budget(2);
    const release = await b.acquire(2);
    release();
    release();
    await b.acquire(2);
    expect(await resolved(b.acquire(1))).toBe(false);
  });

  test("a zero or negative weight takes nothing", async () => {
    const b = new Budget(1);
    await b.acquire(0);
    await b.acquire(-5);
    expect(await resolved(b.acquire(1))).toBe(true);
  });

  test("a zero weight still queues behind earlier waiters", async () => {
    const b = new Budget(1);
    const hold = await b.acquire(1);
    const waiting = b.acquire(1);
    const zero = b.acquire(0);
    expect(await resolved(zero)).toBe(false);
    hold();
    expect(await resolved(waiting)).toBe(true);
    expect(await resolved(zero)).toBe(true);
  });
});

describe("mapLimited", () => {
  test("runs at most `limit` calls at once and gives the results in the order of the items", async () => {
    let running = 0;
    let most = 0;
    const out = await mapLimited([5, 1, 4, 2, 3], 2, async (x, i) => {
      most = Math.max(most, ++running);
      await new Promise((r) => setTimeout(r, x));
      running--;
      return x * 10 + i;
    });
    expect(out).toEqual([50, 11, 42, 23, 34]);
    expect(most).toBe(2);
  });

  test("rejects with the first failure and starts nothing after it", async () => {
    const started: number[] = [];
    const run = mapLimited([0, 1, 2, 3, 4, 5], 2, async (x) => {
      started.push(x);
      await new Promise((r) => setImmediate(r));
      if (x === 1) throw new Error("item 1");
      return x;
    });
    await expect(run).rejects.toThrow("item 1");
    await new Promise((r) => setTimeout(r, 10));
    expect(started).toEqual([0, 1, 2]);
  });
});

describe("allInOrder", () => {
  test("gives every value in the order given", async () => {
    expect(await allInOrder<[number, string, boolean]>([Promise.resolve(1), "two", Promise.resolve(true)])).toEqual([1, "two", true]);
  });

  test("throws the first failure in the order given, not the first in time, once all have settled", async () => {
    let lastSettled = false;
    const late = new Promise<never>((_, fail) => setTimeout(() => fail(new Error("first given, last to fail")), 30));
    const early = Promise.reject(new Error("second given, first to fail"));
    const slow = new Promise<number>((done) =>
      setTimeout(() => {
        lastSettled = true;
        done(3);
      }, 60),
    );
    await expect(allInOrder<[never, never, number]>([late, early, slow])).rejects.toThrow("first given, last to fail");
    expect(lastSettled).toBe(true);
  });
});
