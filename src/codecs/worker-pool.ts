import { createRequire } from "node:module";
import { type ResourceLimits, type Transferable, Worker } from "node:worker_threads";

/**
 * Worker threads that run zstd-napi, answering requests one message each: the set-up zstd-pool.ts (compression)
 * and zstd-decode-pool.ts (decoding) share around their own dispatch. A worker's code is CommonJS evaluated as is
 * (no file to find, the same from the sources under test and from dist/), with zstd-napi's binding to require as
 * `workerData.binding`. A request goes to the least busy worker, into a slot of its own there (the slot is the
 * request's name: the worker gets it as `slot` and answers with it). A worker that errors or exits (other than by
 * close) fails every request pending, queued or sent, and every request after.
 */

export interface WorkerPoolOptions {
  /** The worker's CommonJS: it answers each message `{ slot, ... }` with one message `{ slot, ... }`. */
  readonly code: string;
  /** How many workers; 0 none. */
  readonly threads: number;
  /** Worker `i`'s workerData, to which the pool adds `binding` (zstd-napi's, for the code to require). */
  readonly workerData: (i: number) => Record<string, unknown>;
  readonly resourceLimits?: ResourceLimits;
  /** The requests a worker holds at once (its slots, 0 to slots - 1), more waiting oldest first; else unbounded. */
  readonly slots?: number;
  /**
   * Idle workers do not keep the process alive (a pool nobody closes lets it end): a worker is referenced only
   * while it holds a request.
   */
  readonly unrefIdle?: boolean;
}

/** Where a request ran: its worker (an index below `threads`) and its slot there. */
export interface Place {
  readonly worker: number;
  readonly slot: number;
}

interface Request<A> {
  readonly message: Record<string, unknown>;
  readonly transfer: readonly Transferable[];
  /** Settles the request's promise with the worker's answer. */
  readonly answer: (answer: A, place: Place) => void;
  readonly reject: (e: Error) => void;
}

interface Thread<A> {
  readonly worker: Worker;
  /** Slots answered, to reuse (an unbounded pool adds a slot when none is). */
  readonly free: number[];
  /** The request each slot holds. */
  readonly requests: (Request<A> | undefined)[];
  busy: number;
}

/** A pool of workers answering with messages of type `A` (plus their `slot`). */
export class WorkerPool<A> {
  private readonly workers: Thread<A>[] = [];
  /** Requests waiting for a slot, oldest first. */
  private readonly queue: Request<A>[] = [];
  private readonly slots: number;
  private failed: Error | undefined;
  private closing = false;

  constructor(private readonly options: WorkerPoolOptions) {
    this.slots = options.slots ?? Number.POSITIVE_INFINITY;
    const binding = createRequire(import.meta.url).resolve("zstd-napi/binding.js");
    for (let i = 0; i < options.threads; i++) {
      const worker = new Worker(options.code, {
        eval: true,
        workerData: { ...options.workerData(i), binding },
        ...(options.resourceLimits === undefined ? {} : { resourceLimits: options.resourceLimits }),
      });
      if (options.unrefIdle) worker.unref();
      const free = options.slots === undefined ? [] : Array.from({ length: options.slots }, (_, k) => k);
      const thread: Thread<A> = { worker, free, requests: free.map(() => undefined), busy: 0 };
      worker.on("message", (m: A & { slot: number }) => this.done(thread, i, m));
      worker.on("error", (e) => this.fail(e));
      worker.on("exit", (code) => {
        if (!this.closing) this.fail(new Error(`a zstd worker thread exited with code ${code}`));
      });
      this.workers.push(thread);
    }
  }

  /** The workers running: 0 for a pool of none, and once closed. */
  get threads(): number {
    return this.workers.length;
  }

  /** What failed the pool (a worker's error or exit), if anything did. */
  get failure(): Error | undefined {
    return this.failed;
  }

  /**
   * `message` posted to a worker (with `transfer` transferred) and the answer given to `receive`, whose value or
   * throw settles the promise. `receive` runs as the answer arrives, before its slot is reused: what the worker
   * left in the slot's memory is still there.
   */
  request<T>(message: Record<string, unknown>, transfer: readonly Transferable[], receive: (answer: A, place: Place) => T): Promise<T> {
    if (this.failed !== undefined) return Promise.reject(this.failed);
    return new Promise<T>((resolve, reject) => {
      const answer = (a: A, place: Place) => {
        try {
          resolve(receive(a, place));
        } catch (e) {
          reject(e as Error);
        }
      };
      this.queue.push({ message, transfer, answer, reject });
      this.dispatch();
    });
  }

  /** Hands queued requests to free slots, the least busy worker first. */
  private dispatch(): void {
    while (this.queue.length > 0) {
      let thread: Thread<A> | undefined;
      for (const t of this.workers) if (thread === undefined || t.busy < thread.busy) thread = t;
      if (thread === undefined || thread.busy >= this.slots) return;
      const request = this.queue.shift() as Request<A>;
      const slot = thread.free.pop() ?? thread.requests.push(undefined) - 1;
      thread.requests[slot] = request;
      if (++thread.busy === 1 && this.options.unrefIdle) thread.worker.ref();
      thread.worker.postMessage({ ...request.message, slot }, request.transfer);
    }
  }

  private done(thread: Thread<A>, worker: number, m: A & { slot: number }): void {
    const request = thread.requests[m.slot];
    thread.requests[m.slot] = undefined;
    // A request failed already (its slot stays taken: the pool takes no more).
    if (request === undefined) return;
    request.answer(m, { worker, slot: m.slot });
    thread.free.push(m.slot);
    if (--thread.busy === 0 && this.options.unrefIdle) thread.worker.unref();
    this.dispatch();
  }

  private fail(e: Error): void {
    this.failed ??= e;
    for (const t of this.workers)
      for (const [k, request] of t.requests.entries()) {
        request?.reject(e);
        t.requests[k] = undefined;
      }
    for (const request of this.queue.splice(0)) request.reject(e);
  }

  async close(): Promise<void> {
    this.closing = true;
    await Promise.all(this.workers.map((t) => t.worker.terminate()));
    this.workers.length = 0;
  }
}
