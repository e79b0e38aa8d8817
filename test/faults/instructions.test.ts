// The instruction proxy (instructions.ts) must never leave a request open at the storage-testbench: gunicorn
// gives each request a thread until its body has come, with no deadline, so every request the proxy starts
// upstream and does not finish holds one of the testbench's 16 threads for good, and 16 of them stop it for
// every test after (docs/testing.md). Here the upstream is a plain HTTPS server on loopback that records which
// requests reached it and whether each one's body came whole, so the proxy's own behaviour is what is tested.
import type { IncomingMessage, ServerResponse } from "node:http";
import { connect, type TLSSocket } from "node:tls";
import { afterEach, beforeEach, describe, expect, test } from "vitest";
import { type InstructionProxy, startInstructionProxy } from "./instructions.js";
import { httpsServer, type Listening, listenOnLoopback } from "./loopback.js";

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

interface Arrival {
  readonly url: string;
  /** Whether its whole body came; undefined while it is still coming. */
  whole?: boolean;
  /** Answers it (the upstream holds every answer until the test says). */
  answer(): void;
}

describe("the instruction proxy lets go of the testbench when its client does", () => {
  let upstream: Listening;
  let proxy: InstructionProxy;
  const arrived: Arrival[] = [];
  /** Connections open at the upstream: one the proxy opened and sends nothing on holds a testbench thread too. */
  let connections = 0;

  beforeEach(async () => {
    arrived.length = 0;
    const server = httpsServer((req: IncomingMessage, res: ServerResponse) => {
      const a: Arrival = { url: req.url ?? "/", answer: () => res.writeHead(308, { "content-length": "0" }).end() };
      arrived.push(a);
      req.on("end", () => (a.whole ??= true));
      req.on("close", () => (a.whole ??= req.complete));
      req.resume();
    });
    connections = 0;
    server.on("secureConnection", (s: TLSSocket) => {
      connections++;
      s.on("close", () => connections--);
    });
    upstream = await listenOnLoopback(server, "upstream");
    proxy = await startInstructionProxy({ upstream: upstream.url, seed: 1, rate: 0 });
  });
  afterEach(async () => {
    await proxy.close();
    await upstream.close();
  });

  /** A chunk of upload session `id` sent by hand: its head and `sent` of its 1,000 bytes, nothing more yet. */
  const chunk = async (id: string, sent: number): Promise<TLSSocket> => {
    const { hostname, port } = new URL(proxy.url);
    const s = connect(Number(port), hostname);
    await new Promise((resolve) => s.once("secureConnect", resolve));
    s.write(
      `PUT /upload/storage/v1/b/b/o?uploadType=resumable&upload_id=${id} HTTP/1.1\r\nhost: ${hostname}\r\n` +
        "content-type: application/octet-stream\r\ncontent-length: 1000\r\ncontent-range: bytes 0-999/*\r\n\r\n",
    );
    if (sent > 0) s.write(Buffer.alloc(sent, 7));
    return s;
  };
  const until = async (what: () => boolean) => {
    for (let i = 0; i < 100 && !what(); i++) await sleep(20);
    expect(what()).toBe(true);
  };

  test("a chunk its client gives up on while it waits for the session's turn is never sent", async () => {
    const first = await chunk("s1", 1000); // whole; its answer held back, so the session's next chunk waits
    await until(() => arrived.length === 1);
    const second = await chunk("s1", 100); // part of its body, then the client gives up, before its turn
    await sleep(100);
    second.destroy();
    await sleep(100);
    arrived[0]?.answer();
    await sleep(300); // the second chunk's turn has come and gone
    first.destroy();
    expect(arrived.map((a) => a.whole)).toEqual([true]);
    await until(() => connections === 0);
  });

  test("a chunk its client gives up on halfway through its body is cut at the testbench too", async () => {
    const only = await chunk("s2", 100);
    await until(() => arrived.length === 1);
    only.destroy();
    await until(() => arrived[0]?.whole !== undefined);
    expect(arrived[0]?.whole).toBe(false);
    await until(() => connections === 0);
  });
});
