import { mkdtemp } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { beforeAll, expect, test } from "vitest";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { CountingStore } from "../../src/store/counting.js";
import { LocalStore } from "../../src/store/local.js";
import { envelope, leafBody, manifestBody } from "../helpers/ocdbt-encode.js";

// One leaf of 2,000 "arrays" × 65 keys (130,000: past where spreading a listing into a call overflows the
// stack), as Orbax's 100 MB node size makes of a large step.
const ARRAYS = 2000;
const PER_ARRAY = 65;
const arrayName = (a: number) => `param_${String(a).padStart(5, "0")}`;
const keysOf = (a: number) => Array.from({ length: PER_ARRAY }, (_, c) => `${arrayName(a)}/${c === 0 ? ".zarray" : `${c - 1}.0`}`).sort();
let dir = "";

beforeAll(async () => {
  dir = await mkdtemp(join(tmpdir(), "orbax2reg-large-leaf-"));
  const store = new LocalStore(dir);
  const entries = Array.from({ length: ARRAYS }, (_, a) => keysOf(a))
    .flat()
    .map((key) => ({ key, value: new Uint8Array(0) }));
  const node = envelope("btreeNode", leafBody([], entries));
  await store.write("d/leaf", node);
  const version = { generation: 1, file: 0, offset: 0, length: node.length, numKeys: entries.length, numTreeBytes: node.length };
  await store.write("manifest.ocdbt", envelope("manifest", manifestBody({}, [["", "d/leaf"]], [version])));
});

test("a listing of 130,000 keys yields every key, in order", async () => {
  const db = await OcdbtDatabase.open(new LocalStore(dir));
  let n = 0;
  let previous = "";
  for await (const e of db.list()) {
    expect(e.key > previous).toBe(true);
    previous = e.key;
    n++;
  }
  expect(n).toBe(ARRAYS * PER_ARRAY);
});

test("listing each array by its prefix reads the leaf once and visits each key about once", async () => {
  const store = new CountingStore(new LocalStore(dir));
  const db = await OcdbtDatabase.open(store);
  for (const a of [0, 1234, ARRAYS - 1]) {
    const keys: string[] = [];
    for await (const e of db.list(`${arrayName(a)}/`)) keys.push(e.key);
    expect(keys).toEqual(keysOf(a));
  }
  for (let a = 0; a < ARRAYS; a++) for await (const _ of db.list(`${arrayName(a)}/`));
  expect(db.stats.nodesRead).toBe(1);
  expect(store.counts.rangeReads).toBe(1);
  // Linear in the keys listed (plus a binary search per listing), not arrays × leaf size.
  expect(db.stats.leafEntriesVisited).toBeLessThan(2 * ARRAYS * PER_ARRAY);
});
