// One retry policy for every storage request. Google's retry strategy
// (https://cloud.google.com/storage/docs/retry-strategy): retry HTTP 408, 429 and 5xx, socket timeouts and
// TCP disconnects, with truncated exponential backoff and jitter, and only idempotent requests (every write
// here is: same name, same bytes; conditional writes check what a lost answer left, see gcs.ts).
import { StorageIoError, TransientError } from "../errors.js";

// Where the stores take it from (the class itself is in src/errors.ts, with every other).
export { TransientError };

/**
 * Whether an HTTP status is worth another attempt: 408 (request timeout), 429 (rate limited) and every 5xx, as
 * Google's retry strategy says; any other status is the server's final word on the request. The one table:
 * http.ts classifies every storage answer by it, and the cloud commands every refused API call a workflow saw.
 */
export function transientStatus(status: number): boolean {
  return status === 408 || status === 429 || status >= 500;
}

export interface RetryPolicy {
  /**
   * Backoff before the first retry; it doubles on each further one... Short, because most faults are one
   * request's bad luck and the conversion waits on the retry; doubling backs off from a real overload.
   */
  readonly firstDelayMs: number;
  /** ...up to this. */
  readonly maxDelayMs: number;
  /** No retry starts later than this after the operation's first attempt. */
  readonly deadlineMs: number;
}

const envMs = (name: string, fallback: number): number => {
  const v = process.env[name];
  return v !== undefined && /^\d+$/.test(v) ? Number(v) : fallback;
};

/** The defaults; ORBAX2REG_GCS_RETRY_DEADLINE_MS shortens the deadline (the tests do). */
export function defaultRetryPolicy(): RetryPolicy {
  return { firstDelayMs: 25, maxDelayMs: 8_000, deadlineMs: envMs("ORBAX2REG_GCS_RETRY_DEADLINE_MS", 120_000) };
}

export interface RetryStats {
  /** Retries made (attempts after a first one), by every store in this process. */
  retries: number;
  /** The same, by the kind of failure retried: http-503, http-429, reset, timeout, short-body, checksum... */
  byKind: Record<string, number>;
  /** Operations that failed after retrying until the deadline. */
  gaveUp: number;
}

const stats: RetryStats = { retries: 0, byKind: {}, gaveUp: 0 };

/** A copy of the process-wide retry counters (for --json summaries and job logs). */
export function retryStats(): RetryStats {
  return { retries: stats.retries, byKind: { ...stats.byKind }, gaveUp: stats.gaveUp };
}

export function resetRetryStats(): void {
  stats.retries = 0;
  stats.byKind = {};
  stats.gaveUp = 0;
}

/** One failed attempt that is about to be retried. */
export interface RetryNotice {
  /** What was attempted ("upload", "listing", ...) and on which object. */
  readonly what: string;
  readonly path: string;
  /** The failure's kind (as in RetryStats.byKind) and message. */
  readonly kind: string;
  readonly message: string;
  /** Which retry this is for the operation (1 after its first failure). */
  readonly retry: number;
  /** The wait before it, and how long the operation keeps retrying in all (the policy's deadline). */
  readonly delayMs: number;
  readonly deadlineMs: number;
}

const observers = new Set<(n: RetryNotice) => void>();

/**
 * Calls `observer` on every retry in this process (the jobs log the first at once: retries are otherwise
 * silent until the deadline, minutes later). Returns the function that stops it.
 */
export function observeRetries(observer: (n: RetryNotice) => void): () => void {
  observers.add(observer);
  return () => observers.delete(observer);
}

/**
 * The attempts of one operation. Usage: `for (const r = new Attempts(...); ; ) try { ...; return } catch (e)
 * { await r.failed(e) }`. failed() rethrows what is not transient, gives up with a StorageIoError naming the
 * object once the deadline would pass, and otherwise waits out the backoff.
 */
export class Attempts {
  private started = Date.now();
  private retries = 0;

  constructor(
    private readonly what: string,
    private readonly path: string,
    private readonly policy: RetryPolicy = defaultRetryPolicy(),
  ) {}

  async failed(e: unknown): Promise<void> {
    if (!(e instanceof TransientError)) throw e;
    // Equal jitter: half the exponential step, plus up to as much again at random, so that the many
    // requests one overloaded server refused do not all come back at the same moment.
    const step = Math.min(this.policy.maxDelayMs, this.policy.firstDelayMs * 2 ** this.retries);
    const delay = Math.max(e.retryAfterMs ?? 0, step / 2 + (Math.random() * step) / 2);
    const elapsed = Date.now() - this.started;
    if (elapsed + delay > this.policy.deadlineMs) {
      stats.gaveUp++;
      const attempts = this.retries + 1;
      throw new StorageIoError(
        `${this.what} failed after ${attempts} attempt${attempts === 1 ? "" : "s"} in ${(elapsed / 1000).toFixed(1)} s: ${e.message}`,
        { path: this.path },
      );
    }
    this.retries++;
    stats.retries++;
    stats.byKind[e.retryKind] = (stats.byKind[e.retryKind] ?? 0) + 1;
    const notice = {
      what: this.what,
      path: this.path,
      kind: e.retryKind,
      message: e.message,
      retry: this.retries,
      delayMs: Math.round(delay),
      deadlineMs: this.policy.deadlineMs,
    };
    for (const o of observers) o(notice);
    await new Promise((resolve) => setTimeout(resolve, delay));
  }

  /** True after at least one failed attempt (a conditional write's answer may then be about our own). */
  get retried(): boolean {
    return this.retries > 0;
  }

  /** The operation made progress (an upload's chunk was kept): backoff and deadline count afresh from here. */
  progressed(): void {
    this.started = Date.now();
    this.retries = 0;
  }
}

/** What an attempt returns to be run again at once, without counting as a failure (see retrying). */
export const AGAIN: unique symbol = Symbol("again");

/**
 * The one retry loop: runs `attempt` until it returns, retrying what it throws as Attempts.failed() decides;
 * an attempt that returns AGAIN runs again with no wait (an upload that learnt where to go on from).
 */
export async function retrying<T>(
  what: string,
  path: string,
  policy: RetryPolicy,
  attempt: (r: Attempts) => Promise<T | typeof AGAIN>,
): Promise<T> {
  for (const r = new Attempts(what, path, policy); ; ) {
    try {
      const out = await attempt(r);
      if (out !== AGAIN) return out;
    } catch (e) {
      await r.failed(e);
    }
  }
}

/**
 * The same for a stream: the attempt's pieces are passed on as they come, and a failed attempt is retried
 * (the attempt itself knows how much it delivered already, and goes on from there).
 */
export async function* retryingStream<T>(
  what: string,
  path: string,
  policy: RetryPolicy,
  attempt: (r: Attempts) => AsyncGenerator<T>,
): AsyncGenerator<T> {
  for (const r = new Attempts(what, path, policy); ; ) {
    try {
      yield* attempt(r);
      return;
    } catch (e) {
      await r.failed(e);
    }
  }
}
