#!/usr/bin/env node
// OCDBT listing benchmark: opens each generated big tree and lists every key, with orbax2reg's reader (the
// compiled dist/) and, as a baseline, with TensorStore's own ocdbt driver from the project's .venv.
//
//   npx tsc -p tsconfig.build.json && node bench/ocdbt-list.mjs
//
// Each side runs open + list 3 times with nothing cached between runs (a new OcdbtDatabase / a new
// ts.Context) and keeps the best wall time; TensorStore is timed inside Python, so interpreter start-up
// is not counted. See bench/README.md.
import { spawnSync } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { resolve } from "node:path";
import { flags, ROOT, requireBuilt } from "./lib.mjs";

flags(process.argv.slice(2), {});
requireBuilt({ file: "dist/src/ocdbt/database.js" });
process.chdir(ROOT);

const FIXTURES = "test/.generated/fixtures/bigtree";
const TREES = [
  { name: "state", note: "Orbax merged root, one 100,000-key leaf" },
  { name: "state-deep", note: "multi-level tree (64 KiB nodes)" },
];
const RUNS = 3;
const PYTHON = ".venv/bin/python";

if (!TREES.every((t) => existsSync(`${FIXTURES}/${t.name}/manifest.ocdbt`))) {
  console.error(
    `${FIXTURES}/{state,state-deep} is missing: run \`npm test\` once (its global setup generates the fixtures)\n` +
      `or \`${PYTHON} test/fixtures-gen/bigtree.py test/.generated/fixtures\``,
  );
  process.exit(1);
}
const { OcdbtDatabase } = await import("../dist/src/ocdbt/database.js");
const { LocalStore } = await import("../dist/src/store/local.js");
const expectedKeys = JSON.parse(readFileSync(`${FIXTURES}/expected.json`, "utf8")).keys;

/** orbax2reg: best of RUNS of open + list; also the reader's own node counters. */
async function ours(dir) {
  let best;
  for (let i = 0; i < RUNS; i++) {
    const t0 = performance.now();
    const db = await OcdbtDatabase.open(new LocalStore(dir), "");
    let keys = 0;
    for await (const _ of db.list("")) keys++;
    const ms = performance.now() - t0;
    if (best === undefined || ms < best.ms) best = { ms, keys, ...db.stats };
  }
  return best;
}

const TENSORSTORE_LIST = `
import json, sys, time
import tensorstore as ts
best, keys = None, 0
for _ in range(int(sys.argv[2])):
    t0 = time.perf_counter()
    kv = ts.KvStore.open({"driver": "ocdbt", "base": "file://" + sys.argv[1]}, context=ts.Context()).result()
    keys = len(kv.list().result())
    ms = (time.perf_counter() - t0) * 1000
    best = ms if best is None else min(best, ms)
print(json.dumps({"keys": keys, "ms": best}))
`;

/** TensorStore: the same open + list, timed inside Python; undefined when .venv is not there. */
function tensorstore(dir) {
  if (!existsSync(PYTHON)) return undefined;
  const r = spawnSync(PYTHON, ["-c", TENSORSTORE_LIST, dir, String(RUNS)], { encoding: "utf8" });
  if (r.status !== 0) {
    console.error(`tensorstore baseline failed for ${dir}:\n${r.stderr}`);
    return undefined;
  }
  return JSON.parse(r.stdout.trim().split("\n").pop());
}

const rows = [["tree", "keys", "nodes read", "node bytes", "ms", "keys/s", "tensorstore ms", "ours/tensorstore"]];
for (const tree of TREES) {
  const dir = resolve(FIXTURES, tree.name);
  const o = await ours(dir);
  const t = tensorstore(dir);
  if (o.keys !== expectedKeys || (t && t.keys !== expectedKeys)) {
    console.error(`${tree.name}: expected ${expectedKeys} keys, orbax2reg listed ${o.keys}, tensorstore ${t?.keys}`);
    process.exitCode = 1;
  }
  rows.push([
    tree.name,
    o.keys.toLocaleString("en-US"),
    String(o.nodesRead),
    o.nodeBytesRead.toLocaleString("en-US"),
    o.ms.toFixed(1),
    Math.round((o.keys / o.ms) * 1000).toLocaleString("en-US"),
    t ? t.ms.toFixed(1) : "n/a",
    t ? `${(o.ms / t.ms).toFixed(2)}x` : "n/a",
  ]);
}

const widths = rows[0].map((_, c) => Math.max(...rows.map((r) => r[c].length)));
const line = (r) => r.map((cell, c) => (c === 0 ? cell.padEnd(widths[c]) : cell.padStart(widths[c]))).join("  ");
console.log(`OCDBT open + list of every key, best of ${RUNS} (node ${process.version})`);
console.log(line(rows[0]));
console.log(widths.map((w) => "-".repeat(w)).join("  "));
for (const r of rows.slice(1)) console.log(line(r));
for (const tree of TREES) console.log(`  ${tree.name}: ${tree.note}`);
