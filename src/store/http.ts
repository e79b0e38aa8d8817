// The one place storage requests go over the wire (http1.ts), so that every request has a deadline, every
// body a stall timeout and a length check, and every failure is classified once: transient (retry.ts retries
// it) or not. Nothing here retries, and nothing can be left pending: every path aborts or drains the request.
import { StorageIoError } from "../errors.js";
import { Pool, type Wire } from "./http1.js";
import { TransientError, transientStatus } from "./retry.js";

export interface Timeouts {
  /**
   * The longest wait for any progress: the response headers, or the next piece of a body in either direction.
   * A request that makes no progress for this long is aborted (and retried). ORBAX2REG_GCS_STALL_MS sets it.
   */
  readonly stallMs: number;
}

export function defaultTimeouts(): Timeouts {
  const v = process.env.ORBAX2REG_GCS_STALL_MS;
  return { stallMs: v !== undefined && /^\d+$/.test(v) ? Number(v) : 30_000 };
}

/** The server needs an upload's whole body before it answers: allow it this slow a link (bytes per ms = 256 KB/s). */
const MIN_UPLOAD_RATE = 256;

export interface SendInit {
  readonly headers?: Record<string, string>;
  readonly body?: Uint8Array | AsyncIterable<Uint8Array>;
  /** Statuses the caller handles itself; every other one is turned into an error here. */
  readonly accept: readonly number[];
  /** The object, for messages. */
  readonly path: string;
}

export interface Answer {
  readonly status: number;
  readonly headers: Headers;
  /**
   * The body as it arrives, each piece valid until the next is asked for (a view into the connection's buffer);
   * fails with a TransientError on a stall, a reset or fewer bytes than announced.
   */
  body(): AsyncGenerator<Uint8Array>;
  bytes(): Promise<Uint8Array>;
  json<T>(): Promise<T>;
  /** Drops the body, closing the request. */
  discard(): Promise<void>;
}

export class Http {
  constructor(
    private readonly authHeaders: () => Promise<Record<string, string>>,
    private readonly timeouts: Timeouts,
  ) {}

  async send(method: string, url: string, init: SendInit): Promise<Answer> {
    const { stallMs } = this.timeouts;
    const controller = new AbortController();
    // The stall deadline moves on with every piece of a body; one timer per stall period checks it (a timer
    // per 64 KiB piece cost more CPU than the piece's own handling).
    let timer: NodeJS.Timeout | undefined;
    let deadline = 0;
    let window = 0;
    const check = () => {
      const left = deadline - Date.now();
      if (left > 0) timer = setTimeout(check, Math.min(left, window));
      else controller.abort(new TransientError(`no progress for ${(window / 1000).toFixed(1)} s`, "timeout"));
    };
    const arm = (ms: number) => {
      deadline = Date.now() + ms;
      window = ms;
      if (timer === undefined) timer = setTimeout(check, ms);
    };
    const disarm = () => {
      clearTimeout(timer);
      timer = undefined;
    };
    /** While the consumer holds a piece, the clock stops: its time is not the server's. */
    const hold = () => {
      deadline = Number.POSITIVE_INFINITY;
    };
    arm(stallMs + (init.body instanceof Uint8Array ? init.body.length / MIN_UPLOAD_RATE : 0));

    // An error of a streamed body's source is the caller's, not ours: rethrown as it is.
    const source: { error?: { error: unknown } } = {};
    let wire: Wire;
    try {
      const headers = { ...(await this.authHeaders()), ...init.headers };
      wire = await pool.request({
        method,
        url: new URL(url),
        headers,
        ...(init.body !== undefined ? { body: init.body } : {}),
        signal: controller.signal,
        progress: () => arm(stallMs),
        source,
      });
    } catch (e) {
      disarm();
      if (source.error) throw source.error.error;
      throw classify(e, controller.signal, init.path);
    }
    disarm();

    const answer = bodyOf(wire, controller, { arm, disarm, hold }, stallMs, init.path);
    if (init.accept.includes(wire.status)) return answer;
    const text = await answer
      .bytes()
      .then((b) => new TextDecoder().decode(b))
      .catch(() => "");
    throw statusError(wire, text, init.path);
  }
}

/**
 * Kept-alive connections, at most this many per host: above what `--concurrency 32` uses at once (a download
 * and an upload per object, and metadata requests), below what an emulator or a NAT would choke on. A request
 * beyond it waits for a connection, within its stall deadline.
 */
const MAX_SOCKETS = 96;
/**
 * Every request goes through http1.ts, not node:http nor Node's fetch. node:http reads each socket into a fresh
 * 64 KiB buffer, which V8 frees only at its next garbage collection: at a conversion's rates, tens of MiB of
 * dead buffers at any time. Node 20's fetch also copies a Uint8Array body and, to be able to follow a redirect,
 * tees a streamed one and keeps the unread branch until the request ends: the whole upload stays in memory
 * (https://github.com/nodejs/undici/issues/4058). http1.ts reads each connection into one buffer, reused.
 */
const pool = new Pool(MAX_SOCKETS);

/** The largest body discard() reads to its end rather than closing the connection. */
const DRAIN_LIMIT = 64 << 10;

function bodyOf(
  res: Wire,
  controller: AbortController,
  clock: { arm: (ms: number) => void; disarm: () => void; hold: () => void },
  stallMs: number,
  path: string,
): Answer {
  const { arm, disarm, hold } = clock;
  const declared = res.headers.get("content-length");
  const expected = declared !== null && !res.headers.get("content-encoding") ? Number(declared) : undefined;
  async function* body(): AsyncGenerator<Uint8Array> {
    let seen = 0;
    try {
      if (res.pieces === null) return;
      arm(stallMs);
      // Leaving this loop early (the consumer stopped) ends the exchange: its connection goes back to the pool if
      // the body was read to its end (a ranged read of exactly its length), and is closed otherwise. The stall
      // clock runs only while we wait for the server: a consumer that takes a while with a piece (an upload
      // streaming it, waiting for its chunk's answer) is not a stalled download. Each piece is a view into the
      // connection's buffer, valid until the next is asked for (http1.ts), as it is handed on.
      for await (const piece of res.pieces) {
        seen += piece.length;
        hold();
        yield piece;
        arm(stallMs);
      }
    } catch (e) {
      throw classify(e, controller.signal, path);
    } finally {
      disarm();
    }
    if (expected !== undefined && seen !== expected) {
      throw new TransientError(`response body ended after ${seen} of ${expected} bytes`, "short-body");
    }
  }
  // Into one buffer of the announced size, each byte copied once (more than announced fails in body()).
  const bytes = async () => {
    if (expected !== undefined) {
      const out = Buffer.allocUnsafe(expected);
      let at = 0;
      for await (const p of body()) {
        if (at + p.length > expected) throw new TransientError(`response body longer than its ${expected} bytes`, "short-body");
        out.set(p, at);
        at += p.length;
      }
      return plain(out);
    }
    const pieces: Uint8Array[] = [];
    for await (const p of body()) pieces.push(Buffer.from(p)); // copied: a piece is valid until the next
    return plain(pieces.length === 1 ? (pieces[0] as Uint8Array) : Buffer.concat(pieces));
  };
  return {
    status: res.status,
    headers: res.headers,
    body,
    bytes,
    json: async <T>() => {
      const b = await bytes();
      try {
        return JSON.parse(new TextDecoder().decode(b)) as T;
      } catch {
        // A complete body that is not JSON: the server (or something in between) is broken right now.
        throw new TransientError(`unparseable JSON answer (HTTP ${res.status}, ${b.length} bytes)`, "bad-answer");
      }
    },
    discard: async () => {
      // A short body (a 308's, a session's) is read to its end, so that its connection is kept; a longer one (a
      // download given up) closes it.
      if (expected !== undefined && expected <= DRAIN_LIMIT) {
        try {
          for await (const _ of body()) {
            // dropped
          }
          return;
        } catch {
          // the connection failed: nothing to keep
        }
      }
      disarm();
      await res.cancel();
    },
  };
}

/** A Buffer's bytes as a plain Uint8Array (a view, no copy), as every store returns them. */
const plain = (b: Uint8Array): Uint8Array => (b.constructor === Uint8Array ? b : new Uint8Array(b.buffer, b.byteOffset, b.length));

/** Whether a failed fetch or body read is worth another attempt; the cause, in words, for the message. */
function classify(e: unknown, signal: AbortSignal, path: string): unknown {
  if (e instanceof TransientError || e instanceof StorageIoError) return e;
  if (signal.aborted && signal.reason instanceof TransientError) return signal.reason;
  const err = e as Error & { cause?: { code?: string; message?: string } };
  if (err?.name === "TypeError" && /invalid url|failed to parse url/i.test(err.message)) {
    return new StorageIoError(`bad storage URL: ${err.message}`, { path });
  }
  // http1.ts reports the socket's own error (ECONNRESET, EPIPE, ETIMEDOUT), or "socket hang up" when the
  // connection closed too early, as node:http does; a `cause` is still looked at for errors from elsewhere.
  const cause = err?.cause?.code ?? err?.cause?.message ?? (err as { code?: string })?.code ?? err?.message ?? String(e);
  const kind = /ECONNREFUSED/.test(cause) ? "refused" : "reset";
  return new TransientError(`connection failed: ${cause}`, kind);
}

/** An answer nobody asked for: transient or final as retry.ts's transientStatus() says, with GCS's own message. */
function statusError(res: Wire, text: string, path: string): Error {
  let message = text.slice(0, 300);
  try {
    // Google's is a string; an emulator's (the storage-testbench's injected faults) may be an object.
    const m = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    if (m !== undefined && m !== null) message = typeof m === "string" ? m : JSON.stringify(m);
  } catch {
    // not JSON: keep the text
  }
  const what = `HTTP ${res.status}${message ? ` (${message.replace(/\s+/g, " ").trim()})` : ""}`;
  if (transientStatus(res.status)) {
    const after = Number(res.headers.get("retry-after"));
    return new TransientError(what, `http-${res.status}`, Number.isFinite(after) && after > 0 ? Math.min(after, 30) * 1000 : undefined);
  }
  return new StorageIoError(what, { path });
}
