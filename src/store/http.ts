// The one place storage requests go over the wire, through undici (the HTTP/1.1 client Node's own fetch is
// built on: TLS, kept-alive connections, proxies), so that every request has a deadline, every body a stall
// timeout and a length check, and every failure is classified once: transient (retry.ts retries it) or not.
// Nothing here retries, and nothing is left pending: every path aborts or drains the request, and a request
// body is not pulled once its request has an answer or has failed.
import type { Readable } from "node:stream";
import { setFlagsFromString } from "node:v8";
import { type Dispatcher, EnvHttpProxyAgent } from "undici";
import { CredentialsError, StorageIoError } from "../errors.js";
import { once } from "../util/streams.js";
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

/** What a request is sent with: its headers (a bearer token, or none for an emulator), and how to renew them. */
export interface Credentials {
  headers(): Promise<Record<string, string>>;
  /** Renews the token after a 401; absent where nothing is sent. */
  refresh?(): Promise<void>;
}

export const NO_CREDENTIALS: Credentials = { headers: async () => ({}) };

/** The server needs an upload's whole body before it answers: allow it this slow a link (bytes per ms = 256 KB/s). */
const MIN_UPLOAD_RATE = 256;

/**
 * The largest piece of a request body handed to the socket: larger ones (a resumable chunk in memory, a multipart
 * part) go as views of this size, each pulled as the socket drains. A TLS socket given one large buffer encrypts
 * all of it at once into a buffer of its own: a 16 MiB resumable chunk cost about 4x its size in native memory
 * over TLS, 1.5x in views. The stall clock then moves with each view.
 */
const BODY_PIECE = 1 << 20;

/** A 401 within this long of a token refresh is final: the new token is refused too. */
const REFRESH_GRACE_MS = 60_000;

export interface SendInit {
  readonly headers?: Record<string, string>;
  /**
   * A streamed body needs a `content-length` header. Its pieces must stay unchanged once handed out: the
   * socket may still hold one while the next is pulled (every Store's readStream gives pieces of their own).
   */
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
  private refreshing: Promise<void> | undefined;
  private refreshedAt = Number.NEGATIVE_INFINITY;

  constructor(
    private readonly credentials: Credentials,
    private readonly timeouts: Timeouts,
  ) {}

  async send(method: string, url: string, init: SendInit): Promise<Answer> {
    const { stallMs } = this.timeouts;
    const streamed =
      init.body === undefined || (init.body instanceof Uint8Array && init.body.length <= BODY_PIECE)
        ? undefined
        : init.body instanceof Uint8Array
          ? { body: once(init.body), length: init.body.length }
          : { body: init.body, length: declaredLength(init) };
    const controller = new AbortController();
    // The stall deadline moves on with every piece of a body; one timer per stall period checks it (a timer
    // per piece costs more CPU than the piece's own handling).
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
    arm(stallMs + (init.body instanceof Uint8Array && streamed === undefined ? init.body.length / MIN_UPLOAD_RATE : 0));
    const feed = streamed && new BodyFeed(streamed.body, streamed.length, () => arm(stallMs));

    let res: Dispatcher.ResponseData;
    try {
      const u = new URL(url);
      res = await dispatcher().request({
        origin: u.origin,
        path: `${u.pathname}${u.search}`,
        method: method as Dispatcher.HttpMethod,
        headers: { ...(await credentialHeaders(this.credentials, init.path)), ...init.headers },
        // undici takes an AsyncIterable body (docs/api/Dispatcher.md, `body`), which its types leave out.
        body: (feed as unknown as Readable | undefined) ?? (init.body as Uint8Array | undefined) ?? null,
        signal: controller.signal,
      });
    } catch (e) {
      disarm();
      await feed?.stop();
      // An error of a streamed body's source is the caller's, not ours: rethrown as it is.
      if (feed?.failure) throw feed.failure.error;
      throw classify(e, controller.signal, init.path);
    }
    // An answer that came before the whole body (a refusal): the rest is not sent.
    await feed?.stop();
    disarm();

    const answer = bodyOf(res, controller, { arm, disarm, hold }, stallMs, init.path);
    if (init.accept.includes(res.statusCode)) return answer;
    const text = await answer
      .bytes()
      .then((b) => new TextDecoder().decode(b))
      .catch(() => "");
    if (res.statusCode === 401 && this.credentials.refresh) throw await this.unauthorized(res, text, init.path);
    throw statusError(res, text, init.path);
  }

  /** A 401: the token is renewed and the request retried, unless it was just renewed (then it is refused for good). */
  private async unauthorized(res: Dispatcher.ResponseData, text: string, path: string): Promise<Error> {
    if (Date.now() - this.refreshedAt < REFRESH_GRACE_MS) return statusError(res, text, path, " after the access token was renewed");
    this.refreshing ??= (async () => {
      try {
        await this.credentials.refresh?.();
      } finally {
        this.refreshedAt = Date.now();
        this.refreshing = undefined;
      }
    })();
    await this.refreshing;
    return new TransientError(`HTTP 401: the access token was renewed`, "http-401");
  }
}

/**
 * A streamed request body as undici pulls it: one piece at a time, and none once stop() was called (the
 * request answered or failed). stop() waits for a pull already under way, so that when send() settles the
 * source is no longer being read: a retry can reopen it (RangeReader) with nothing of the old attempt left.
 * That wait is bounded by the source's own deadline (a download's stall clock; a local read). The source is
 * read to its end before its last piece goes out, so that it has finished (and said what it sent) by the time
 * the server can answer.
 */
class BodyFeed implements AsyncIterableIterator<Uint8Array> {
  private readonly it: AsyncIterator<Uint8Array>;
  private pulling: Promise<unknown> | undefined;
  private stopped = false;
  private closed: Promise<void> | undefined;
  private sent = 0;
  /** What is left of a piece larger than BODY_PIECE, counted in `sent` already. */
  private rest: Uint8Array | undefined;
  /** The source's own error, or a length that is not the one announced: the caller's, reported as it is. */
  failure: { error: unknown } | undefined;

  constructor(
    source: AsyncIterable<Uint8Array>,
    private readonly length: number,
    private readonly progress: () => void,
  ) {
    this.it = source[Symbol.asyncIterator]();
  }

  [Symbol.asyncIterator](): this {
    return this;
  }

  async next(): Promise<IteratorResult<Uint8Array>> {
    if (this.stopped) return DONE;
    const pull = this.pull();
    this.pulling = pull.catch(() => {});
    try {
      return await pull;
    } catch (e) {
      this.failure ??= { error: e };
      this.stopped = true;
      throw e;
    } finally {
      this.pulling = undefined;
    }
  }

  private async pull(): Promise<IteratorResult<Uint8Array>> {
    if (this.rest !== undefined) return this.view(this.rest);
    const r = await this.it.next();
    if (r.done) {
      if (this.sent !== this.length) throw new RangeError(`request body ended after ${this.sent} of its ${this.length} bytes`);
      return DONE;
    }
    if (this.stopped) return DONE; // a piece pulled as the request ended is dropped
    this.sent += r.value.length;
    if (this.sent > this.length) throw new RangeError(`request body longer than its content-length ${this.length}`);
    if (this.sent === this.length && !(await this.it.next()).done) {
      throw new RangeError(`request body longer than its content-length ${this.length}`);
    }
    return this.view(r.value);
  }

  /** The first BODY_PIECE bytes of `piece`, the rest kept for the next pull. */
  private view(piece: Uint8Array): IteratorResult<Uint8Array> {
    this.rest = piece.length > BODY_PIECE ? piece.subarray(BODY_PIECE) : undefined;
    this.progress();
    return { done: false, value: piece.length > BODY_PIECE ? piece.subarray(0, BODY_PIECE) : piece };
  }

  async return(): Promise<IteratorResult<Uint8Array>> {
    await this.stop();
    return DONE;
  }

  /** No more pulls: waits for the one under way, then closes the source (once). */
  stop(): Promise<void> {
    this.stopped = true;
    this.closed ??= (async () => {
      await this.pulling;
      if (this.failure === undefined) await this.it.return?.(undefined).catch(() => {});
    })();
    return this.closed;
  }
}

const DONE: IteratorReturnResult<undefined> = { done: true, value: undefined };

/**
 * Kept-alive connections, at most this many per origin: above what `--concurrency 32` uses at once (a download
 * and an upload per object, and metadata requests), below what an emulator or a NAT would choke on. A request
 * beyond it waits for a connection, within its stall deadline.
 */
const MAX_SOCKETS = 96;

let shared: Dispatcher | undefined;

/**
 * One dispatcher per process, made on first use. EnvHttpProxyAgent sends a request through HTTPS_PROXY or
 * HTTP_PROXY (either case) unless NO_PROXY names its host, as google-auth-library's token requests go, loopback
 * included (as curl does). Its own timeouts are off: the stall clock above is the one deadline, and it stops
 * while the consumer holds a piece. The system's CAs and NODE_EXTRA_CA_CERTS are trusted, as by every node TLS
 * socket. undici resumes a TLS session only while its weak cache still holds it (nodejs/undici#1802: until the
 * next garbage collection, soon in a conversion); what saves handshakes is that connections are kept alive.
 */
function dispatcher(): Dispatcher {
  if (shared === undefined) {
    keepWasmBaseline();
    shared = new EnvHttpProxyAgent({ connections: MAX_SOCKETS, headersTimeout: 0, bodyTimeout: 0 });
  }
  return shared;
}

/**
 * undici parses HTTP/1.1 with llhttp compiled to WebAssembly. V8 compiles it with its baseline compiler
 * (Liftoff), then recompiles the functions that get hot with its optimizing one
 * (https://v8.dev/docs/wasm-compilation-pipeline): after some dozen requests, which in a conversion is while
 * its uploads hold their chunks, that recompilation took 16-37 MiB of native memory at once (test/store/gcs-
 * memory.test.ts's peak 137-149 -> 120-125 MiB over TLS; 48 uploads through undici alone +37 -> +2 MiB). What
 * llhttp does per request is small (headers, a body's length), so the baseline code costs nothing measurable.
 * Set before undici compiles the module, at its first connection; setFlagsFromString is node's documented way
 * to set a V8 flag at run time (https://nodejs.org/api/v8.html#v8setflagsfromstringflags), so every process
 * (the CLI, the jobs, the function) gets it whatever node was started with.
 */
function keepWasmBaseline(): void {
  setFlagsFromString("--liftoff-only");
}

/** The largest body discard() reads to its end rather than closing the connection. */
const DRAIN_LIMIT = 64 << 10;

function bodyOf(
  res: Dispatcher.ResponseData,
  controller: AbortController,
  clock: { arm: (ms: number) => void; disarm: () => void; hold: () => void },
  stallMs: number,
  path: string,
): Answer {
  const { arm, disarm, hold } = clock;
  // Its errors reach the reader through the iterator; a body destroyed unread (discard) would otherwise throw one.
  res.body.on("error", () => {});
  const headers = headersOf(res.headers);
  const declared = headers.get("content-length");
  const expected = declared !== null && !headers.get("content-encoding") ? Number(declared) : undefined;
  async function* body(): AsyncGenerator<Uint8Array> {
    let seen = 0;
    try {
      arm(stallMs);
      // Leaving this loop early (the consumer stopped) ends the exchange: undici keeps the connection if the
      // body was read to its end (a ranged read of exactly its length), and closes it otherwise. The stall clock
      // runs only while we wait for the server: a consumer that takes a while with a piece (an upload streaming
      // it, waiting for its chunk's answer) is not a stalled download.
      for await (const piece of res.body as AsyncIterable<Buffer>) {
        seen += piece.length;
        hold();
        yield plain(piece);
        arm(stallMs);
      }
    } catch (e) {
      throw classify(e, controller.signal, path);
    } finally {
      disarm();
      if (!res.body.readableEnded) res.body.destroy();
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
    status: res.statusCode,
    headers,
    body,
    bytes,
    json: async <T>() => {
      const b = await bytes();
      try {
        return JSON.parse(new TextDecoder().decode(b)) as T;
      } catch {
        // A complete body that is not JSON: the server (or something in between) is broken right now.
        throw new TransientError(`unparseable JSON answer (HTTP ${res.statusCode}, ${b.length} bytes)`, "bad-answer");
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
      res.body.destroy();
    },
  };
}

/** undici's header record (a repeated header as an array) as fetch's Headers, which every caller reads. */
function headersOf(raw: Dispatcher.ResponseData["headers"]): Headers {
  const h = new Headers();
  for (const [k, v] of Object.entries(raw)) {
    if (Array.isArray(v)) for (const one of v) h.append(k, one);
    else if (v !== undefined) h.append(k, v);
  }
  return h;
}

/** A Buffer's bytes as a plain Uint8Array (a view, no copy), as every store returns them. */
const plain = (b: Uint8Array): Uint8Array => (b.constructor === Uint8Array ? b : new Uint8Array(b.buffer, b.byteOffset, b.length));

/** TLS verification failures (node's codes): no retry helps, the trust store must change. */
const TLS_TRUST =
  /^(UNABLE_TO_VERIFY_LEAF_SIGNATURE|UNABLE_TO_GET_ISSUER_CERT(_LOCALLY)?|SELF_SIGNED_CERT_IN_CHAIN|DEPTH_ZERO_SELF_SIGNED_CERT|CERT_HAS_EXPIRED|CERT_NOT_YET_VALID|CERT_UNTRUSTED|CERT_REJECTED|ERR_TLS_CERT_ALTNAME_INVALID|HOSTNAME_MISMATCH)$/;

/** Whether a failed request or body read is worth another attempt; the cause, in words, for the message. */
/**
 * The credentials' headers. google-auth-library says "Could not load the default credentials" when Application
 * Default Credentials find nothing at all (it has already tried the metadata server): no later attempt can do
 * better, so that is a CredentialsError saying how to give some, not a transient fault retried for minutes.
 * Any other failure (a token endpoint or metadata server that did not answer) stays transient.
 */
async function credentialHeaders(credentials: Credentials, path: string): Promise<Record<string, string>> {
  try {
    return await credentials.headers();
  } catch (e) {
    if (e instanceof Error && /Could not load the default credentials/.test(e.message)) {
      throw new CredentialsError(
        "no Google credentials found: run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a service account key file, or run where a metadata server gives them (Compute Engine, Cloud Run, Cloud Shell)",
        { path },
      );
    }
    throw e;
  }
}

function classify(e: unknown, signal: AbortSignal, path: string): unknown {
  if (e instanceof TransientError || e instanceof StorageIoError || e instanceof CredentialsError) return e;
  if (signal.aborted && signal.reason instanceof TransientError) return signal.reason;
  const err = e as Error & { code?: string; cause?: { code?: string; message?: string } };
  const code = err?.code ?? err?.cause?.code;
  if (err?.name === "TypeError" && /invalid url|failed to parse url/i.test(err.message)) {
    return new StorageIoError(`bad storage URL: ${err.message}`, { path });
  }
  if (code !== undefined && TLS_TRUST.test(code)) {
    return new StorageIoError(
      `TLS: the server's certificate is not trusted (${code}: ${err.message}); a private CA is trusted through NODE_EXTRA_CA_CERTS`,
      { path },
    );
  }
  if (code === "UND_ERR_INVALID_ARG" || code === "UND_ERR_REQ_CONTENT_LENGTH_MISMATCH") {
    return new StorageIoError(`bad request: ${err.message}`, { path });
  }
  // A socket's own error (ECONNRESET, EPIPE, ETIMEDOUT), undici's ("other side closed", a body shorter than its
  // Content-Length), or a proxy's refusal of a tunnel: the next attempt may get through.
  const cause = [code, err?.message ?? String(e), err?.cause?.message].filter((x) => x !== undefined && x !== "").join(": ");
  const kind = /ECONNREFUSED/.test(cause) ? "refused" : "reset";
  return new TransientError(`connection failed: ${cause}`, kind);
}

/** An answer nobody asked for: transient or final as retry.ts's transientStatus() says, with GCS's own message. */
function statusError(res: Dispatcher.ResponseData, text: string, path: string, after = ""): Error {
  let message = text.slice(0, 300);
  try {
    // Google's is a string; an emulator's (the storage-testbench's injected faults) may be an object.
    const m = (JSON.parse(text) as { error?: { message?: unknown } }).error?.message;
    if (m !== undefined && m !== null) message = typeof m === "string" ? m : JSON.stringify(m);
  } catch {
    // not JSON: keep the text
  }
  const what = `HTTP ${res.statusCode}${message ? ` (${message.replace(/\s+/g, " ").trim()})` : ""}${after}`;
  if (transientStatus(res.statusCode)) {
    const after = Number(headerValue(res.headers["retry-after"]));
    return new TransientError(what, `http-${res.statusCode}`, Number.isFinite(after) && after > 0 ? Math.min(after, 30) * 1000 : undefined);
  }
  return new StorageIoError(what, { path });
}

/** A streamed body's announced length (its content-length header, which it must have). */
function declaredLength(init: SendInit): number {
  const v = Object.entries(init.headers ?? {}).find(([k]) => k.toLowerCase() === "content-length")?.[1];
  if (v === undefined || !/^\d+$/.test(v)) throw new TypeError(`a streamed request body needs a content-length (${init.path})`);
  return Number(v);
}

const headerValue = (v: string | string[] | undefined): string | undefined => (Array.isArray(v) ? v[0] : v);
