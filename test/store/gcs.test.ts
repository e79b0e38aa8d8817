import { connect, createServer } from "node:net";
import { beforeAll, describe, expect, inject, test } from "vitest";
import { DestinationError, NotFoundError } from "../../src/errors.js";
import { GcsStore } from "../../src/store/gcs.js";
import { openStore } from "../../src/store/open.js";
import { resetRetryStats, retryStats } from "../../src/store/retry.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";

// Against the real GCS emulator (fake-gcs-server) on loopback, started by the global setup. The
// behaviours GcsStore shares with LocalStore (read, ranges, list, listDir, write, createExclusive,
// delete, stat, key refusal) are in contract.test.ts; here only what is specific to GCS: gs:// URLs
// and the CRC-32C GCS keeps for every object.
describe("GcsStore on fake-gcs-server", () => {
  let bucket: string;
  let store: GcsStore;
  const bytes = Uint8Array.from({ length: 256 }, (_, i) => i);

  beforeAll(async () => {
    bucket = await newBucket("store");
    store = new GcsStore(bucket, "root/dir", undefined, emulatorStorage());
    await store.write("obj", bytes);
    for (const k of ["a/1", "a/0/z", "a.b", "ab", "b/2"]) await store.write(`tree/${k}`, new Uint8Array(3));
  });

  test("a download whose reader holds each piece longer than the stall timeout is not a stall", async () => {
    const slow = new GcsStore(bucket, "root/dir", undefined, emulatorStorage(), { timeouts: { stallMs: 100 } });
    const data = Uint8Array.from({ length: 1 << 20 }, (_, i) => (i * 7) & 0xff);
    await slow.write("held", data);
    resetRetryStats();
    const pieces: Uint8Array[] = [];
    for await (const p of slow.readStream("held", 0, data.length)) {
      if (pieces.length < 3) await new Promise((r) => setTimeout(r, 250)); // an upload waiting for its chunk's answer
      pieces.push(Buffer.from(p));
    }
    expect(Buffer.concat(pieces).equals(data)).toBe(true);
    expect(retryStats().retries).toBe(0);
  });

  test("ranged downloads read to their length and resumable chunks' answers leave their connections open for the next request", async () => {
    // A TCP proxy in front of the emulator counts the connections the store opens (TLS passes through it).
    const target = new URL(inject("gcsEndpoint"));
    let connections = 0;
    const proxy = createServer((client) => {
      connections++;
      const upstream = connect(Number(target.port), target.hostname);
      client.pipe(upstream).pipe(client);
      const close = () => {
        client.destroy();
        upstream.destroy();
      };
      client.on("error", close).on("close", close);
      upstream.on("error", close).on("close", close);
    });
    await new Promise<void>((r) => proxy.listen(0, "127.0.0.1", r));
    try {
      const port = (proxy.address() as { port: number }).port;
      const client = { ...emulatorStorage(), apiEndpoint: `https://127.0.0.1:${port}`, customEndpoint: true };
      const counted = new GcsStore(bucket, "root/kept", undefined, client, { chunkBytes: 256 << 10 });
      const data = Uint8Array.from({ length: 1 << 20 }, (_, i) => (i * 13) & 0xff);
      await counted.write("source", data);
      const before = connections;
      // Each copy: a ranged download consumed to exactly its length, a resumable session, four chunks.
      for (let i = 0; i < 4; i++) await counted.write(`copy-${i}`, counted.readStream("source", 0, data.length));
      expect(Buffer.from(await counted.read("copy-3")).equals(data)).toBe(true);
      expect(connections - before).toBeLessThanOrEqual(2);
    } finally {
      proxy.close();
    }
  });

  test("a missing object is a NotFoundError naming its gs:// URL", async () => {
    await expect(store.read("missing")).rejects.toThrow(NotFoundError);
    await expect(store.read("missing")).rejects.toThrow(`gs://${bucket}/root/dir/missing`);
  });

  test("stat and list give GCS's own CRC-32C of the object", async () => {
    const data = new TextEncoder().encode("123456789");
    expect(await store.write("crc", data)).toEqual({ size: 9, crc32c: 0xe3069283 });
    async function* pieces() {
      yield data.subarray(0, 4);
      yield data.subarray(4);
    }
    expect(await store.write("crc-streamed", pieces())).toEqual({ size: 9, crc32c: 0xe3069283 });
    expect((await store.stat("crc"))?.crc32c).toBe(0xe3069283);
    const listed = [];
    for await (const o of store.list("crc")) listed.push(o);
    expect(listed.map((o) => o.crc32c)).toEqual([0xe3069283, 0xe3069283]);
  });

  test("listDir files carry their CRC-32C", async () => {
    expect(await store.listDir("tree")).toEqual({
      files: [
        { key: "tree/a.b", size: 3, crc32c: 0x6064a37a, version: expect.any(String) },
        { key: "tree/ab", size: 3, crc32c: 0x6064a37a, version: expect.any(String) },
      ],
      dirs: ["a", "b"],
    });
    expect((await store.listDir("")).dirs).toEqual(["tree"]);
  });

  test("openStore maps gs://bucket/prefix to a GcsStore", async () => {
    const s = await openStore(`gs://${bucket}/root/dir/`);
    expect(s).toBeInstanceOf(GcsStore);
    expect(await s.read("obj")).toEqual(bytes);
  });
});

describe("a bucket that does not exist", () => {
  const missing = "orbax2reg-no-such-bucket-7e1f";
  const store = () => new GcsStore(missing, "root", undefined, emulatorStorage(), { chunkBytes: 256 * 1024 });

  test("a listing is a DestinationError saying so, naming the listed prefix", async () => {
    const listing = (async () => {
      for await (const _ of store().list("x/")) break;
    })();
    await expect(listing).rejects.toThrow(DestinationError);
    await expect(store().listDir("x")).rejects.toThrow(new RegExp(`^gs://${missing}/root/x\\S*: no such bucket \\(HTTP 404`));
  });

  test("an upload, multipart or resumable, is a DestinationError saying so, naming the object", async () => {
    await expect(store().write("small", new Uint8Array(3))).rejects.toThrow(`gs://${missing}/root/small: no such bucket (HTTP 404`);
    await expect(store().write("large", new Uint8Array(600 * 1024))).rejects.toThrow(
      `gs://${missing}/root/large: no such bucket (HTTP 404`,
    );
  });

  test("a read is a missing object, as GCS answers it", async () => {
    await expect(store().read("obj")).rejects.toThrow(NotFoundError);
  });
});
