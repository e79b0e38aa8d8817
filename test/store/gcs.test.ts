import { beforeAll, describe, expect, test } from "vitest";
import { FormatError, NotFoundError, UsageError } from "../../src/errors.js";
import { GcsStore } from "../../src/store/gcs.js";
import { openStore } from "../../src/store/open.js";
import { emulatorStorage, newBucket } from "../helpers/gcs.js";

// Against the real GCS emulator (fake-gcs-server) on loopback, started by the global setup.
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

  test("reads back a whole object", async () => {
    expect(await store.read("obj")).toEqual(bytes);
  });

  test("ranged reads return exactly the requested bytes (the client's end is inclusive)", async () => {
    expect([...(await store.readRange("obj", 10, 3))]).toEqual([10, 11, 12]);
    expect([...(await store.readRange("obj", 255, 1))]).toEqual([255]);
    expect((await store.readRange("obj", 0, 0)).length).toBe(0);
  });

  test("a range past the end of the object is a FormatError", async () => {
    await expect(store.readRange("obj", 250, 10)).rejects.toThrow(FormatError);
    await expect(store.readRange("obj", 300, 1)).rejects.toThrow(FormatError);
  });

  test("a missing object is a NotFoundError naming its gs:// URL", async () => {
    await expect(store.read("missing")).rejects.toThrow(NotFoundError);
    await expect(store.read("missing")).rejects.toThrow(`gs://${bucket}/root/dir/missing`);
    expect(await store.stat("missing")).toBeUndefined();
  });

  test("a write reports the size and CRC-32C it stored, and stat and list give GCS's own CRC-32C of the object", async () => {
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

  test("stat gives the object size", async () => {
    expect(await store.stat("obj")).toMatchObject({ key: "obj", size: 256 });
  });

  test("lists by prefix, in key order, with keys relative to the store root", async () => {
    const keys: string[] = [];
    for await (const o of store.list("tree/a")) keys.push(o.key);
    expect(keys).toEqual(["tree/a.b", "tree/a/0/z", "tree/a/1", "tree/ab"]);
  });

  test("listDir gives immediate objects and sub-directories", async () => {
    expect(await store.listDir("tree")).toEqual({
      files: [
        { key: "tree/a.b", size: 3, crc32c: 0x6064a37a },
        { key: "tree/ab", size: 3, crc32c: 0x6064a37a },
      ],
      dirs: ["a", "b"],
    });
    expect((await store.listDir("")).dirs).toEqual(["tree"]);
  });

  test("streams a byte range", async () => {
    const pieces: Uint8Array[] = [];
    for await (const p of store.readStream("obj", 100, 50)) pieces.push(p);
    expect(Buffer.concat(pieces)).toEqual(Buffer.from(bytes.subarray(100, 150)));
  });

  test("a streamed range past the end ends in a FormatError", async () => {
    const drain = async () => {
      for await (const _ of store.readStream("obj", 200, 100));
    };
    await expect(drain()).rejects.toThrow(FormatError);
  });

  test("writes a stream of pieces as one object", async () => {
    async function* pieces() {
      yield new Uint8Array([1, 2]);
      yield new Uint8Array(1 << 20);
      yield new Uint8Array([3]);
    }
    await store.write("streamed", pieces());
    expect(await store.stat("streamed")).toMatchObject({ key: "streamed", size: (1 << 20) + 3 });
  });

  test("createExclusive uses ifGenerationMatch: 0, so a second claim loses", async () => {
    expect(await store.createExclusive("claim", new Uint8Array([1]))).toBe(true);
    expect(await store.createExclusive("claim", new Uint8Array([2]))).toBe(false);
    expect([...(await store.read("claim"))]).toEqual([1]);
  });

  test("of concurrent createExclusive calls exactly one wins", async () => {
    const wins = await Promise.all(Array.from({ length: 6 }, (_, i) => store.createExclusive("race", new Uint8Array([i]))));
    expect(wins.filter(Boolean)).toHaveLength(1);
  });

  test("delete removes an object and ignores a missing one", async () => {
    await store.write("gone", new Uint8Array(1));
    await store.delete("gone");
    await store.delete("gone");
    expect(await store.stat("gone")).toBeUndefined();
  });

  test("refuses keys that would leave the prefix", async () => {
    await expect(store.write("../escape", new Uint8Array(1))).rejects.toThrow(UsageError);
  });

  test("openStore maps gs://bucket/prefix to a GcsStore", async () => {
    const s = await openStore(`gs://${bucket}/root/dir/`);
    expect(s).toBeInstanceOf(GcsStore);
    expect(await s.read("obj")).toEqual(bytes);
  });
});
