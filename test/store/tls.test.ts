// GcsStore over TLS, as every request to Cloud Storage goes (issue 25). A TLS socket hands the reader the decrypted
// records it already holds one callback after another, where plain TCP gives one read per callback, so a client
// that reads into a buffer it reuses and pauses by refusing the next read corrupts a large body whose reader
// awaits I/O between pieces; and kept-alive TLS connections that the server closes must not fail a request.
// Against fake-gcs-server over HTTPS (the global setup), and for the closing server a node:https stand-in: no
// emulator closes a kept-alive connection at a chosen moment.
import { createHash, randomBytes } from "node:crypto";
import { open, rm } from "node:fs/promises";
import type { IncomingMessage, ServerResponse } from "node:http";
import { createServer, type Server } from "node:https";
import type { AddressInfo, Socket } from "node:net";
import { join } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { afterAll, beforeAll, describe, expect, test } from "vitest";
import { crc32c } from "../../src/codecs/crc32c.js";
import { GcsStore } from "../../src/store/gcs.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";
import { serverTls } from "../helpers/tls.mjs";
import { tempDir } from "../helpers/tmp.js";

const MiB = 1 << 20;
const SIZE = 256 * MiB;
/** For the closing server: a hang must fail the test at its timeout, not pass as a stall retried after 30 s. */
const PATIENT = { timeouts: { stallMs: 600_000 } };

/** sha256 (hex) and length of a stream of pieces, each hashed only after `between` resolved: the reader held it. */
async function digestHolding(pieces: AsyncIterable<Uint8Array>, between: (piece: Uint8Array) => Promise<void>) {
  const hash = createHash("sha256");
  let length = 0;
  for await (const piece of pieces) {
    await between(piece);
    hash.update(piece);
    length += piece.length;
  }
  return { sha256: hash.digest("hex"), length };
}

describe("256 MiB of random bytes from fake-gcs-server over HTTPS", () => {
  let bucket: string;
  let store: GcsStore;
  /** The source object's sha256 and CRC-32C, computed as it was generated (never held whole). */
  let sha256: string;
  let crc: number;

  beforeAll(async () => {
    bucket = await newBucket("tls");
    store = new GcsStore(bucket, "", undefined, emulatorStorage()); // the defaults: a stall fails within minutes, with its cause
    // Uploaded by Google's client library, not by the store under test, in 1 MiB random pieces hashed on the way.
    const hash = createHash("sha256");
    crc = 0;
    async function* random() {
      for (let done = 0; done < SIZE; done += MiB) {
        const piece = randomBytes(MiB);
        hash.update(piece);
        crc = crc32c(piece, crc);
        yield piece;
      }
    }
    const file = emulatorStorage().bucket(bucket).file("source");
    await pipeline(Readable.from(random()), file.createWriteStream({ resumable: false, validation: false }));
    sha256 = hash.digest("hex");
  }, 300_000);

  afterAll(async () => {
    // fake-gcs-server keeps objects in memory for the whole run.
    await emulatorStorage().bucket(bucket).deleteFiles({ force: true });
  });

  test("a streamed download whose reader writes each piece to a file before it takes the next arrives bit-exact", async () => {
    const dir = tempDir("tls");
    const fh = await open(join(dir, "download"), "w");
    try {
      const got = await digestHolding(store.readStream("source", 0, SIZE), async (piece) => {
        await fh.write(piece); // real I/O: the piece is held across a turn of the event loop and more
      });
      expect(got).toEqual({ sha256, length: SIZE });
      expect((await fh.stat()).size).toBe(SIZE);
    } finally {
      await fh.close();
      await rm(dir, { recursive: true, force: true });
    }
  }, 300_000);

  test("a streamed download whose reader waits a timer between pieces arrives bit-exact", async () => {
    const got = await digestHolding(store.readStream("source", 0, SIZE), () => new Promise((r) => setTimeout(r, 0)));
    expect(got).toEqual({ sha256, length: SIZE });
  }, 300_000);

  test("a TLS to TLS streamed copy (a download piped into an upload, as the conversion copies) stores the same bytes", async () => {
    const w = await store.write("copy", store.readStream("source", 0, SIZE));
    expect(w).toEqual({ size: SIZE, crc32c: crc });
    expect((await store.stat("copy"))?.crc32c).toBe(crc);
    // Read back by Google's client library, not by the store under test.
    const hash = createHash("sha256");
    let length = 0;
    for await (const piece of emulatorStorage().bucket(bucket).file("copy").createReadStream({ validation: false })) {
      hash.update(piece as Buffer);
      length += (piece as Buffer).length;
    }
    expect({ sha256: hash.digest("hex"), length }).toEqual({ sha256, length: SIZE });
  }, 300_000);
});

/**
 * A stand-in for GCS's media download (GET /storage/v1/b/B/o/NAME?alt=media, every object the same bytes) over
 * HTTPS with kept-alive connections, which closes one connection, once, when `close` says so, given the count of
 * requests its connection carried so far (1 for its first). Which connection a client reuses, and when, is its
 * pool's choice: the rule names a request by its place on its connection, not by connection.
 */
async function closingServer(body: Buffer, close: (nth: number) => "before-answer" | "after-answer" | undefined) {
  const seen = new WeakMap<Socket, number>();
  const stats = { connections: 0, requests: 0, closed: 0 };
  let gone!: () => void;
  /** Resolves once the connection the server closed is closed on the client's side too: the client saw the close. */
  const seenClosed = new Promise<void>((resolve) => (gone = resolve));
  const server: Server = createServer(serverTls(), (req: IncomingMessage, res: ServerResponse) => {
    stats.requests++;
    const nth = (seen.get(req.socket) ?? 0) + 1;
    seen.set(req.socket, nth);
    const when = stats.closed === 0 ? close(nth) : undefined;
    if (when === "before-answer") {
      // The server had closed this idle connection as the request crossed it on the wire: no answer at all.
      stats.closed++;
      req.socket.once("close", gone);
      req.socket.destroy();
      return;
    }
    res.writeHead(200, { "content-type": "application/octet-stream", "content-length": body.length });
    res.end(body, () => {
      if (when !== "after-answer") return;
      // Idle after its answer, the connection is closed by the server (as an idle timeout does) before the next request.
      stats.closed++;
      req.socket.once("close", gone);
      req.socket.end();
    });
  });
  server.on("secureConnection", () => stats.connections++);
  server.keepAliveTimeout = 60_000; // only `close` closes
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  const client = {
    apiEndpoint: `https://127.0.0.1:${(server.address() as AddressInfo).port}`,
    customEndpoint: true,
    authClient: { getRequestHeaders: async () => ({}) },
  };
  return {
    store: new GcsStore("b", "", undefined, client, PATIENT),
    stats,
    seenClosed,
    close: () => {
      server.closeAllConnections();
      return new Promise<void>((r) => server.close(() => r()));
    },
  };
}

describe("kept-alive TLS connections the server closes", () => {
  const body = randomBytes(64 * 1024);
  const READS = 4;

  test("a connection the server closed while idle is let go, and no later request is sent on it", async () => {
    const s = await closingServer(body, (nth) => (nth === 1 ? "after-answer" : undefined));
    try {
      expect(Buffer.from(await s.store.read("obj")).equals(body)).toBe(true);
      await s.seenClosed; // the client closed its side: it knows (a pool that keeps it half-open fails at the timeout)
      for (let i = 1; i < READS; i++) expect(Buffer.from(await s.store.read("obj")).equals(body)).toBe(true);
      expect(s.stats).toMatchObject({ closed: 1, requests: READS }); // none lost on the closed connection
    } finally {
      await s.close();
    }
  });

  test("a request sent on a kept-alive connection just as the server closes it still succeeds: sent again, on another", async () => {
    // The first request a connection carries after its first: the connection is being reused.
    const s = await closingServer(body, (nth) => (nth === 2 ? "before-answer" : undefined));
    try {
      for (let i = 0; i < READS; i++) expect(Buffer.from(await s.store.read("obj")).equals(body)).toBe(true);
      expect(s.stats).toMatchObject({ closed: 1, requests: READS + 1 }); // the request the server dropped came again
    } finally {
      await s.close();
    }
  });
});
