// Http.send's request bodies and credentials, against a stub server on loopback that answers when the test says
// (before, during or after the body), which no GCS emulator can be told to do.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { afterAll, afterEach, beforeAll, describe, expect, test } from "vitest";
import { StorageIoError, TransientError } from "../../src/errors.js";
import { type Credentials, Http, NO_CREDENTIALS } from "../../src/store/http.js";

type Handler = (req: IncomingMessage, res: ServerResponse) => void;
let handler: Handler = (_req, res) => res.end();
let server: Server;
let base: string;

beforeAll(async () => {
  server = createServer((req, res) => handler(req, res));
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const a = server.address();
  base = `http://127.0.0.1:${typeof a === "object" && a ? a.port : 0}`;
});
afterEach(() => {
  handler = (_req, res) => res.end();
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

const http = new Http(NO_CREDENTIALS, { stallMs: 5_000 });
const tick = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** A body of `count` pieces of `size` bytes that records every pull, and can be held before a piece. */
function source(count: number, size: number, hold?: { at: number; until: Promise<void> }) {
  const log = { pulls: 0, returned: false, pulling: false };
  const body = (async function* () {
    try {
      for (let i = 0; i < count; i++) {
        log.pulls++;
        log.pulling = true;
        if (hold?.at === i) await hold.until;
        log.pulling = false;
        yield new Uint8Array(size).fill(i);
      }
    } finally {
      log.returned = true;
    }
  })();
  return { body, log, length: String(count * size) };
}

describe("a streamed request body", () => {
  test("goes out whole, and its source is read to its end before the answer is handed back", async () => {
    let got = 0;
    handler = (req, res) => {
      req.on("data", (d: Buffer) => {
        got += d.length;
      });
      req.on("end", () => res.end("ok"));
    };
    const s = source(8, 64 << 10);
    const a = await http.send("PUT", `${base}/`, { headers: { "content-length": s.length }, body: s.body, accept: [200], path: "p" });
    await a.discard();
    expect(got).toBe(8 * (64 << 10));
    expect(s.log.pulls).toBe(8);
    expect(s.log.returned).toBe(true);
  });

  test("is not pulled once its request has failed, and the failure waits for the pull under way", async () => {
    let release!: () => void;
    const until = new Promise<void>((r) => {
      release = r;
    });
    // The server cuts the connection once the first pieces are in, while the source is held on its fourth.
    handler = (req) => {
      let got = 0;
      req.on("data", (d: Buffer) => {
        got += d.length;
        if (got >= 3 * 1024) req.socket.destroy();
      });
    };
    const s = source(16, 1024, { at: 3, until });
    let settled = false;
    const sent = http
      .send("PUT", `${base}/`, { headers: { "content-length": s.length }, body: s.body, accept: [200], path: "p" })
      .catch((e: unknown) => e)
      .finally(() => {
        settled = true;
      });
    while (!s.log.pulling || s.log.pulls < 4) await tick(5);
    await tick(200); // the connection is gone by now
    expect(settled).toBe(false); // a pull is still under way: send() has not settled
    release();
    expect(await sent).toBeInstanceOf(TransientError);
    const pulls = s.log.pulls;
    await tick(100);
    expect(s.log.pulls).toBe(pulls); // nothing pulled after the failure
    expect(s.log.returned).toBe(true);
  });

  test("is not pulled once the server answered before taking all of it", async () => {
    let release!: () => void;
    const until = new Promise<void>((r) => {
      release = r;
    });
    handler = (_req, res) => {
      res.writeHead(400, { "content-type": "application/json" }).end(JSON.stringify({ error: { message: "refused early" } }));
    };
    const s = source(64, 1024, { at: 2, until });
    const sent = http.send("PUT", `${base}/`, { headers: { "content-length": s.length }, body: s.body, accept: [200, 400], path: "p" });
    setTimeout(release, 300);
    const a = await sent.catch((e: unknown) => e);
    if (!(a instanceof Error)) await (a as { discard(): Promise<void> }).discard();
    const pulls = s.log.pulls;
    await tick(100);
    expect(pulls).toBeLessThan(64);
    expect(s.log.pulls).toBe(pulls);
    expect(s.log.returned).toBe(true);
  });

  test("needs a content-length", async () => {
    const s = source(1, 10);
    await expect(http.send("PUT", `${base}/`, { body: s.body, accept: [200], path: "gs://b/o" })).rejects.toThrow(
      /needs a content-length \(gs:\/\/b\/o\)/,
    );
  });

  test("shorter than its content-length fails, saying how short", async () => {
    handler = (req, res) => req.on("end", () => res.end()).resume();
    const s = source(2, 10);
    await expect(
      http.send("PUT", `${base}/`, { headers: { "content-length": "30" }, body: s.body, accept: [200], path: "p" }),
    ).rejects.toThrow("request body ended after 20 of its 30 bytes");
  });

  test("longer than its content-length fails, saying so", async () => {
    handler = (req, res) => req.on("end", () => res.end()).resume();
    const s = source(4, 10);
    await expect(
      http.send("PUT", `${base}/`, { headers: { "content-length": "20" }, body: s.body, accept: [200], path: "p" }),
    ).rejects.toThrow("request body longer than its content-length 20");
  });

  test("whose own source fails fails the request with that error, as it is", async () => {
    handler = (req, res) => req.on("end", () => res.end()).resume();
    const boom = new RangeError("the source broke");
    const body = (async function* () {
      yield new Uint8Array(10);
      throw boom;
    })();
    await expect(http.send("PUT", `${base}/`, { headers: { "content-length": "20" }, body, accept: [200], path: "p" })).rejects.toBe(boom);
  });
});

describe("credentials", () => {
  const counting = () => {
    const c = { refreshes: 0, token: "t0" };
    const credentials: Credentials = {
      headers: async () => ({ authorization: `Bearer ${c.token}` }),
      refresh: async () => {
        c.refreshes++;
        c.token = `t${c.refreshes}`;
      },
    };
    return { c, credentials };
  };

  test("a 401 renews the token once and is retried; the renewed token is sent", async () => {
    const seen: string[] = [];
    handler = (req, res) => {
      if (req.url === "/renewed") seen.push(req.headers.authorization ?? "");
      res.writeHead(req.headers.authorization === "Bearer t1" ? 200 : 401).end();
    };
    const { c, credentials } = counting();
    const h = new Http(credentials, { stallMs: 5_000 });
    const first = await h.send("GET", `${base}/renewed`, { accept: [200], path: "p" }).catch((e: unknown) => e);
    expect(first).toBeInstanceOf(TransientError);
    expect(c.refreshes).toBe(1);
    const again = await h.send("GET", `${base}/renewed`, { accept: [200], path: "p" });
    expect(again.status).toBe(200);
    expect(seen).toEqual(["Bearer t0", "Bearer t1"]);
  });

  test("a 401 right after a renewal is final, and says the token was renewed", async () => {
    handler = (_req, res) => res.writeHead(401).end(JSON.stringify({ error: { message: "Invalid Credentials" } }));
    const { c, credentials } = counting();
    const h = new Http(credentials, { stallMs: 5_000 });
    expect(await h.send("GET", `${base}/`, { accept: [200], path: "p" }).catch((e: unknown) => e)).toBeInstanceOf(TransientError);
    const e = await h.send("GET", `${base}/`, { accept: [200], path: "p" }).catch((e: unknown) => e);
    expect(e).toBeInstanceOf(StorageIoError);
    expect((e as Error).message).toContain("HTTP 401 (Invalid Credentials) after the access token was renewed");
    expect(c.refreshes).toBe(1);
  });

  test("an emulator's 401 (no credentials sent) is final at once", async () => {
    handler = (_req, res) => res.writeHead(401).end();
    expect(await http.send("GET", `${base}/`, { accept: [200], path: "p" }).catch((e: unknown) => e)).toBeInstanceOf(StorageIoError);
  });
});
