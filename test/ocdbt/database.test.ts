import { cpSync, readFileSync, rmSync, truncateSync, writeFileSync } from "node:fs";
import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, relative } from "node:path";
import { describe, expect, test } from "vitest";
import { ChecksumError, FormatError, NotFoundError } from "../../src/errors.js";
import { type Entry, OcdbtDatabase } from "../../src/ocdbt/database.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { DataFileBuilder, envelope, interiorBody, type LeafEntry, leafBody, manifestBody } from "../helpers/ocdbt-encode.js";
import { FIXTURES, filesBelow } from "../helpers/paths.js";

const NG = `${FIXTURES}/ocdbt-neuroglancer`;
const te = new TextEncoder();

/** files/ as key -> bytes, keys being paths relative to files/ (`#` and `empty` included). */
function expectedFiles(dir = `${NG}/files`): Map<string, Uint8Array> {
  return new Map(filesBelow(dir).map((path) => [relative(dir, path).split("\\").join("/"), new Uint8Array(readFileSync(path))]));
}
const EXPECTED = expectedFiles();
const SORTED_KEYS = [...EXPECTED.keys()].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));

async function listKeys(db: OcdbtDatabase, prefix?: string): Promise<string[]> {
  const out: string[] = [];
  for await (const e of db.list(prefix)) out.push(e.key);
  return out;
}

async function tempDir(): Promise<string> {
  return mkdtemp(join(tmpdir(), "orbax2reg-db-"));
}

/** A copy of a fixture database, to damage. */
async function copyOf(name: string): Promise<string> {
  const dir = await tempDir();
  cpSync(`${NG}/${name}`, dir, { recursive: true });
  return dir;
}

describe.each(["files_high_arity.ocdbt", "files_min_arity.ocdbt"])("%s", (name) => {
  const open = () => OcdbtDatabase.open(new LocalStore(`${NG}/${name}`));

  test("lists exactly the keys of files/, in byte order", async () => {
    expect(SORTED_KEYS).toEqual(["#", "a", "b", "baz/first", "baz/x", "baz/z", "c", "empty"]);
    expect(await listKeys(await open())).toEqual(SORTED_KEYS);
  });

  test("readValue returns exactly the bytes of each file", async () => {
    const db = await open();
    for await (const e of db.list()) expect(await db.readValue(e.value)).toEqual(EXPECTED.get(e.key));
  });

  test("empty values are read without touching any file", async () => {
    const store = new CountingStore(new LocalStore(`${NG}/${name}`), { log: true });
    const db = await OcdbtDatabase.open(store);
    const empties = [];
    for await (const e of db.list()) if (EXPECTED.get(e.key)?.length === 0) empties.push(e);
    expect(empties.map((e) => e.key)).toEqual(["#", "baz/first", "baz/x", "baz/z", "empty"]);
    const before = store.ranges.length;
    for (const e of empties) expect((await db.readValue(e.value)).length).toBe(0);
    expect(store.ranges.length).toBe(before);
  });

  test("get finds every key with its bytes", async () => {
    const db = await open();
    for (const [key, bytes] of EXPECTED) {
      const e = await db.get(key);
      expect(e?.key).toBe(key);
      expect(e && (await db.readValue(e.value))).toEqual(bytes);
    }
  });

  test.each([
    "",
    "0",
    "aa",
    "ba",
    "baz",
    "baz/",
    "baz/f",
    "baz/firs",
    "baz/firstx",
    "baz/y",
    "baz/zz",
    "bb",
    "d",
    "emptyx",
    "zzz",
    "\u00ff",
  ])("get(%j) is undefined (absent: before, between or after keys, or sharing a subtree prefix)", async (key) => {
    expect(await (await open()).get(key)).toBeUndefined();
  });

  test('list("baz/") gives the keys under baz/', async () => {
    expect(await listKeys(await open(), "baz/")).toEqual(["baz/first", "baz/x", "baz/z"]);
  });

  test("list with a plain string prefix, not only a directory", async () => {
    const db = await open();
    expect(await listKeys(db, "b")).toEqual(["b", "baz/first", "baz/x", "baz/z"]);
    expect(await listKeys(db, "e")).toEqual(["empty"]);
    expect(await listKeys(db, "baz/x")).toEqual(["baz/x"]);
  });

  test("list with a prefix no key has gives nothing", async () => {
    const db = await open();
    expect(await listKeys(db, "nothing/")).toEqual([]);
    expect(await listKeys(db, "bazz")).toEqual([]);
    expect(await listKeys(db, "0")).toEqual([]);
  });

  test("each node is read at most once per open", async () => {
    const store = new CountingStore(new LocalStore(`${NG}/${name}`), { log: true });
    const db = await OcdbtDatabase.open(store);
    await listKeys(db);
    for (const key of SORTED_KEYS) await db.get(key);
    const ranges = store.ranges.map((r) => `${r.key}@${r.offset}+${r.length}`);
    expect(new Set(ranges).size).toBe(ranges.length);
    expect(ranges.length).toBe(db.stats.nodesRead);
  });
});

describe("damaged databases", () => {
  test("a missing data file is a NotFoundError naming the file", async () => {
    const dir = await copyOf("files_high_arity.ocdbt");
    rmSync(join(dir, "d/9b07a9a00a1a562b1c801f1d164a90c6"));
    const db = await OcdbtDatabase.open(new LocalStore(dir));
    const e = await listKeys(db).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(NotFoundError);
    expect((e as NotFoundError).path).toBe(join(dir, "d/9b07a9a00a1a562b1c801f1d164a90c6"));
    expect((e as NotFoundError).message).toContain(join(dir, "d/9b07a9a00a1a562b1c801f1d164a90c6"));
  });

  test("a missing manifest is a NotFoundError naming it", async () => {
    const dir = await tempDir();
    await expect(OcdbtDatabase.open(new LocalStore(dir))).rejects.toThrow(NotFoundError);
    await expect(OcdbtDatabase.open(new LocalStore(dir))).rejects.toThrow(/manifest\.ocdbt/);
  });

  test("a truncated data file is a FormatError naming the file", async () => {
    const dir = await copyOf("files_min_arity.ocdbt");
    const file = join(dir, "d/f6d9da936d3f6f58b667ca9d54a38667");
    truncateSync(file, 950); // the root node sits at 924..1017
    const e = await listKeys(await OcdbtDatabase.open(new LocalStore(dir))).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(FormatError);
    expect((e as FormatError).message).toMatch(new RegExp(`^${file}, offset 924: short read`));
  });

  test("a corrupted node is a ChecksumError naming the file and the CRC's offset", async () => {
    const dir = await copyOf("files_min_arity.ocdbt");
    const file = join(dir, "d/f6d9da936d3f6f58b667ca9d54a38667");
    const bytes = readFileSync(file);
    bytes[950] = (bytes[950] as number) ^ 0xff;
    writeFileSync(file, bytes);
    const e = await listKeys(await OcdbtDatabase.open(new LocalStore(dir))).catch((err: unknown) => err);
    expect(e).toBeInstanceOf(ChecksumError);
    // The CRC is the last 4 bytes of the root node (924..1017).
    expect((e as ChecksumError).message).toMatch(new RegExp(`^${file}, offset 1013: btreeNode CRC-32C mismatch`));
  });
});

describe("crafted databases", () => {
  /**
   * A merged root like Orbax's: the root interior node in d/root points at a leaf of ocdbt.process_0/
   * through base path "ocdbt.process_0/", and that leaf's own table names "d/p0", so its out-of-line value
   * lives in ocdbt.process_0/d/p0 (the transitive path rule).
   */
  async function mergedDb(): Promise<{ dir: string; store: LocalStore }> {
    const dir = await tempDir();
    const store = new LocalStore(dir);
    const p0 = new DataFileBuilder();
    const value = p0.add(te.encode("value of x"));
    const leafEntries: LeafEntry[] = [
      { key: "w/0", value: te.encode("inline") },
      { key: "x/0", value: { file: 0, ...value } },
    ];
    const leaf = p0.add(envelope("btreeNode", leafBody([["", "d/p0"]], leafEntries)));
    await store.write("ocdbt.process_0/d/p0", p0.bytes());
    const root = envelope(
      "btreeNode",
      interiorBody(1, [["ocdbt.process_0/", "d/p0"]], [{ key: "w/0", subtreePrefixLength: 0, file: 0, ...leaf, numKeys: 2 }]),
    );
    await store.write("d/root", root);
    await store.write(
      "manifest.ocdbt",
      envelope("manifest", manifestBody({}, [["", "d/root"]], [{ generation: 1, rootHeight: 1, file: 0, offset: 0, length: root.length }])),
    );
    return { dir, store };
  }

  test("values below a node fetched through a base path resolve under that base path", async () => {
    const { store } = await mergedDb();
    const db = await OcdbtDatabase.open(store);
    const x = await db.get("x/0");
    expect(x?.value).toEqual({ kind: "file", key: "ocdbt.process_0/d/p0", offset: 0, length: 10 });
    expect(x && new TextDecoder().decode(await db.readValue(x.value))).toBe("value of x");
    expect(await listKeys(db)).toEqual(["w/0", "x/0"]);
  });

  test("a database under a key prefix resolves its data files under that prefix", async () => {
    const { dir } = await mergedDb();
    const outer = await tempDir();
    cpSync(dir, join(outer, "ckpt/state"), { recursive: true });
    const db = await OcdbtDatabase.open(new LocalStore(outer), "ckpt/state");
    expect((await db.get("x/0"))?.value).toMatchObject({ key: "ckpt/state/ocdbt.process_0/d/p0" });
  });

  // The spec (§6.2): an empty value written out of line has the empty file id, offset 0 and length 0,
  // and a reader returns empty bytes without touching any file. readValue asks the store for key ""
  // (the database root) instead, which LocalStore refuses as an empty key.
  test("an empty out-of-line value with the empty file id reads as empty bytes without touching any file", async () => {
    const store = new CountingStore(new LocalStore(await tempDir()), { log: true });
    const leaf = envelope("btreeNode", leafBody([["", ""]], [{ key: "e", value: { file: 0, offset: 0, length: 0 } }]));
    await store.write("d/leaf", leaf);
    await store.write(
      "manifest.ocdbt",
      envelope("manifest", manifestBody({}, [["", "d/leaf"]], [{ generation: 1, file: 0, offset: 0, length: leaf.length }])),
    );
    const db = await OcdbtDatabase.open(store);
    const e = await db.get("e");
    expect(e).toBeDefined();
    const before = store.ranges.length;
    expect((await db.readValue((e as Entry).value)).length).toBe(0);
    expect(store.ranges.length).toBe(before);
  });
});
