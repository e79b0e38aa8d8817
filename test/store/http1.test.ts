// The HTTP/1.1 client (src/store/http1.ts) against raw TCP and TLS servers that answer exactly as each test says.
import { spawnSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync } from "node:fs";
import net from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import tls from "node:tls";
import { afterEach, describe, expect, test } from "vitest";
import { Pool, type RequestInit, type Wire } from "../../src/store/http1.js";

/** A server that reads each request (head and body, by its content-length) and answers with `answer(request, socket)`. */
interface Seen {
  readonly head: string;
  readonly body: Buffer;
}
type Answer = (req: Seen, socket: net.Socket) => void;

const servers: net.Server[] = [];
const sockets = new Set<net.Socket>();
afterEach(async () => {
  for (const s of sockets) s.destroy(); // the pools' idle connections
  sockets.clear();
  for (const s of servers.splice(0)) await new Promise<void>((r) => s.close(() => r()));
});

function serve(answer: Answer, secure?: { key: Buffer; cert: Buffer }): Promise<{ url: URL; connections: () => number; requests: Seen[] }> {
  let connections = 0;
  const requests: Seen[] = [];
  const onSocket = (socket: net.Socket) => {
    connections++;
    sockets.add(socket);
    let pending = Buffer.alloc(0);
    socket.on("error", () => {});
    socket.on("data", (d: Buffer) => {
      pending = Buffer.concat([pending, d]);
      for (;;) {
        const end = pending.indexOf("\r\n\r\n");
        if (end < 0) return;
        const head = pending.subarray(0, end).toString("latin1");
        const length = Number(/\r\ncontent-length: (\d+)/i.exec(head)?.[1] ?? 0);
        if (pending.length < end + 4 + length) return;
        const req = { head, body: Buffer.from(pending.subarray(end + 4, end + 4 + length)) };
        pending = pending.subarray(end + 4 + length);
        requests.push(req);
        answer(req, socket);
      }
    });
  };
  const server = secure ? tls.createServer(secure, onSocket) : net.createServer(onSocket);
  servers.push(server);
  return new Promise((resolve) =>
    server.listen(0, "127.0.0.1", () => {
      const port = (server.address() as net.AddressInfo).port;
      resolve({ url: new URL(`${secure ? "https" : "http"}://127.0.0.1:${port}/o?x=1`), connections: () => connections, requests });
    }),
  );
}

const ok = (body: string | Buffer, extra = "") => {
  const b = typeof body === "string" ? Buffer.from(body) : body;
  return Buffer.concat([Buffer.from(`HTTP/1.1 200 OK\r\ncontent-length: ${b.length}\r\n${extra}\r\n`), b]);
};

const init = (url: URL, more: Partial<RequestInit> = {}): RequestInit => ({
  method: "GET",
  url,
  headers: {},
  signal: new AbortController().signal,
  ...more,
});

async function text(w: Wire): Promise<string> {
  const parts: Buffer[] = [];
  for await (const p of w.pieces ?? []) parts.push(Buffer.from(p));
  return Buffer.concat(parts).toString();
}

describe("answers", () => {
  test("a Content-Length body arrives whole, its pieces views into one buffer the connection reuses", async () => {
    const body = Buffer.alloc(1 << 20, 0);
    for (let i = 0; i < body.length; i++) body[i] = (i * 7) & 0xff;
    const s = await serve((_, socket) => socket.write(ok(body)));
    const w = await new Pool(4).request(init(s.url));
    const buffers = new Set<ArrayBufferLike>();
    const parts: Buffer[] = [];
    for await (const p of w.pieces ?? []) {
      buffers.add(p.buffer);
      parts.push(Buffer.from(p));
    }
    expect(w.status).toBe(200);
    expect(Buffer.concat(parts).equals(body)).toBe(true);
    expect(parts.length).toBeGreaterThan(2);
    expect(buffers.size).toBe(1);
  });

  test("a chunked body is decoded, chunk extensions and trailers dropped", async () => {
    const s = await serve((_, socket) =>
      socket.write(
        "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\nx-trailer: y\r\n\r\n",
      ),
    );
    const w = await new Pool(4).request(init(s.url));
    expect(await text(w)).toBe("hello world");
  });

  test("a body without a length ends with the connection, which is not used again", async () => {
    const s = await serve((_, socket) => socket.end("HTTP/1.1 200 OK\r\n\r\nuntil close"));
    const pool = new Pool(4);
    expect(await text(await pool.request(init(s.url)))).toBe("until close");
    expect(await text(await pool.request(init(s.url)))).toBe("until close");
    expect(s.connections()).toBe(2);
  });

  test("interim 1xx answers are skipped", async () => {
    const s = await serve((_, socket) =>
      socket.write(Buffer.concat([Buffer.from("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: x\r\n\r\n"), ok("final")])),
    );
    const w = await new Pool(4).request(init(s.url));
    expect(w.status).toBe(200);
    expect(await text(w)).toBe("final");
  });

  test("an answer without a body (204, HEAD) has no pieces, and its connection is used again", async () => {
    const s = await serve((req, socket) =>
      socket.write(req.head.startsWith("HEAD") ? "HTTP/1.1 200 OK\r\ncontent-length: 99\r\n\r\n" : "HTTP/1.1 204 No Content\r\n\r\n"),
    );
    const pool = new Pool(4);
    expect((await pool.request(init(s.url))).pieces).toBeNull();
    expect((await pool.request(init(s.url, { method: "HEAD" }))).pieces).toBeNull();
    expect(s.connections()).toBe(1);
  });

  test("a head split across many reads is parsed, headers repeated joined", async () => {
    const s = await serve(async (_, socket) => {
      for (const c of "HTTP/1.1 201 Created\r\nx-a: 1\r\nX-A: 2\r\ncontent-length: 2\r\n\r\nok") {
        socket.write(c);
        await new Promise((r) => setTimeout(r, 1));
      }
    });
    const w = await new Pool(4).request(init(s.url));
    expect(w.status).toBe(201);
    expect(w.headers.get("x-a")).toBe("1, 2");
    expect(await text(w)).toBe("ok");
  });
});

describe("connections", () => {
  test("a kept-alive connection serves the next request once the body was read", async () => {
    const s = await serve((_, socket) => socket.write(ok("again")));
    const pool = new Pool(4);
    for (let i = 0; i < 3; i++) expect(await text(await pool.request(init(s.url)))).toBe("again");
    expect(s.connections()).toBe(1);
  });

  test("an answer saying `connection: close` is not followed by a request on its connection", async () => {
    const s = await serve((_, socket) => socket.write(ok("bye", "connection: close\r\n")));
    const pool = new Pool(4);
    await text(await pool.request(init(s.url)));
    await text(await pool.request(init(s.url)));
    expect(s.connections()).toBe(2);
  });

  test("a body left before its end closes the connection; one left after its last byte keeps it", async () => {
    const s = await serve((_, socket) => socket.write(ok(Buffer.alloc(300_000, 1))));
    const pool = new Pool(4);
    const early = await pool.request(init(s.url));
    for await (const _ of early.pieces ?? []) break;
    let seen = 0;
    const exact = await pool.request(init(s.url));
    for await (const p of exact.pieces ?? []) {
      seen += p.length;
      if (seen === 300_000) break;
    }
    await text(await pool.request(init(s.url)));
    expect(s.connections()).toBe(2);
  });

  test("a body cut short by the server fails as a reset connection", async () => {
    const s = await serve((_, socket) => socket.end("HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nshort"));
    const w = await new Pool(4).request(init(s.url));
    await expect(text(w)).rejects.toMatchObject({ code: "ECONNRESET" });
  });

  test("a server that closes without answering fails the request as a hang-up", async () => {
    const s = await serve((_, socket) => socket.destroy());
    await expect(new Pool(4).request(init(s.url))).rejects.toThrow(/socket hang up|ECONNRESET/);
  });

  test("no more than the pool's connections are open at once; a further request waits for one", async () => {
    let open = false;
    const held: net.Socket[] = [];
    const s = await serve((_, socket) => (open ? socket.write(ok("late")) : held.push(socket)));
    const pool = new Pool(2);
    const answers = Promise.all([1, 2, 3].map(async () => text(await pool.request(init(s.url)))));
    await new Promise((r) => setTimeout(r, 100));
    expect(s.connections()).toBe(2);
    expect(held.length).toBe(2);
    open = true;
    for (const h of held) h.write(ok("now"));
    expect(await answers).toEqual(["now", "now", "late"]);
    expect(s.connections()).toBe(2);
  });

  test("an abort destroys the connection and fails the request with the signal's reason", async () => {
    const s = await serve(() => {});
    const controller = new AbortController();
    const why = new Error("deadline");
    setTimeout(() => controller.abort(why), 50);
    await expect(new Pool(4).request(init(s.url, { signal: controller.signal }))).rejects.toBe(why);
  });
});

describe("requests", () => {
  test("the head carries the path, the host and the body's length", async () => {
    const s = await serve((_, socket) => socket.write(ok("")));
    await new Pool(4).request(init(s.url, { method: "POST", headers: { "X-Goog-Thing": "v" }, body: Buffer.from("abc") }));
    const [req] = s.requests;
    expect(req?.head).toMatch(/^POST \/o\?x=1 HTTP\/1\.1\r\n/);
    expect(req?.head).toContain(`host: ${s.url.host}`);
    expect(req?.head).toContain("X-Goog-Thing: v");
    expect(req?.head).toContain("content-length: 3");
    expect(req?.body.toString()).toBe("abc");
  });

  test("a PUT without a body says Content-Length: 0 (a resumable upload's status query)", async () => {
    const s = await serve((_, socket) => socket.write(ok("")));
    await new Pool(4).request(init(s.url, { method: "PUT" }));
    expect(s.requests[0]?.head).toContain("content-length: 0");
  });

  test("a streamed body is written piece by piece, each write done before the next piece is pulled", async () => {
    const s = await serve((req, socket) => socket.write(ok(String(req.body.length))));
    const piece = Buffer.alloc(256 << 10);
    const n = 40;
    async function* reused() {
      for (let i = 0; i < n; i++) {
        piece.fill(i); // the one buffer, refilled: only safe if the last write is done
        yield piece;
      }
    }
    const w = await new Pool(4).request(
      init(s.url, { method: "PUT", headers: { "content-length": String(n * piece.length) }, body: reused() }),
    );
    expect(await text(w)).toBe(String(n * piece.length));
    const got = s.requests[0]?.body as Buffer;
    for (let i = 0; i < n; i++) expect(got[i * piece.length + 100]).toBe(i);
  });

  test("a request whose connection fails while its body waits on a stalled source fails at once", async () => {
    const s = await serve(() => {});
    const server = servers.at(-1) as net.Server;
    server.on("connection", (socket) => setTimeout(() => socket.destroy(), 50));
    const stalled = (async function* () {
      yield Buffer.from("first piece");
      await new Promise(() => {}); // a download that never delivers its next piece
    })();
    const t0 = Date.now();
    await expect(new Pool(4).request(init(s.url, { method: "PUT", headers: { "content-length": "100" }, body: stalled }))).rejects.toThrow(
      /socket hang up|ECONNRESET|EPIPE/,
    );
    expect(Date.now() - t0).toBeLessThan(2_000);
  });

  test("a streamed body needs a content-length", async () => {
    const s = await serve((_, socket) => socket.write(ok("")));
    await expect(
      new Pool(4).request(
        init(s.url, {
          method: "PUT",
          body: (async function* () {
            yield Buffer.from("x");
          })(),
        }),
      ),
    ).rejects.toThrow(TypeError);
  });

  /** A PUT announcing 10 bytes, its body from `body`, its source's error put in `source`. */
  async function putTen(body: AsyncIterable<Uint8Array>, source: { error?: { error: unknown } }): Promise<Wire> {
    const s = await serve((_, socket) => socket.write(ok("")));
    return new Pool(4).request(init(s.url, { method: "PUT", headers: { "content-length": "10" }, body, source }));
  }

  test("a streamed body shorter than its content-length fails, saying how short", async () => {
    const body = (async function* () {
      yield Buffer.from("abc");
    })();
    await expect(putTen(body, {})).rejects.toThrow(/ended after 3 of its 10 bytes/);
  });

  test("an error of a streamed body's own source fails the request as that error", async () => {
    const broken = new Error("the source broke");
    const body = (async function* () {
      yield Buffer.from("abc");
      throw broken;
    })();
    const source: { error?: { error: unknown } } = {};
    await expect(putTen(body, source)).rejects.toBe(broken);
    expect(source.error?.error).toBe(broken);
  });
});

// A self-signed certificate made for the test by the openssl command, where there is one.
const openssl = spawnSync("openssl", ["version"]).status === 0;
describe.skipIf(!openssl)("over TLS (skipped without the openssl command, which makes the test's certificate)", () => {
  test("an answer over TLS arrives whole through the reused buffer, and the connection is kept", async () => {
    const dir = mkdtempSync(join(tmpdir(), "http1-tls-"));
    try {
      const [key, cert] = [join(dir, "k.pem"), join(dir, "c.pem")];
      const r = spawnSync("openssl", [
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        key,
        "-out",
        cert,
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=IP:127.0.0.1",
      ]);
      expect(r.status).toBe(0);
      const secure = { key: readFileSync(key), cert: readFileSync(cert) };
      const body = Buffer.alloc(500_000, 9);
      const s = await serve((_, socket) => socket.write(ok(body)), secure);
      const pool = new Pool(4, { ca: secure.cert });
      for (let i = 0; i < 2; i++) {
        const parts: Buffer[] = [];
        for await (const p of (await pool.request(init(s.url))).pieces ?? []) parts.push(Buffer.from(p));
        expect(Buffer.concat(parts).equals(body)).toBe(true);
      }
      expect(s.connections()).toBe(1);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
