import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, test } from "vitest";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { GENERATED } from "../helpers/paths.js";

// 100,000 keys written by two Orbax processes and merged by Orbax's own merge (test/fixtures-gen/bigtree.py):
// state = one leaf root, state-deep = the same merge with 64 KiB nodes (a multi-level tree).
const DIR = `${GENERATED}/bigtree`;
const EXPECTED = JSON.parse(readFileSync(`${DIR}/expected.json`, "utf8")) as { keys: number; sorted_keys_sha256: string };

interface Listing {
  db: OcdbtDatabase;
  store: CountingStore;
  keys: string[];
  /** Out-of-line values: how many per data file, and their total length. */
  valueFiles: Map<string, number>;
  indirectBytes: number;
}

async function listAll(name: string): Promise<Listing> {
  const store = new CountingStore(new LocalStore(`${DIR}/${name}`), { log: true });
  const db = await OcdbtDatabase.open(store);
  const listing: Listing = { db, store, keys: [], valueFiles: new Map(), indirectBytes: 0 };
  for await (const e of db.list()) {
    listing.keys.push(e.key);
    if (e.value.kind === "file") {
      listing.valueFiles.set(e.value.key, (listing.valueFiles.get(e.value.key) ?? 0) + 1);
      listing.indirectBytes += e.value.length;
    }
  }
  return listing;
}

// Each full listing takes about a second: list each database once (one open) and share the result.
const listings = new Map<string, Promise<Listing>>();
function listed(name: string): Promise<Listing> {
  let p = listings.get(name);
  if (p === undefined) {
    p = listAll(name);
    listings.set(name, p);
  }
  return p;
}

describe.each(["state", "state-deep"])("bigtree/%s", (name) => {
  test("lists all keys, matching expected.json's count and hash", async () => {
    const { keys } = await listed(name);
    expect(keys.length).toBe(EXPECTED.keys);
    expect(createHash("sha256").update(keys.join("\n")).digest("hex")).toBe(EXPECTED.sorted_keys_sha256);
  });

  test("lists keys in strictly increasing byte order", async () => {
    const { keys } = await listed(name);
    const unordered = keys.findIndex((k, i) => i > 0 && Buffer.compare(Buffer.from(keys[i - 1] as string), Buffer.from(k)) >= 0);
    expect(unordered).toBe(-1);
  });

  test("reads every node byte range exactly once per open, and nothing else", async () => {
    const { db, store } = await listed(name);
    const ranges = store.ranges.map((r) => `${r.key}@${r.offset}+${r.length}`);
    expect(new Set(ranges).size).toBe(ranges.length);
    expect(ranges.length).toBe(db.stats.nodesRead);
    expect(store.reads).toEqual(["manifest.ocdbt"]);
  });

  test("out-of-line values point into both per-process databases, as the statistics say", async () => {
    const { db, valueFiles, indirectBytes } = await listed(name);
    expect(new Set([...valueFiles.keys()].map((k) => k.split("/")[0]))).toEqual(new Set(["ocdbt.process_0", "ocdbt.process_1"]));
    // Every 10th value (1500 bytes) is out of line.
    expect([...valueFiles.values()].reduce((a, b) => a + b, 0)).toBe(EXPECTED.keys / 10);
    expect(indirectBytes).toBe(db.version?.stats.numIndirectValueBytes);
  });

  test("get finds the first, a middle and the last key, and misses keys next to them", async () => {
    const { keys } = await listed(name);
    const db = await OcdbtDatabase.open(new LocalStore(`${DIR}/${name}`));
    for (const k of [keys[0], keys[50_000], keys[keys.length - 1]] as string[]) expect((await db.get(k))?.key).toBe(k);
    for (const k of ["", `${keys[50_000]}x`, `${keys[keys.length - 1]}x`]) expect(await db.get(k)).toBeUndefined();
  });

  test("a prefix listing gives just the keys under it", async () => {
    const db = await OcdbtDatabase.open(new LocalStore(`${DIR}/${name}`));
    const keys: string[] = [];
    for await (const e of db.list("params.block_001234.w/")) keys.push(e.key);
    expect(keys).toEqual(["0.0", "0.1", "1.0", "1.1", "2.0", "2.1", "3.0", "3.1"].map((s) => `params.block_001234.w/${s}`));
  });
});

test("bigtree/state: the merged root is a single leaf", async () => {
  const { db } = await listed("state");
  expect(db.version?.rootHeight).toBe(0);
  expect(db.stats.nodesRead).toBe(1);
});

test("bigtree/state-deep: a multi-level tree, of which a prefix listing reads only a few nodes", async () => {
  const { db } = await listed("state-deep");
  expect(db.version?.rootHeight).toBeGreaterThan(0);
  expect(db.stats.nodesRead).toBeGreaterThan(1);
  const fresh = await OcdbtDatabase.open(new LocalStore(`${DIR}/state-deep`));
  for await (const _ of fresh.list("params.block_001234.w/"));
  expect(fresh.stats.nodesRead).toBeLessThan(db.stats.nodesRead / 4);
});

test("bigtree/state: a prefix in the middle of the 100,000-key leaf is found by seeking, not by scanning from the first key", async () => {
  const db = await OcdbtDatabase.open(new LocalStore(`${DIR}/state`));
  const keys: string[] = [];
  for await (const e of db.list("params.block_006789.w/")) keys.push(e.key);
  expect(keys).toHaveLength(8);
  // The 8 keys it yields and a binary search's ~17 comparisons, however many keys sort before them.
  expect(db.stats.leafEntriesVisited).toBeLessThan(40);
  for await (const _ of db.list("params.block_009999.w/"));
  expect(db.stats.leafEntriesVisited).toBeLessThan(80);
});
