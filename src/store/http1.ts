// An HTTP/1.1 client whose connections each read into one buffer of their own, reused for every read of the
// connection's life (net's and tls's `onread`). node:http allocates a fresh 64 KiB buffer for every socket read;
// a conversion moves hundreds of MB/s through them, and V8 frees them only at its next garbage collection, so
// tens of MiB of dead buffers sat in the process at any time (bench/gcs.mjs: 40-56 MiB of ArrayBuffers, a third
// of its peak RSS). The price of the reuse: a body piece is a view into its connection's buffer, valid until
// the next piece is asked for (what Store.readStream promises its readers), and the connection reads nothing
// more until then. A request body is written piece by piece, each piece's write finished before the next is
// pulled, so its source may reuse its buffer too.
//
// What it speaks (RFC 9112): one request at a time per connection (no pipelining); bodies framed by
// Content-Length, chunked transfer coding, or the connection's close; 1xx answers skipped; kept-alive
// connections pooled per origin. Everything else (retries, deadlines, statuses) is http.ts's.
import net from "node:net";
import tls from "node:tls";

/** An answer as it came off the wire. */
export interface Wire {
  readonly status: number;
  readonly headers: Headers;
  /**
   * The body's pieces, each valid until the next is asked for; null when the answer has none. Errors of the
   * connection surface here. Reading it to its end, or leaving it early, ends the exchange.
   */
  readonly pieces: AsyncIterable<Uint8Array> | null;
  /** Ends the exchange with the body unread (the connection is closed unless the body was complete). */
  cancel(): Promise<void>;
}

export interface RequestInit {
  readonly method: string;
  readonly url: URL;
  /** Names in any case; `host` and the body's `content-length` are added. */
  readonly headers: Record<string, string>;
  /** A streamed body needs a `content-length` header: every body this client sends has a known size. */
  readonly body?: Uint8Array | AsyncIterable<Uint8Array>;
  readonly signal: AbortSignal;
  /** Called before each piece of a streamed body is written. */
  readonly progress?: () => void;
  /** Where an error of the streamed body's own source is put (it is the caller's, not the connection's). */
  readonly source?: { error?: { error: unknown } };
}

/** Each connection's read buffer: the most one socket read delivers (libuv reads 64 KiB at a time). */
const READ_BUFFER = 64 << 10;
/** The longest answer head, and the longest line of a chunked body's framing, accepted. */
const HEAD_LIMIT = 64 << 10;
const LINE_LIMIT = 8 << 10;
/** An idle connection is closed after this long (before a server's own idle timeout is likely to race a reuse). */
const IDLE_MS = 5_000;
/** How long a request body may still be going out after its whole answer came, before the connection is closed. */
const ANSWERED_WRITE_GRACE_MS = 1_000;

/** A failure of the connection or of the server's answer: node's words, so that callers classify it as they did. */
function connectionError(message: string, code = "ECONNRESET"): Error {
  return Object.assign(new Error(message), { code });
}

const CRLF2 = Buffer.from("\r\n\r\n");

type Framing = { kind: "none" } | { kind: "length"; length: number } | { kind: "chunked" } | { kind: "close" };

class Connection {
  readonly socket: net.Socket;
  private readonly buffer: Buffer;
  /** The unread bytes of the last read: buffer[pos, len). */
  private pos = 0;
  private len = 0;
  private ended = false;
  private failure: Error | undefined;
  private wake: (() => void) | undefined;
  private idleTimer: NodeJS.Timeout | undefined;
  /** Whether an exchange holds the connection (bytes arriving without one are a protocol error). */
  busy = true;

  constructor(
    readonly url: URL,
    tlsOptions: tls.ConnectionOptions,
    private readonly gone: (c: Connection) => void,
  ) {
    this.buffer = Buffer.allocUnsafeSlow(READ_BUFFER);
    const onread = {
      buffer: this.buffer,
      callback: (n: number) => {
        this.pos = 0;
        this.len = n;
        if (!this.busy) this.destroy(connectionError("the server sent bytes on an idle connection"));
        this.notify();
        return false; // read no more until these bytes are taken (see fill)
      },
    };
    const host = url.hostname.replace(/^\[|\]$/g, "");
    const https = url.protocol === "https:";
    const port = Number(url.port || (https ? 443 : 80));
    this.socket = https
      ? // tls takes net's `onread` too (Node 20 and 22; test/store/http1.test.ts), though its types omit it.
        tls.connect({
          ...tlsOptions,
          host,
          port,
          onread,
          ALPNProtocols: ["http/1.1"],
          ...(net.isIP(host) ? {} : { servername: host }),
        } as tls.ConnectionOptions)
      : net.connect({ host, port, onread });
    this.socket.setNoDelay(true);
    this.socket.setKeepAlive(true, 1000);
    this.socket.on("end", () => {
      this.ended = true;
      this.notify();
    });
    this.socket.on("error", (e) => {
      this.failure ??= e;
      this.notify();
    });
    this.socket.on("close", () => {
      this.failure ??= connectionError("socket hang up");
      clearTimeout(this.idleTimer);
      this.notify();
      this.gone(this);
    });
  }

  /** Resolves once connected (and the TLS handshake done). */
  connected(): Promise<void> {
    return new Promise((resolve, reject) => {
      const event = this.socket instanceof tls.TLSSocket ? "secureConnect" : "connect";
      const fail = (e: Error) => {
        this.socket.off(event, ok);
        reject(e);
      };
      const ok = () => {
        this.socket.off("error", fail).off("close", closed);
        resolve();
      };
      const closed = () => fail(this.failure ?? connectionError("socket hang up"));
      this.socket.once(event, ok).once("error", fail).once("close", closed);
    });
  }

  get usable(): boolean {
    return !this.socket.destroyed && !this.ended && this.failure === undefined;
  }

  /** Whether bytes of the last read are still unread (after an exchange: more than its answer, so unusable). */
  get unread(): boolean {
    return this.pos < this.len;
  }

  destroy(e?: Error): void {
    this.failure ??= e ?? connectionError("socket hang up");
    this.socket.destroy();
    this.notify();
  }

  /** Back in the pool: unref'd (an idle connection must not keep the process alive), closed if idle too long. */
  idle(): void {
    this.busy = false;
    this.socket.unref();
    this.socket.resume(); // to see the server close it (or send what it must not)
    this.idleTimer = setTimeout(() => this.socket.destroy(), IDLE_MS);
    this.idleTimer.unref();
  }

  claim(): void {
    clearTimeout(this.idleTimer);
    this.busy = true;
    this.socket.ref();
  }

  private notify(): void {
    const w = this.wake;
    this.wake = undefined;
    w?.();
  }

  /** Whether unread bytes are in hand, reading more if none are; false at the end of the connection. */
  async fill(): Promise<boolean> {
    while (this.pos >= this.len) {
      if (this.failure !== undefined) throw this.failure;
      if (this.ended) return false;
      await new Promise<void>((resolve) => {
        this.wake = resolve;
        this.socket.resume();
      });
    }
    return true;
  }

  /** Up to `max` unread bytes, as a view into the read buffer (valid until the next fill). */
  view(max: number): Uint8Array {
    const n = Math.min(max, this.len - this.pos);
    const view = new Uint8Array(this.buffer.buffer, this.buffer.byteOffset + this.pos, n);
    this.pos += n;
    return view;
  }

  /** Bytes up to and including the next CRLF CRLF (an answer's head), copied out; undefined at a clean end. */
  async readHead(): Promise<Buffer | undefined> {
    const parts: Buffer[] = [];
    let size = 0;
    let tail = Buffer.alloc(0); // the last 3 bytes of the head so far, for a terminator split across reads
    for (;;) {
      if (!(await this.fill())) {
        if (size === 0) return undefined;
        throw connectionError("the connection closed within an answer's head");
      }
      const chunk = this.buffer.subarray(this.pos, this.len);
      // Searched with the head's last bytes in front (a copy only for a head that spans reads, which is rare).
      const at = (tail.length === 0 ? chunk : Buffer.concat([tail, chunk])).indexOf(CRLF2);
      if (at >= 0) {
        const used = at + 4 - tail.length;
        parts.push(Buffer.from(chunk.subarray(0, used)));
        this.pos += used;
        return Buffer.concat(parts);
      }
      size += chunk.length;
      if (size > HEAD_LIMIT) throw connectionError(`an answer's head is longer than ${HEAD_LIMIT} bytes`, "EPROTO");
      const copy = Buffer.from(chunk);
      parts.push(copy);
      tail = Buffer.concat([tail, copy]).subarray(-3);
      this.pos = this.len;
    }
  }

  /** One line of a chunked body's framing, without its CRLF. */
  async readLine(): Promise<string> {
    let line = "";
    for (;;) {
      if (!(await this.fill())) throw connectionError("the connection closed within a chunked body");
      const chunk = this.buffer.subarray(this.pos, this.len);
      const nl = chunk.indexOf(0x0a);
      const end = nl < 0 ? chunk.length : nl + 1;
      line += chunk.subarray(0, end).toString("latin1");
      this.pos += end;
      if (line.length > LINE_LIMIT) throw connectionError("a chunked body's framing line is too long", "EPROTO");
      if (nl >= 0) {
        if (!line.endsWith("\r\n")) throw connectionError("a chunked body's line does not end in CRLF", "EPROTO");
        return line.slice(0, -2);
      }
    }
  }

  /** Writes `bytes` and resolves once the socket is done with them (so that their buffer may be reused). */
  write(bytes: Uint8Array): Promise<void> {
    return new Promise((resolve, reject) => {
      if (this.socket.destroyed) return reject(this.failure ?? connectionError("socket hang up", "EPIPE"));
      this.socket.write(bytes, (e) => (e ? reject(this.failure ?? e) : resolve()));
    });
  }
}

interface Origin {
  readonly idle: Connection[];
  open: number;
  readonly waiting: Array<() => void>;
}

/** Kept-alive connections, at most `maxPerOrigin` per origin; a request beyond waits for one. */
export class Pool {
  private readonly origins = new Map<string, Origin>();

  constructor(
    private readonly maxPerOrigin: number,
    private readonly tlsOptions: tls.ConnectionOptions = {},
  ) {}

  /** Sends the request; resolves with the answer once its head is in (its body may still be going out). */
  async request(init: RequestInit): Promise<Wire> {
    const { signal } = init;
    signal.throwIfAborted();
    const conn = await this.acquire(init.url, signal);
    const abort = () => conn.destroy(signal.reason instanceof Error ? signal.reason : connectionError("aborted"));
    signal.addEventListener("abort", abort, { once: true });
    if (signal.aborted) abort(); // while the connection was being had

    // The exchange ends when both its request is written and its answer read (or either failed); then the
    // connection goes back to the pool if nothing went wrong and the server keeps it open.
    let sent = false;
    let answered = false;
    let reusable = true;
    let over = false;
    let grace: NodeJS.Timeout | undefined;
    const settle = () => {
      if (over) return;
      if (answered && !sent) {
        // The server answered before taking the whole request body: it may never take the rest.
        grace ??= setTimeout(() => {
          reusable = false;
          conn.destroy();
        }, ANSWERED_WRITE_GRACE_MS).unref();
        return;
      }
      if (!(sent && answered)) return;
      over = true;
      signal.removeEventListener("abort", abort);
      clearTimeout(grace);
      if (reusable && conn.usable && !conn.unread) this.release(conn);
      else conn.destroy();
    };
    const fail = () => {
      reusable = false;
      sent = answered = true;
      settle();
    };

    let writeError: { error: unknown } | undefined;
    const writing = this.send(conn, init).then(
      () => {
        sent = true;
        settle();
      },
      (e: unknown) => {
        writeError = { error: e };
        fail();
        throw e;
      },
    );
    // A failed write shows in the answer (the connection is destroyed); its own error is the one to report.
    writing.catch(() => {});
    const writeFailed = writing.then(() => new Promise<never>(() => {}));
    writeFailed.catch(() => {});
    try {
      const head = await Promise.race([readAnswer(conn, init.method), writeFailed]);
      if (head === undefined) throw connectionError("socket hang up");
      const { status, headers, framing, keepAlive } = head;
      if (!keepAlive) reusable = false;
      let complete = framing.kind === "none";
      if (complete) {
        answered = true;
        settle();
      }
      const end = () => {
        if (!complete) reusable = false;
        answered = true;
        settle();
      };
      const pieces =
        framing.kind === "none"
          ? null
          : (async function* () {
              try {
                for await (const piece of readBody(conn, framing, () => (complete = true))) yield piece;
              } finally {
                end();
              }
            })();
      return {
        status,
        headers,
        pieces,
        cancel: async () => {
          if (pieces !== null) await pieces.return(undefined);
          end();
        },
      };
    } catch (e) {
      fail();
      // The cause: the body's source's error, or the request's own failure if it came first. Not waited for: a
      // write may be waiting on its source, which only its own stall timeout ends.
      throw init.source?.error ? init.source.error.error : (writeError?.error ?? e);
    }
  }

  private async send(conn: Connection, init: RequestInit): Promise<void> {
    const { method, url, body } = init;
    const lines = [`${method} ${url.pathname}${url.search} HTTP/1.1`, `host: ${url.host}`];
    let length: number | undefined;
    for (const [k, v] of Object.entries(init.headers)) {
      if (/[\r\n]/.test(k) || /[\r\n]/.test(v)) throw new TypeError(`invalid header ${JSON.stringify(k)}`);
      const name = k.toLowerCase();
      if (name === "host") continue;
      if (name === "content-length") {
        length = Number(v);
        continue;
      }
      lines.push(`${k}: ${v}`);
    }
    if (body instanceof Uint8Array) length = body.length;
    else if (body !== undefined && length === undefined) throw new TypeError("a streamed request body needs a content-length");
    // As node:http: a body-carrying method without a body says so (GCS wants `Content-Length: 0` on a status query).
    if (length === undefined && !/^(GET|HEAD|DELETE|OPTIONS|TRACE)$/.test(method)) length = 0;
    if (length !== undefined) lines.push(`content-length: ${length}`);
    lines.push("connection: keep-alive", "", "");
    await conn.write(Buffer.from(lines.join("\r\n"), "latin1"));
    if (body instanceof Uint8Array) {
      if (body.length > 0) await conn.write(body);
      return;
    }
    if (body === undefined) return;
    /** A failure of the body itself (its source's error, or a length that is not the one announced): the caller's. */
    const bodyFailed = (e: unknown): unknown => {
      if (init.source) init.source.error = { error: e };
      conn.destroy();
      return e;
    };
    let written = 0;
    let piece: IteratorResult<Uint8Array>;
    const it = body[Symbol.asyncIterator]();
    for (;;) {
      try {
        piece = await it.next();
      } catch (e) {
        throw bodyFailed(e);
      }
      if (piece.done) break;
      init.progress?.();
      written += piece.value.length;
      if (written > (length as number)) {
        await it.return?.(undefined);
        throw bodyFailed(new RangeError(`request body longer than its content-length ${length}`));
      }
      try {
        await conn.write(piece.value);
      } catch (e) {
        await it.return?.(undefined).catch(() => {});
        throw e;
      }
    }
    if (written !== length) throw bodyFailed(new RangeError(`request body ended after ${written} of its ${length} bytes`));
  }

  private originOf(url: URL): Origin {
    const key = `${url.protocol}//${url.host}`;
    let o = this.origins.get(key);
    if (o === undefined) {
      o = { idle: [], open: 0, waiting: [] };
      this.origins.set(key, o);
    }
    return o;
  }

  private async acquire(url: URL, signal: AbortSignal): Promise<Connection> {
    const origin = this.originOf(url);
    for (;;) {
      for (let c = origin.idle.pop(); c !== undefined; c = origin.idle.pop()) {
        if (c.usable) {
          c.claim();
          return c;
        }
        c.destroy();
      }
      if (origin.open < this.maxPerOrigin) {
        origin.open++;
        const conn = new Connection(url, this.tlsOptions, (gone) => {
          origin.open--;
          const i = origin.idle.indexOf(gone);
          if (i >= 0) origin.idle.splice(i, 1);
          origin.waiting.shift()?.();
        });
        const abort = () => conn.destroy(signal.reason instanceof Error ? signal.reason : connectionError("aborted"));
        signal.addEventListener("abort", abort, { once: true });
        try {
          await conn.connected();
        } finally {
          signal.removeEventListener("abort", abort);
        }
        return conn;
      }
      await new Promise<void>((resolve, reject) => {
        const abort = () => {
          const i = origin.waiting.indexOf(go);
          if (i >= 0) origin.waiting.splice(i, 1);
          reject(signal.reason);
        };
        const go = () => {
          signal.removeEventListener("abort", abort);
          resolve();
        };
        origin.waiting.push(go);
        signal.addEventListener("abort", abort, { once: true });
      });
    }
  }

  private release(conn: Connection): void {
    const origin = this.originOf(conn.url);
    conn.idle();
    origin.idle.push(conn);
    origin.waiting.shift()?.();
  }
}

interface Head {
  readonly status: number;
  readonly headers: Headers;
  readonly framing: Framing;
  readonly keepAlive: boolean;
}

/** The next final answer's head (1xx answers skipped); undefined if the connection closed before one began. */
async function readAnswer(conn: Connection, method: string): Promise<Head | undefined> {
  for (;;) {
    const raw = await conn.readHead();
    if (raw === undefined) return undefined;
    const lines = raw.toString("latin1").split("\r\n");
    const m = /^HTTP\/1\.([01]) (\d{3})(?: .*)?$/.exec(lines[0] ?? "");
    if (!m) throw connectionError(`not an HTTP/1.x answer: ${JSON.stringify((lines[0] ?? "").slice(0, 80))}`, "EPROTO");
    const status = Number(m[2]);
    const headers = new Headers();
    for (const line of lines.slice(1)) {
      if (line === "") continue;
      const colon = line.indexOf(":");
      if (colon <= 0) throw connectionError(`bad header line in an answer: ${JSON.stringify(line.slice(0, 80))}`, "EPROTO");
      try {
        headers.append(line.slice(0, colon).trim(), line.slice(colon + 1).trim());
      } catch {
        throw connectionError(`bad header line in an answer: ${JSON.stringify(line.slice(0, 80))}`, "EPROTO");
      }
    }
    if (status >= 100 && status < 200) continue; // 100 Continue, 103 Early Hints: the answer follows
    const connection = (headers.get("connection") ?? "").toLowerCase();
    const keepAlive = m[1] === "1" ? !/\bclose\b/.test(connection) : /\bkeep-alive\b/.test(connection);
    return { status, headers, framing: framingOf(method, status, headers), keepAlive };
  }
}

/** How the body ends (RFC 9112 section 6.3). */
function framingOf(method: string, status: number, headers: Headers): Framing {
  if (method === "HEAD" || status === 204 || status === 304) return { kind: "none" };
  const te = headers.get("transfer-encoding");
  if (te !== null) return /(^|,)\s*chunked\s*$/i.test(te) ? { kind: "chunked" } : { kind: "close" };
  const cl = headers.get("content-length");
  if (cl === null) return { kind: "close" };
  const values = new Set(cl.split(",").map((v) => v.trim()));
  const [only] = values;
  if (values.size !== 1 || only === undefined || !/^\d+$/.test(only))
    throw connectionError(`bad content-length ${JSON.stringify(cl)}`, "EPROTO");
  return Number(only) === 0 ? { kind: "none" } : { kind: "length", length: Number(only) };
}

/** The body's pieces as views into the connection's buffer; `complete` is called once its last byte is read. */
async function* readBody(conn: Connection, framing: Framing, complete: () => void): AsyncGenerator<Uint8Array> {
  if (framing.kind === "length") {
    let left = framing.length;
    while (left > 0) {
      if (!(await conn.fill())) throw connectionError(`socket hang up after ${framing.length - left} of ${framing.length} body bytes`);
      const view = conn.view(left);
      left -= view.length;
      if (left === 0) complete();
      yield view;
    }
    return;
  }
  if (framing.kind === "close") {
    while (await conn.fill()) yield conn.view(Number.POSITIVE_INFINITY);
    return; // never reusable: the connection is closed
  }
  if (framing.kind === "chunked") {
    for (;;) {
      const line = await conn.readLine();
      const size = /^([0-9a-fA-F]{1,12})\s*(;.*)?$/.exec(line)?.[1];
      if (size === undefined) throw connectionError(`bad chunk size line ${JSON.stringify(line.slice(0, 40))}`, "EPROTO");
      let left = Number.parseInt(size, 16);
      if (left === 0) {
        while ((await conn.readLine()) !== "") {
          // trailers: dropped
        }
        complete();
        return;
      }
      while (left > 0) {
        if (!(await conn.fill())) throw connectionError("the connection closed within a chunked body");
        const view = conn.view(left);
        left -= view.length;
        yield view;
      }
      if ((await conn.readLine()) !== "") throw connectionError("a body chunk is not followed by CRLF", "EPROTO");
    }
  }
}
