import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, symlinkSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, test } from "vitest";
import { DestinationError, NotFoundError, UsageError } from "../../src/errors.js";
import { LocalStore } from "../../src/store/local.js";
import { openStore, overlaps, parseLocation, resolveLocation } from "../../src/store/open.js";

function tempStore(): LocalStore {
  return new LocalStore(mkdtempSync(join(tmpdir(), "orbax2reg-store-")));
}

// The behaviours LocalStore shares with GcsStore (read, ranges, list, listDir, write, createExclusive,
// delete, stat, key refusal) are in contract.test.ts; here only what is specific to the local filesystem.
describe("LocalStore", () => {
  test("a directory that does not exist lists as absent; an empty one only as empty", async () => {
    const s = tempStore();
    await s.write("empty/x", new Uint8Array(1));
    await s.delete("empty/x");
    expect(await s.listDir("nowhere")).toEqual({ files: [], dirs: [], absent: true });
    expect(await s.listDir("empty")).toEqual({ files: [], dirs: [] });
  });

  test("copyRangeTo reports the size only: a verbatim copy is checked against its source, not checksummed twice", async () => {
    const s = tempStore();
    await s.write("crc", new TextEncoder().encode("123456789"));
    expect(await s.copyRangeTo("crc", 2, 5, s, "crc-copied", new Uint8Array(4))).toEqual({ size: 5 });
    expect(new TextDecoder().decode(await s.read("crc-copied"))).toBe("34567");
  });

  test("a listing walked as it goes is in key order where a directory's name begins a sibling's (a.b < a/c < a0)", async () => {
    const s = tempStore();
    for (const k of ["a0", "a/c", "a.b", "a/b/d", "a/b.e"]) await s.write(k, new Uint8Array(1));
    const keys: string[] = [];
    for await (const o of s.list("")) keys.push(o.key);
    expect(keys).toEqual(["a.b", "a/b.e", "a/b/d", "a/c", "a0"]);
  });

  test("a short read names the file path and the offset", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array(4));
    await expect(s.readRange("f", 2, 4)).rejects.toThrow(/\/f, offset 2: short read/);
  });

  test("a small range of a device is refused, not read (a chunk linked to /dev/zero reads as zeros)", async () => {
    const s = tempStore();
    symlinkSync("/dev/zero", join(s.root, "zeros"));
    await expect(s.readRange("zeros", 0, 4)).rejects.toThrow(/\/zeros: is a device, not a regular file/);
  });

  test("a small range, its stat made beside the read, still says where a file ends and refuses a named pipe", async () => {
    const s = tempStore();
    await s.write("f", new Uint8Array([1, 2, 3, 4, 5, 6]));
    expect([...(await s.readRange("f", 1, 4))]).toEqual([2, 3, 4, 5]);
    await expect(s.readRange("f", 4, 4)).rejects.toThrow(/\/f, offset 4: short read: wanted 4 bytes at offset 4, the object ends at 6/);
    spawnSync("mkfifo", [join(s.root, "pipe")]);
    await expect(s.readRange("pipe", 0, 4)).rejects.toThrow(/\/pipe: is a named pipe \(FIFO\), not a regular file/);
    await expect(s.readRange("absent", 0, 4)).rejects.toBeInstanceOf(NotFoundError);
    mkdirSync(join(s.root, "dir"));
    await expect(s.readRange("dir", 0, 4)).rejects.toBeInstanceOf(NotFoundError);
  });

  test("readRangeInto reads a range into the caller's buffer, small or large, with readRange's refusals", async () => {
    const s = tempStore();
    const big = new Uint8Array(5 << 20).map((_, i) => i % 251);
    await s.write("f", new Uint8Array([1, 2, 3, 4, 5, 6]));
    await s.write("big", big);
    const buffer = new Uint8Array(8).fill(9);
    const bytes = await s.readRangeInto("f", 1, 4, buffer);
    expect(bytes.buffer).toBe(buffer.buffer);
    expect([...buffer]).toEqual([2, 3, 4, 5, 9, 9, 9, 9]);
    const into = new Uint8Array(big.length);
    const large = await s.readRangeInto("big", 1, big.length - 1, into);
    expect(large.buffer).toBe(into.buffer); // read in place, not into a buffer of its own and copied
    expect(Buffer.compare(large, big.subarray(1))).toBe(0);
    await expect(s.readRangeInto("f", 4, 4, buffer)).rejects.toThrow(/\/f, offset 4: short read/);
    await expect(s.readRangeInto("absent", 0, 4, buffer)).rejects.toBeInstanceOf(NotFoundError);
    await expect(s.readRangeInto("f", 0, 6, new Uint8Array(4))).rejects.toThrow(RangeError);
  });

  test("a write asked for no checksum stores the same bytes and answers its size only", async () => {
    const s = tempStore();
    const data = new TextEncoder().encode("123456789");
    expect(await s.write("plain", data, { checksum: false })).toEqual({ size: 9 });
    expect(
      await s.write(
        "streamed",
        (async function* () {
          yield data.subarray(0, 4);
          yield data.subarray(4);
        })(),
        { checksum: false },
      ),
    ).toEqual({ size: 9 });
    expect(await s.write("checked", data)).toEqual({ size: 9, crc32c: 0xe3069283 });
    expect(Buffer.from(await s.read("plain")).toString()).toBe("123456789");
    expect(Buffer.from(await s.read("streamed")).toString()).toBe("123456789");
  });

  test("stat and listDir of local files carry no CRC-32C (nothing stores one)", async () => {
    const s = tempStore();
    await s.write("d/x", new Uint8Array(5));
    expect(await s.stat("d/x")).toEqual({ key: "d/x", size: 5 });
    const t = tempStore();
    for (const k of ["x", "d1/a", "d1/b/c", "d2/e"]) await t.write(k, new Uint8Array(2));
    expect(await t.listDir("")).toEqual({ files: [{ key: "x", size: 2 }], dirs: ["d1", "d2"] });
    expect(await t.listDir("d1")).toEqual({ files: [{ key: "d1/a", size: 2 }], dirs: ["b"] });
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

  test("removeEmptyDirectories removes the empty directories under a prefix, deepest first, and keeps any that hold a file", async () => {
    const s = tempStore();
    for (const k of ["step/a/b/x", "step/c/y", "step/keep/z", "other/w"]) await s.write(k, new Uint8Array(1));
    for (const k of ["step/a/b/x", "step/c/y"]) await s.delete(k);
    await s.removeEmptyDirectories("step/");
    expect(existsSync(join(s.root, "step", "a"))).toBe(false);
    expect(existsSync(join(s.root, "step", "c"))).toBe(false);
    expect(readdirSync(join(s.root, "step"))).toEqual(["keep"]);
    await s.delete("step/keep/z");
    await s.removeEmptyDirectories("step/");
    expect(readdirSync(s.root)).toEqual(["other"]);
    await s.removeEmptyDirectories("missing/"); // nothing there: nothing to do
  });

  test("a write leaves no temporary file behind", async () => {
    const s = tempStore();
    await s.write("k", new Uint8Array(3));
    expect((await s.listDir("")).files.map((f) => f.key)).toEqual(["k"]);
  });
});

describe("LocalStore at scale", () => {
  // More entries than a call's arguments can hold (about 125k spread into push overflowed the stack).
  const MANY = 130_000;

  test(`lists ${MANY.toLocaleString("en-US")} objects below one directory, sorted by key`, async () => {
    const s = tempStore();
    const dir = join(s.root, "step", "d");
    mkdirSync(dir, { recursive: true });
    const names = Array.from({ length: MANY }, (_, i) => String(i).padStart(6, "0"));
    const touch = spawnSync("xargs", ["touch"], { cwd: dir, input: names.join("\n") });
    expect(touch.status).toBe(0);
    writeFileSync(join(s.root, "step", "index"), "x");
    const keys: string[] = [];
    for await (const info of s.list("step/")) keys.push(info.key);
    expect(keys).toHaveLength(MANY + 1);
    expect([keys[0], keys[MANY - 1], keys[MANY]]).toEqual(["step/d/000000", `step/d/${names[MANY - 1]}`, "step/index"]);
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

  test("abandonedIn names a dead writer's temporary files directly in a directory, not a live writer's nor a subdirectory's", async () => {
    const s = tempStore();
    mkdirSync(join(s.root, "d"));
    const dead = tmpOf(0x7fffff00);
    for (const k of [`b.tmp-${dead}`, `a.tmp-${dead}`, `live.tmp-${tmpOf(process.pid)}`, `d/c.tmp-${dead}`, "a"])
      writeFileSync(join(s.root, k), "x");
    expect(await s.abandonedIn("")).toEqual([`a.tmp-${dead}`, `b.tmp-${dead}`]);
    expect(await s.abandonedIn("d")).toEqual([`d/c.tmp-${dead}`]);
    expect(await s.abandonedIn("nowhere")).toEqual([]);
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

  test("makeDurable flushes the files and directories under a prefix (and succeeds on an empty store)", async () => {
    const s = tempStore();
    await s.write("a/b/c", new Uint8Array(1));
    await expect(s.makeDurable("a")).resolves.toBeUndefined();
    await expect(s.makeDurable("")).resolves.toBeUndefined();
    await expect(tempStore().makeDurable("")).resolves.toBeUndefined();
  });

  test("a flush that fails after a write's rename is reported by flushed and makeDurable, naming the object", async () => {
    // The disk refuses the flush of x/y (EIO) after its rename: the commit must not go ahead.
    const root = mkdtempSync(join(tmpdir(), "orbax2reg-store-"));
    const eio = Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO" });
    const t = new LocalStore(root, root, async (path) => {
      if (path.endsWith(join("x", "y"))) throw eio;
    });
    await t.write("x/y", new Uint8Array(1));
    await expect(t.flushed()).rejects.toThrow(/x\/y/);
    await expect(t.makeDurable("")).rejects.toThrow(/x\/y/);
  });

  test("a scratch write is not flushed to disk (it is deleted before the operation ends); other writes are", async () => {
    const root = mkdtempSync(join(tmpdir(), "orbax2reg-store-"));
    const flushed: string[] = [];
    const t = new LocalStore(root, root, async (path) => {
      flushed.push(path);
    });
    await t.write("scratch", new Uint8Array(1), { scratch: true });
    await t.write("kept", new Uint8Array(1));
    await t.flushed();
    expect(flushed.map((p) => p.slice(root.length + 1))).toEqual(["kept"]);
  });

  test("makeDurable of one object's key flushes that object and its directory, and a missing key is nothing to do", async () => {
    const s = tempStore();
    await s.write("step/index", new Uint8Array(1));
    await expect(s.makeDurable("step/index")).resolves.toBeUndefined();
    await expect(s.makeDurable("step/missing")).resolves.toBeUndefined();
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
