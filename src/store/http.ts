// The one place storage requests go over the wire (node:http), so that every request has a deadline, every
// body a stall timeout and a length check, and every failure is classified once: transient (retry.ts retries
// it) or not. Nothing here retries, and nothing can be left pending: every path aborts or drains the request.
import { type ClientRequest, Agent as HttpAgent, request as httpRequest, type IncomingMessage } from "node:http";
import { Agent as HttpsAgent, request as httpsRequest } from "node:https";
import { StorageIoError } from "../errors.js";
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
  /** The body as it arrives; fails with a TransientError on a stall, a reset or fewer bytes than announced. */
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
      wire = await viaNode(method, url, headers, init.body, controller.signal, () => arm(stallMs), source);
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

/** An answer as it came off the wire, whichever client fetched it. */
interface Wire {
  readonly status: number;
  readonly headers: Headers;
  /** The body's pieces; errors of the connection surface here. */
  readonly pieces: AsyncIterable<Uint8Array> | null;
  /** Closes the body unread. */
  cancel(): Promise<void>;
}

/**
 * Kept-alive connections, at most this many per host: above what `--concurrency 32` uses at once (a download
 * and an upload per object, and metadata requests), below what an emulator or a NAT would choke on. A request
 * beyond it waits for a socket, within its stall deadline.
 */
const MAX_SOCKETS = 96;
const agents = {
  http: new HttpAgent({ keepAlive: true, maxSockets: MAX_SOCKETS }),
  https: new HttpsAgent({ keepAlive: true, maxSockets: MAX_SOCKETS }),
};

/**
 * Every request goes through node:http, not Node's fetch. Node 20's fetch copies a Uint8Array body and, to be
 * able to follow a redirect, tees a streamed one and keeps the unread branch until the request ends: the whole
 * upload stays in memory (https://github.com/nodejs/undici/issues/4058); and it hands a response body over
 * through a web byte stream, a promise and a fresh buffer per piece, which cost more CPU than the bytes' own
 * handling. Here a request body is written as it is pulled, one piece at a time, waiting for the socket to
 * drain (what is buffered is what the kernel has not yet taken), and a response body is the IncomingMessage's.
 */
function viaNode(
  method: string,
  url: string,
  headers: Record<string, string>,
  body: Uint8Array | AsyncIterable<Uint8Array> | undefined,
  signal: AbortSignal,
  progress: () => void,
  source: { error?: { error: unknown } },
): Promise<Wire> {
  return new Promise<Wire>((resolve, reject) => {
    const u = new URL(url);
    const https = u.protocol === "https:";
    const req = (https ? httpsRequest : httpRequest)(u, {
      method,
      headers: body instanceof Uint8Array ? { ...headers, "content-length": String(body.length) } : headers,
      agent: https ? agents.https : agents.http,
      signal,
    });
    // The first error fails the request; later ones (after the answer came) surface on the answer's body.
    req.once("error", reject).on("error", () => {});
    req.once("response", (res: IncomingMessage) => {
      res.on("error", () => {}); // seen by whoever reads the body; an unread body must not crash the process
      const h = new Headers();
      for (const [k, v] of Object.entries(res.headers)) if (v !== undefined) h.set(k, Array.isArray(v) ? v.join(", ") : v);
      resolve({
        status: res.statusCode ?? 0,
        headers: h,
        pieces: res,
        cancel: async () => {
          res.destroy();
        },
      });
    });
    if (body === undefined || body instanceof Uint8Array) {
      req.end(body);
      return;
    }
    (async () => {
      try {
        for await (const piece of body) {
          progress();
          if (!req.write(piece)) await drained(req);
        }
      } catch (e) {
        if (!req.destroyed) source.error = { error: e };
        req.destroy(e as Error);
        return;
      }
      req.end();
    })();
  });
}

/** Resolves once the request's socket takes more; rejects if the request fails or closes first. */
function drained(req: ClientRequest): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = (e?: unknown) => {
      req.off("drain", done).off("error", done).off("close", closed);
      if (e === undefined) resolve();
      else reject(e);
    };
    const closed = () => done(new Error("request closed"));
    req.once("drain", done).once("error", done).once("close", closed);
  });
}

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
      // Leaving this loop early (the consumer stopped) cancels the response stream, closing the request.
      // The stall clock runs only while we wait for the server: a consumer that takes a while with a piece (an
      // upload streaming it, waiting for its chunk's answer) is not a stalled download. With the announced last
      // byte in hand, the end is read before that piece is handed on: a consumer that stops at it (a ranged
      // read of exactly its length) then leaves a complete response, whose connection goes back to the pool,
      // where an unfinished one would be destroyed (a new connection, and a TLS handshake, per download).
      const it = res.pieces[Symbol.asyncIterator]();
      let finished = false;
      try {
        let r = await it.next();
        while (!r.done) {
          const piece = r.value;
          seen += piece.length;
          // All announced bytes here: a failure after them costs the connection, not the body.
          const next = seen === expected ? await it.next().catch(() => ({ done: true as const, value: undefined })) : undefined;
          if (next?.done) finished = true;
          hold();
          yield piece;
          arm(stallMs);
          r = next ?? (await it.next());
        }
        finished = true;
      } finally {
        if (!finished) await it.return?.();
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
    for await (const p of body()) pieces.push(p);
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
  // fetch reports every network failure as TypeError("fetch failed" / "terminated") with the socket error as
  // cause; node:http reports the socket error itself (ECONNRESET, EPIPE, "socket hang up").
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
