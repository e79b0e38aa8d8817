/**
 * A FIFO counting semaphore with weights: `acquire(n)` waits until `n` units are free. Used for both the
 * number of objects in flight (weight 1) and the bytes buffered in memory (weight = bytes).
 * (async-mutex's weighted Semaphore walks every unit of capacity on each release: with a capacity in
 * bytes that is hundreds of millions of steps per object.)
 */
export class Budget {
  private available: number;
  /**
   * Waiters from `head` on: a queue that advances an index instead of shifting, since a caller may queue
   * one waiter per object (hundreds of thousands) and each shift of an array that long copies the rest.
   */
  private waiters: { weight: number; resolve: () => void }[] = [];
  private head = 0;

  constructor(readonly capacity: number) {
    this.available = capacity;
  }

  /** Resolves to a release function once `weight` units (capped at the capacity) are reserved. */
  async acquire(weight = 1): Promise<() => void> {
    const w = Math.min(Math.max(weight, 0), this.capacity);
    if (this.head === this.waiters.length && w <= this.available) this.available -= w;
    else await new Promise<void>((resolve) => this.waiters.push({ weight: w, resolve }));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      this.available += w;
      this.wake();
    };
  }

  private wake(): void {
    // Strict FIFO: a large request at the head is not starved by smaller ones behind it.
    while (this.head < this.waiters.length && (this.waiters[this.head] as { weight: number }).weight <= this.available) {
      const next = this.waiters[this.head] as { weight: number; resolve: () => void };
      this.waiters[this.head++] = undefined as never; // let the resolved waiter go
      this.available -= next.weight;
      next.resolve();
    }
    // Drop the served prefix once it is most of the array: amortized constant time per waiter.
    if (this.head === this.waiters.length) {
      this.waiters = [];
      this.head = 0;
    } else if (this.head > 1024 && this.head * 2 > this.waiters.length) {
      this.waiters = this.waiters.slice(this.head);
      this.head = 0;
    }
  }
}

/**
 * `fn` over every item, at most `limit` running at once (started in order), results in the order of `items`.
 * `limit` workers take the items in turn: memory for the results and `limit` calls, not a promise and a
 * queued waiter per item (a caller may pass every object of a step). Rejects with the first failure, and
 * starts nothing more after it.
 */
export function mapLimited<T, R>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<R>): Promise<R[]> {
  const results: R[] = new Array(items.length);
  let next = 0;
  let failed = false;
  const worker = async (): Promise<void> => {
    while (!failed && next < items.length) {
      const index = next++;
      try {
        results[index] = await fn(items[index] as T, index);
      } catch (e) {
        failed = true;
        throw e;
      }
    }
  };
  const workers = Array.from({ length: Math.min(Math.max(limit, 1), items.length) }, worker);
  return Promise.all(workers).then(() => results);
}

/**
 * `fn` over every item, at most `limit` running at once, in order; memory for `limit` calls, not for every
 * item (mapLimited holds a promise per item). Stops starting new calls after the first failure, which it
 * rethrows once the running ones have ended.
 */
export async function forEachLimited<T>(items: readonly T[], limit: number, fn: (item: T, index: number) => Promise<void>): Promise<void> {
  let next = 0;
  let failed = false;
  const worker = async (): Promise<void> => {
    while (!failed && next < items.length) {
      const index = next++;
      try {
        await fn(items[index] as T, index);
      } catch (e) {
        failed = true;
        throw e;
      }
    }
  };
  await allInOrder<unknown[]>(Array.from({ length: Math.min(limit, items.length) }, worker));
}

/**
 * Promise.all that waits for every one to settle and, if any failed, throws the first failure in the order
 * given (not in time): reads made together fail as they would have one after another.
 */
export async function allInOrder<T extends readonly unknown[]>(values: { readonly [K in keyof T]: T[K] | Promise<T[K]> }): Promise<T> {
  const settled = await Promise.allSettled(values as readonly unknown[]);
  for (const s of settled) if (s.status === "rejected") throw s.reason;
  return settled.map((s) => (s as PromiseFulfilledResult<unknown>).value) as unknown as T;
}
