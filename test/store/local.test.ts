import { existsSync, mkdirSync, mkdtempSync, readdirSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { DestinationError, FormatError, NotFoundError, UsageError } from "../../src/errors.js";
import { LocalStore } from "../../src/store/local.js";
import { openStore, overlaps, parseLocation, resolveLocation } from "../../src/store/open.js";

function tempStore(): LocalStore {
  return new LocalStore(mkdtempSync(join(tmpdir(), "orbax2reg-store-")));
}

describe("LocalStore", () => {
  test("reads back what it wrote, creating directories", async () => {
    const s = tempStore();
    await s.write("a/b/c.bin", new Uint8Array([1, 2, 3]));
    expect([...(await s.read("a/b/c.bin"))]).toEqual([1, 2, 3]);
  });

  test("a write reports the size and CRC-32C of what it stored, whole or streamed", async () => {
    const s = tempStore();
    const data = new TextEncoder().encode("123456789");
    expect(await s.write("crc", data)).toEqual({ size: 9, crc32c: 0xe3069283 });
    async function* pieces() {
      yield data.subarray(0, 4);
      yield data.subarray(4);
    }
    expect(await s.write("crc-streamed", pieces())).toEqual({ size: 9, crc32c: 0xe3069283 });
  });

  test("copyRangeTo reports the size only: a verbatim copy is checked against its source, not checksummed twice", async () => {
    const s = tempStore();
    await s.write("crc", new TextEncoder().encode("123456789"));
    expect(await s.copyRangeTo("crc", 2, 5, s, "crc-copied", new Uint8Array(4))).toEqual({ size: 5 });
    expect(new TextDecoder().decode(await s.read("crc-copied"))).toBe("34567");
  });

  test("reads an exact byte range", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array([0, 1, 2, 3, 4, 5, 6, 7]));
    expect([...(await s.readRange("f", 2, 3))]).toEqual([2, 3, 4]);
    expect((await s.readRange("f", 8, 0)).length).toBe(0);
  });

  test("a range past the end is a FormatError naming the file", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array(4));
    await expect(s.readRange("f", 2, 4)).rejects.toThrow(FormatError);
    await expect(s.readRange("f", 2, 4)).rejects.toThrow(/\/f, offset 2: short read/);
  });

  test("a missing object is a NotFoundError", async () => {
    const s = tempStore();
    await expect(s.read("nope")).rejects.toThrow(NotFoundError);
    await expect(s.readRange("nope", 0, 1)).rejects.toThrow(NotFoundError);
    expect(await s.stat("nope")).toBeUndefined();
  });

  test("stat gives the size of an object and nothing for a directory", async () => {
    const s = tempStore();
    await s.write("d/x", new Uint8Array(5));
    expect(await s.stat("d/x")).toEqual({ key: "d/x", size: 5 });
    expect(await s.stat("d")).toBeUndefined();
  });

  test("lists by plain string prefix, recursively, in key order", async () => {
    const s = tempStore();
    for (const k of ["b/2", "a.b", "a/1", "a/0/z", "ab"]) await s.write(k, new Uint8Array(1));
    const keys = async (p: string) => {
      const out: string[] = [];
      for await (const o of s.list(p)) out.push(o.key);
      return out;
    };
    expect(await keys("")).toEqual(["a.b", "a/0/z", "a/1", "ab", "b/2"]);
    expect(await keys("a/")).toEqual(["a/0/z", "a/1"]);
    expect(await keys("a")).toEqual(["a.b", "a/0/z", "a/1", "ab"]);
    expect(await keys("zz/")).toEqual([]);
  });

  test("listDir gives immediate files and sub-directories", async () => {
    const s = tempStore();
    for (const k of ["x", "d1/a", "d1/b/c", "d2/e"]) await s.write(k, new Uint8Array(2));
    expect(await s.listDir("")).toEqual({ files: [{ key: "x", size: 2 }], dirs: ["d1", "d2"] });
    expect(await s.listDir("d1")).toEqual({ files: [{ key: "d1/a", size: 2 }], dirs: ["b"] });
    expect(await s.listDir("missing")).toEqual({ files: [], dirs: [] });
  });

  test.each(["../x", "a/../../x", "/etc/passwd", "a//b", "./a", "a\\b", ""])("refuses the key %j", async (key) => {
    const s = tempStore();
    await expect(s.write(key, new Uint8Array(1))).rejects.toThrow(UsageError);
    await expect(s.read(key)).rejects.toThrow(UsageError);
  });

  test("streams a byte range in pieces", async () => {
    const s = tempStore();
    const data = Uint8Array.from({ length: 3 << 20 }, (_, i) => i % 251);
    await s.write("big", data);
    const pieces: Uint8Array[] = [];
    for await (const p of s.readStream("big", 5, (2 << 20) + 7)) pieces.push(p);
    expect(pieces.length).toBeGreaterThan(1);
    expect(Buffer.concat(pieces)).toEqual(Buffer.from(data.subarray(5, 5 + (2 << 20) + 7)));
  });

  test("a streamed range past the end ends in a FormatError", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array(10));
    const drain = async () => {
      for await (const _ of s.readStream("f", 4, 10));
    };
    await expect(drain()).rejects.toThrow(FormatError);
  });

  test("writes a stream of pieces", async () => {
    const s = tempStore();
    async function* pieces() {
      yield new Uint8Array([1, 2]);
      yield new Uint8Array([3]);
    }
    await s.write("d/streamed", pieces());
    expect([...(await s.read("d/streamed"))]).toEqual([1, 2, 3]);
  });

  test("a failing stream leaves neither the object nor a temporary file", async () => {
    const s = tempStore();
    async function* broken() {
      yield new Uint8Array([1]);
      throw new Error("source died");
    }
    await expect(s.write("d/x", broken())).rejects.toThrow("source died");
    expect(await s.listDir("d")).toEqual({ files: [], dirs: [] });
  });

  test("createExclusive creates once and then reports the key as taken", async () => {
    const s = tempStore();
    expect(await s.createExclusive("c/claim", new Uint8Array([1]))).toBe(true);
    expect(await s.createExclusive("c/claim", new Uint8Array([2]))).toBe(false);
    expect([...(await s.read("c/claim"))]).toEqual([1]);
    expect((await s.listDir("c")).files.map((f) => f.key)).toEqual(["c/claim"]);
  });

  test("of concurrent createExclusive calls exactly one wins", async () => {
    const s = tempStore();
    const wins = await Promise.all(Array.from({ length: 8 }, (_, i) => s.createExclusive("race", new Uint8Array([i]))));
    expect(wins.filter(Boolean)).toHaveLength(1);
  });

  test("delete removes an object and ignores a missing one", async () => {
    const s = tempStore();
    await s.write("k", new Uint8Array(1));
    await s.delete("k");
    await s.delete("k");
    expect(await s.stat("k")).toBeUndefined();
  });

  test("a write leaves no temporary file behind", async () => {
    const s = tempStore();
    await s.write("k", new Uint8Array(3));
    expect((await s.listDir("")).files.map((f) => f.key)).toEqual(["k"]);
  });
});

describe("LocalStore temporary files", () => {
  const tmpOf = (pid: number) => `${pid.toString(16).padStart(8, "0")}0001`;

  test("are named after the writing process, and list and listDir never show them", async () => {
    const s = tempStore();
    writeFileSync(join(s.root, `k.tmp-${tmpOf(process.pid)}`), "in flight");
    await s.write("k", new Uint8Array(1));
    expect((await s.listDir("")).files.map((f) => f.key)).toEqual(["k"]);
    const listed: string[] = [];
    for await (const o of s.list("")) listed.push(o.key);
    expect(listed).toEqual(["k"]);
  });

  test("removeAbandoned deletes a dead writer's and never a live writer's", async () => {
    const s = tempStore();
    mkdirSync(join(s.root, "d"));
    const live = `d/a.tmp-${tmpOf(process.pid)}`;
    const dead = `d/b.tmp-${tmpOf(0x7fffff00)}`; // above any pid_max (at most 2^22): no such process
    writeFileSync(join(s.root, live), "x");
    writeFileSync(join(s.root, dead), "x");
    expect(await s.removeAbandoned("d/")).toBe(1);
    expect(readdirSync(join(s.root, "d"))).toEqual([live.slice(2)]);
  });

  test("copyRangeTo returns what it stored, and a missing source is a NotFoundError", async () => {
    const src = tempStore();
    await src.write("f", new Uint8Array(1 << 20));
    await expect(src.copyRangeTo("f", 0, 1 << 20, src, "g/h", new Uint8Array(64 << 10))).resolves.toEqual({ size: 1 << 20 });
    await expect(src.copyRangeTo("missing", 0, 1, src, "x", new Uint8Array(4))).rejects.toThrow(NotFoundError);
  });
});

describe("LocalStore destination errors", () => {
  test("a file where a directory must be is a DestinationError naming the key and the cause", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array(1));
    await expect(s.write("f/g", new Uint8Array(1))).rejects.toThrow(DestinationError);
    await expect(s.write("f/g", new Uint8Array(1))).rejects.toThrow(/\/f\/g: (a parent of this path is a file|a file is in the way)/);
  });

  test("a directory where an object goes is a DestinationError", async () => {
    const s = tempStore();
    mkdirSync(join(s.root, "index", "x"), { recursive: true });
    await expect(s.write("index", new Uint8Array(1))).rejects.toThrow(/\/index: is a directory, not a file/);
    expect(existsSync(join(s.root, "index", "x"))).toBe(true);
  });

  test("syncNames fsyncs the directories under a prefix (and succeeds on an empty store)", async () => {
    const s = tempStore();
    await s.write("a/b/c", new Uint8Array(1));
    await expect(s.syncNames("a")).resolves.toBeUndefined();
    await expect(s.syncNames("")).resolves.toBeUndefined();
  });
});

describe("locations", () => {
  test.each([
    ["gs://b//x/y/", "x/y", "gs://b/x/y"],
    ["gs://b/x//y//", "x/y", "gs://b/x/y"],
    ["gs://b", "", "gs://b"],
    ["gs://b///", "", "gs://b"],
  ])("%s is bucket b, prefix %j, url %s", (location, prefix, url) => {
    expect(parseLocation(location)).toEqual({ kind: "gcs", bucket: "b", prefix, url });
  });

  test("gs:// names with . or .. segments, or no bucket, are refused", () => {
    expect(() => parseLocation("gs://b/x/../y")).toThrow(UsageError);
    expect(() => parseLocation("gs://b/./y")).toThrow(UsageError);
    expect(() => parseLocation("gs:///x")).toThrow(UsageError);
  });

  test("GcsStore receives the canonical prefix", async () => {
    const s = (await openStore("gs://b//x//y/")) as unknown as { prefix: string; url: string };
    expect(s.prefix).toBe("x/y");
    expect(s.url).toBe("gs://b/x/y");
  });

  test("local locations resolve symlinks of their deepest existing ancestor", async () => {
    const dir = mkdtempSync(join(tmpdir(), "orbax2reg-loc-"));
    mkdirSync(join(dir, "real"));
    symlinkSync(join(dir, "real"), join(dir, "link"));
    const real = await resolveLocation(join(dir, "real", "not", "yet"));
    expect(await resolveLocation(join(dir, "link", "not", "yet"))).toBe(real);
    expect(await resolveLocation(`file://${join(dir, "link")}/not/./yet/`)).toBe(real);
    expect(overlaps(await resolveLocation(join(dir, "link")), real)).toBe(true);
    expect(overlaps(await resolveLocation(join(dir, "real2")), await resolveLocation(join(dir, "real")))).toBe(false);
  });
});

describe("openStore", () => {
  test("plain paths and file:// URLs open the local filesystem", async () => {
    const dir = mkdtempSync(join(tmpdir(), "orbax2reg-open-"));
    writeFileSync(join(dir, "f"), "hi");
    expect(new TextDecoder().decode(await (await openStore(dir)).read("f"))).toBe("hi");
    expect(new TextDecoder().decode(await (await openStore(`file://${dir}`)).read("f"))).toBe("hi");
  });

  test("unknown URL schemes are refused", async () => {
    await expect(openStore("s3://bucket/x")).rejects.toThrow(UsageError);
  });
});
