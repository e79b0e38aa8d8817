// Bounded-time fuzz test: mutates real Orbax / OCDBT fixtures and asserts that reading them
// (openStep + inspectStep({checksums: true}) + get(), or a raw OCDBT listing) either succeeds or throws an
// Orbax2RegError: no other error, no hang, no allocation past Orbax's max_decoded_node_bytes (100 MB).
//
//   FUZZ_SEED=<u32>        run seed (default: random, printed)
//   FUZZ_SECONDS=<s>       time budget of the mutation loop (default 15)
//   FUZZ_ITER=<i>          replay only iteration i of FUZZ_SEED (prints what it mutated)
//   FUZZ_ITER_TIMEOUT_MS   per-iteration deadline (default 5000)
//   FUZZ_KEEP=<dir>        where failing cases are copied (default: a new directory under the OS temp dir, which
//                          is the run's own and goes with it unless ORBAX2REG_KEEP_TMP=1; the seed replays them)
//
// Every iteration takes a working copy of one fixture (restored file by file after the previous iteration),
// applies 1-2 mutations drawn from its own PRNG (seeded from the run seed and the iteration number, so any
// iteration replays alone) and runs the reader in a worker (fuzz-helpers.ts), which enforces the deadline
// and sees every allocation. Failures are collected, grouped and reported at the end with replay commands.
import { randomInt } from "node:crypto";
import { cpSync, existsSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, join } from "node:path";
import { expect, test } from "vitest";
import type { InteriorEntry, LeafEntry } from "../../src/ocdbt/btree.js";
import type { DataFileId } from "../../src/ocdbt/data-file-table.js";
import type { EnvelopeKind } from "../../src/ocdbt/envelope.js";
import { keyString } from "../../src/ocdbt/key.js";
import {
  concat,
  type DbModel,
  encodeBtreeNode,
  encodeEnvelope,
  encodeManifest,
  envelopeBody,
  type Field,
  FuzzRunner,
  iterationSeed,
  type JobResult,
  loadDb,
  type NodeInfo,
  overlongVarint,
  Rng,
  rebuildTree,
  replaceField,
  replaceNode,
  resealEnvelope,
  rewriteNode,
  varintBytes,
  violation,
  Workspace,
  withRoot,
  writeManifest,
  zstdFrame,
  zstdSkippableFrame,
} from "./fuzz-helpers.js";

const env = process.env;
const SEED = env.FUZZ_SEED !== undefined ? Number(env.FUZZ_SEED) >>> 0 : randomInt(2 ** 32);
const SECONDS = Number(env.FUZZ_SECONDS ?? 15);
const ONLY_ITER = env.FUZZ_ITER !== undefined ? Number(env.FUZZ_ITER) : undefined;
const ITER_TIMEOUT_MS = Number(env.FUZZ_ITER_TIMEOUT_MS ?? 5000);
/** Legitimately huge arrays (a fill value and absent chunks) take time proportional to their size. */
const MAX_DECLARED_ARRAY_BYTES = 64 << 20;

interface Fixture {
  readonly name: string;
  readonly path: string;
  readonly mode: "step" | "db";
  /** OCDBT databases inside the fixture, by key prefix; the first is the one read unless it is removed. */
  readonly dbs: readonly DbModel[];
  /** Pristine content of every file, to restore a working copy after an iteration. */
  readonly contents: ReadonlyMap<string, Uint8Array>;
}

function fixture(name: string, path: string, mode: "step" | "db", roots: string[]): Fixture | undefined {
  if (!existsSync(path)) return undefined;
  const ws = new Workspace(path);
  return { name, path, mode, dbs: roots.map((r) => loadDb(path, r)), contents: new Map(ws.files().map((k) => [k, ws.read(k)])) };
}

/**
 * One working copy per fixture, reused across iterations: after each one only the files it touched are
 * put back (copy-on-write, in effect); a full copy is made again if anything else differs.
 */
function workingCopy(fx: Fixture, root: string, previous?: Workspace): Workspace {
  const ws = new Workspace(join(root, fx.name, basename(fx.path)));
  if (previous) {
    for (const key of previous.touched) {
      const original = fx.contents.get(key);
      if (original) writeFileSync(ws.path(key), original);
      else rmSync(ws.path(key), { force: true });
    }
    const files = ws.files();
    if (files.length === fx.contents.size && files.every((k) => fx.contents.has(k))) return ws;
  }
  rmSync(ws.dir, { recursive: true, force: true });
  cpSync(fx.path, ws.dir, { recursive: true });
  return ws;
}

const AXLEARN = "test/fixtures/orbax-axlearn";
const NEUROGLANCER = "test/fixtures/ocdbt-neuroglancer";
const FIXTURES = [
  fixture("tiny", `${AXLEARN}/tiny/step_00000100`, "step", ["state", "state/ocdbt.process_0"]),
  fixture("zarr3", `${AXLEARN}/zarr3/step_00000100`, "step", ["state", "state/ocdbt.process_0"]),
  fixture("dtypes", `${AXLEARN}/dtypes/step_00000100`, "step", ["state", "state/ocdbt.process_0"]),
  fixture("ng-min-arity", `${NEUROGLANCER}/files_min_arity.ocdbt`, "db", [""]),
  fixture("ng-high-arity", `${NEUROGLANCER}/files_high_arity.ocdbt`, "db", [""]),
  // Written by the global setup with the real orbax (two processes, merged); skipped when absent.
  fixture("multiprocess", "test/.generated/fixtures/multiprocess/step_00000100", "step", [
    "state",
    "state/ocdbt.process_0",
    "state/ocdbt.process_1",
  ]),
].filter((f): f is Fixture => f !== undefined);

// ---------------------------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------------------------

/** A mutation that does not apply to this fixture; the iteration draws another. */
class Skip extends Error {}

interface Ctx {
  readonly rng: Rng;
  readonly ws: Workspace;
  readonly fx: Fixture;
  readonly log: string[];
  /** Current models (a reshaped tree replaces its pristine model). */
  dbs: DbModel[];
}

type Mutation = (c: Ctx) => void;

const INTERESTING_U64: readonly bigint[] = [
  0n,
  1n,
  2n,
  127n,
  128n,
  255n,
  256n,
  0x3fffn,
  0x4000n,
  65535n,
  65536n,
  1_000_000n,
  100_000_001n,
  2n ** 31n - 1n,
  2n ** 31n,
  2n ** 32n - 1n,
  2n ** 32n,
  2n ** 40n,
  2n ** 53n - 1n,
  2n ** 53n,
  2n ** 63n - 1n,
  2n ** 64n - 1n,
];

const INTERESTING_BYTES = [0x00, 0x01, 0x7f, 0x80, 0xfe, 0xff];

function interestingNumber(rng: Rng, old: bigint): bigint {
  return rng.weighted<() => bigint>([
    [6, () => rng.pick(INTERESTING_U64)],
    [2, () => old + BigInt(rng.range(1, 3))],
    [2, () => (old > 0n ? old - 1n : 1n)],
    [1, () => old * 2n + 1n],
    [1, () => BigInt(rng.u32())],
  ])();
}

/** The bytes of a field after a mutation: another value, a non-shortest or truncated varint, random bytes. */
function mutatedFieldBytes(rng: Rng, body: Uint8Array, f: Field): number[] {
  const old = body.subarray(f.start, f.end);
  switch (f.kind) {
    case "varint": {
      let v = 0n;
      old.forEach((b, i) => {
        v |= BigInt(b & 0x7f) << BigInt(7 * i);
      });
      return rng.weighted<() => number[]>([
        [8, () => varintBytes(interestingNumber(rng, v))],
        [1, () => overlongVarint(v, rng.range(old.length + 1, 11))],
        [1, () => [...old.subarray(0, -1), (old[old.length - 1] as number) | 0x80]], // continuation bit on the last byte
      ])();
    }
    case "u8":
      return [rng.pick([...INTERESTING_BYTES, ((old[0] as number) + 1) & 0xff, ((old[0] as number) - 1) & 0xff, rng.int(256)])];
    case "u32":
    case "u64": {
      const v = interestingNumber(rng, 0n);
      const out: number[] = [];
      for (let i = 0; i < old.length; i++) out.push(Number((v >> BigInt(8 * i)) & 0xffn));
      return out;
    }
    case "bytes": {
      const out = Array.from(old);
      if (out.length === 0) return [rng.int(256)];
      const n = rng.range(1, 3);
      for (let i = 0; i < n; i++) out[rng.int(out.length)] = rng.chance(0.5) ? rng.pick(INTERESTING_BYTES) : rng.int(256);
      return out;
    }
  }
}

/** Byte-level damage: bit flips, overwrites, insertions, deletions, truncation, extension. */
function damageBytes(rng: Rng, bytes: Uint8Array, log: string[]): Uint8Array {
  const b = Array.from(bytes);
  const at = () => rng.int(Math.max(b.length, 1));
  const op = rng.pick(["flip", "overwrite", "insert", "delete", "truncate", "extend", "copy"] as const);
  switch (op) {
    case "flip": {
      const n = rng.range(1, 8);
      for (let i = 0; i < n && b.length; i++) {
        const p = at();
        b[p] = (b[p] as number) ^ (1 << rng.int(8));
      }
      log.push(`flip ${n} bit(s)`);
      break;
    }
    case "overwrite": {
      const n = rng.range(1, 4);
      const p = at();
      for (let i = 0; i < n && p + i < b.length; i++) b[p + i] = rng.chance(0.6) ? rng.pick(INTERESTING_BYTES) : rng.int(256);
      log.push(`overwrite ${n} byte(s) at ${p}`);
      break;
    }
    case "insert": {
      const p = at();
      const n = rng.range(1, 16);
      b.splice(p, 0, ...rng.bytes(n));
      log.push(`insert ${n} byte(s) at ${p}`);
      break;
    }
    case "delete": {
      const p = at();
      const n = rng.range(1, 16);
      b.splice(p, n);
      log.push(`delete ${n} byte(s) at ${p}`);
      break;
    }
    case "truncate": {
      const n = rng.int(b.length + 1);
      b.length = n;
      log.push(`truncate to ${n} bytes`);
      break;
    }
    case "extend": {
      const n = rng.range(1, 64);
      b.push(...rng.bytes(n));
      log.push(`append ${n} random byte(s)`);
      break;
    }
    case "copy": {
      const from = at();
      const to = at();
      const n = rng.range(1, 32);
      const slice = b.slice(from, from + n);
      b.splice(to, slice.length, ...slice);
      log.push(`copy ${slice.length} byte(s) from ${from} to ${to}`);
      break;
    }
  }
  return Uint8Array.from(b);
}

/** The fixture's databases whose files exist in the workspace; the first one is what the reader opens. */
function liveDbs(c: Ctx): DbModel[] {
  const live = c.dbs.filter((d) => c.ws.exists(d.manifestKey));
  if (live.length === 0) throw new Skip("no database left");
  return live;
}

/** Mostly the database the reader opens; sometimes a per-process one (read once the merged root is gone). */
function pickDb(c: Ctx): DbModel {
  const live = liveDbs(c);
  return c.rng.chance(0.75) ? (live[0] as DbModel) : c.rng.pick(live);
}

type Target = { kind: "manifest"; db: DbModel } | { kind: "node"; db: DbModel; node: NodeInfo };

function pickTarget(c: Ctx): Target {
  const db = pickDb(c);
  if (db.nodes.length === 0 || c.rng.chance(0.25)) return { kind: "manifest", db };
  return { kind: "node", db, node: c.rng.pick(db.nodes) };
}

function describeTarget(t: Target): string {
  return t.kind === "manifest" ? t.db.manifestKey : `node ${t.node.id} (height ${t.node.height}) in ${t.node.dataKey}@${t.node.ref.offset}`;
}

function encodeTarget(t: Target) {
  return t.kind === "manifest" ? encodeManifest(t.db.manifest) : encodeBtreeNode(t.node.node, t.node.prefix, t.node.transitive);
}

/** Stores a new body for the target, in an envelope with a correct length and CRC (raw, or zstd sometimes). */
function storeBody(c: Ctx, t: Target, body: Uint8Array): void {
  const kind: EnvelopeKind = t.kind === "manifest" ? "manifest" : "btreeNode";
  const zstd = c.rng.chance(0.3);
  const env = zstd ? encodeEnvelope(kind, zstdFrame(body), { compression: 1 }) : encodeEnvelope(kind, body, { compression: 0 });
  storeEnvelope(c, t, env);
  c.log.push(`re-encoded ${zstd ? "zstd" : "raw"} with a valid CRC`);
}

function storeEnvelope(c: Ctx, t: Target, env: Uint8Array): void {
  if (t.kind === "manifest") c.ws.write(t.db.manifestKey, env);
  else replaceNode(c.ws, t.db, t.node.id, env);
}

/** 1. Raw damage to any file of the fixture (the CRC then mostly catches it: what a bad disk does). */
const rawFile: Mutation = (c) => {
  const files = c.ws.files();
  const weight = (k: string) => (/manifest\.ocdbt$|(^|\/)d\/[0-9a-f]+$|fuzz-tree$/.test(k) ? 3 : 1);
  const key = c.rng.weighted(files.map((k) => [weight(k), k] as const));
  const op = c.rng.weighted([
    [8, "damage"],
    [1, "remove"],
    [1, "empty"],
  ] as const);
  if (op === "remove") c.ws.remove(key);
  else if (op === "empty") c.ws.write(key, new Uint8Array(0));
  else c.ws.write(key, damageBytes(c.rng, c.ws.read(key), c.log));
  c.log.push(`raw ${op}: ${key}`);
};

/** 2. Damage inside a decoded (decompressed) manifest or node body, re-encoded with a valid CRC. */
const bodyDamage: Mutation = (c) => {
  const t = pickTarget(c);
  let bytes: Uint8Array;
  try {
    const file = c.ws.read(t.kind === "manifest" ? t.db.manifestKey : t.node.dataKey);
    bytes = t.kind === "manifest" ? file : file.subarray(t.node.ref.offset, t.node.ref.offset + t.node.ref.length);
    bytes = envelopeBody(bytes, t.kind === "manifest" ? "manifest" : "btreeNode");
  } catch {
    throw new Skip("target already damaged");
  }
  c.log.push(`body of ${describeTarget(t)}:`);
  storeBody(c, t, damageBytes(c.rng, bytes, c.log));
};

/**
 * 2b. Damage inside the stored payload of a manifest or node as TensorStore wrote it (real zstd-compressed
 * blocks), CRC and length recomputed: exercises the zstd decoder on corrupt compressed data.
 */
const payloadDamage: Mutation = (c) => {
  const t = pickTarget(c);
  const file = c.ws.read(t.kind === "manifest" ? t.db.manifestKey : t.node.dataKey);
  const env = t.kind === "manifest" ? file : file.slice(t.node.ref.offset, t.node.ref.offset + t.node.ref.length);
  if (env.length < 20) throw new Skip("envelope too short");
  const headerEnd = 14; // magic, length, version 0, compression: one byte each for what TensorStore writes
  c.log.push(`stored payload of ${describeTarget(t)} (compression ${env[13]}):`);
  const payload = damageBytes(c.rng, env.subarray(headerEnd, env.length - 4), c.log);
  storeEnvelope(c, t, resealEnvelope(concat(env.subarray(0, headerEnd), payload, [0, 0, 0, 0])));
  c.log.push("CRC recomputed");
};

/** 3. One field of a manifest or node set to an interesting value (or a non-shortest / truncated varint). */
const fieldValue: Mutation = (c) => {
  const t = pickTarget(c);
  const w = encodeTarget(t);
  const body = w.finish();
  const fields = w.fields;
  const f = c.rng.weighted(fields.map((x) => [x.kind === "bytes" ? 1 : 4, x] as const));
  const replacement = mutatedFieldBytes(c.rng, body, f);
  c.log.push(`field "${f.name}" at ${f.start} of ${describeTarget(t)}: [${Array.from(body.subarray(f.start, f.end))}] -> [${replacement}]`);
  storeBody(c, t, replaceField(body, f, replacement));
};

/** 4. Envelope header: version, compression, magic, length (with a valid CRC), or a bad CRC. */
const envelopeHeader: Mutation = (c) => {
  const t = pickTarget(c);
  const kind: EnvelopeKind = t.kind === "manifest" ? "manifest" : "btreeNode";
  const body = encodeTarget(t).finish();
  const choice = c.rng.int(6);
  const opts = [
    { compression: 0, versionBytes: [c.rng.range(1, 255) & 0x7f] },
    { compression: 0, versionBytes: overlongVarint(0, c.rng.range(2, 6)) },
    { compression: 0, compressionBytes: varintBytes(c.rng.pick([2, 3, 127, 128, 2 ** 32])) },
    { compression: 0, magic: c.rng.pick([0x0cdb3a2a, 0x0cdb1234, 0x0cdb20de, 0, 0xffffffff]) },
    { compression: 0, length: BigInt(body.length) + c.rng.pick([-1n, 1n, 2n ** 32n, 2n ** 63n]) },
    { compression: 0, badCrc: true },
  ][choice] as Parameters<typeof encodeEnvelope>[2];
  c.log.push(`envelope of ${describeTarget(t)}: ${JSON.stringify(opts, (_k, v) => (typeof v === "bigint" ? String(v) : v))}`);
  storeEnvelope(c, t, encodeEnvelope(kind, body, opts));
};

/** 5. zstd frame tricks around a valid body: wrong / huge declared sizes, windows, block layout, extra frames. */
const zstdTricks: Mutation = (c) => {
  const t = pickTarget(c);
  const kind: EnvelopeKind = t.kind === "manifest" ? "manifest" : "btreeNode";
  const body = encodeTarget(t).finish();
  const n = body.length;
  const trick = c.rng.pick([
    "size-1",
    "size+1",
    "size0",
    "no-size",
    "huge-size",
    "2GiB",
    "near-limit",
    "window",
    "small-blocks",
    "checksum",
    "no-last-block",
    "skippable",
    "two-frames",
    "trailing-garbage",
    "fcs-flag",
  ] as const);
  let payload: Uint8Array;
  switch (trick) {
    case "size-1":
      payload = zstdFrame(body, { contentSize: n - 1 });
      break;
    case "size+1":
      payload = zstdFrame(body, { contentSize: n + 1 });
      break;
    case "size0":
      payload = zstdFrame(body, { contentSize: 0 });
      break;
    case "no-size":
      payload = zstdFrame(body, { contentSize: null, singleSegment: false });
      break;
    case "huge-size":
      payload = zstdFrame(body, { contentSize: c.rng.pick([2n ** 40n, 2n ** 63n, 2n ** 64n - 1n]), fcsFlag: 3 });
      break;
    case "2GiB":
      payload = zstdFrame(body, { contentSize: 2 ** 31 });
      break;
    case "near-limit":
      payload = zstdFrame(body, { contentSize: c.rng.pick([99_999_999, 100_000_000, 100_000_001]) });
      break;
    case "window":
      payload = zstdFrame(body, { contentSize: c.rng.chance(0.5) ? null : n, singleSegment: false, windowDescriptor: c.rng.int(256) });
      break;
    case "small-blocks":
      payload = zstdFrame(body, { blockSize: c.rng.range(1, 64) });
      break;
    case "checksum":
      payload = zstdFrame(body, { checksum: true });
      break;
    case "no-last-block":
      payload = zstdFrame(body, { noLastBlock: true });
      break;
    case "skippable":
      payload = c.rng.chance(0.5)
        ? Buffer.concat([zstdSkippableFrame(c.rng.range(0, 64), c.rng.int(16)), zstdFrame(body)])
        : Buffer.concat([zstdFrame(body), zstdSkippableFrame(8, 0, c.rng.pick([0, 8, 2 ** 31, 2 ** 32 - 1]))]);
      break;
    case "two-frames": {
      const cut = c.rng.int(n + 1);
      payload = Buffer.concat([zstdFrame(body.subarray(0, cut)), zstdFrame(body.subarray(cut))]);
      break;
    }
    case "trailing-garbage":
      payload = Buffer.concat([zstdFrame(body), c.rng.bytes(c.rng.range(1, 12))]);
      break;
    case "fcs-flag":
      payload = zstdFrame(body, { fcsFlag: c.rng.pick([0, 1, 2, 3] as const), singleSegment: c.rng.chance(0.5) });
      break;
  }
  c.log.push(`zstd ${trick} around the body of ${describeTarget(t)}`);
  storeEnvelope(c, t, encodeEnvelope(kind, payload, { compression: 1 }));
};

const WEIRD_PATHS: readonly DataFileId[] = [
  { basePath: "", relativePath: "" },
  { basePath: "", relativePath: "d" },
  { basePath: "", relativePath: "d/" },
  { basePath: "", relativePath: "ocdbt.process_0" },
  { basePath: "", relativePath: "../manifest.ocdbt" },
  { basePath: "", relativePath: "d/../../_METADATA" },
  { basePath: "", relativePath: "/etc/hostname" },
  { basePath: "", relativePath: "d/\u0000" },
  { basePath: "", relativePath: "d\\x" },
  { basePath: "", relativePath: "d/missing" },
  { basePath: "", relativePath: "manifest.ocdbt" },
  { basePath: "", relativePath: "_METADATA" },
];

/** A data file for an entry of a node read through `transitive`: one the database uses, or a weird path. */
function pickFileId(c: Ctx, db: DbModel, transitive: string): DataFileId {
  const known = db.nodes
    .flatMap((n) =>
      n.height === 0
        ? (n.node.entries as LeafEntry[]).flatMap((e) => (e.value.kind === "indirect" ? [e.value.ref.file] : []))
        : (n.node.entries as InteriorEntry[]).map((e) => e.ref.file),
    )
    .filter((id) => id.basePath.startsWith(transitive));
  if (c.rng.chance(0.5) && known.length) return c.rng.pick(known);
  const weird = c.rng.pick(WEIRD_PATHS);
  return { basePath: transitive + weird.basePath, relativePath: weird.relativePath };
}

function leafNodes(c: Ctx): { db: DbModel; node: NodeInfo } {
  const db = pickDb(c);
  const leaves = db.nodes.filter((n) => n.height === 0);
  if (leaves.length === 0) throw new Skip("no leaf");
  return { db, node: c.rng.pick(leaves) };
}

/** A file's size in the workspace, or a guess when it is not there. */
function sizeOf(c: Ctx, db: DbModel, id: DataFileId): number {
  const key = `${db.root ? `${db.root}/` : ""}${id.basePath}${id.relativePath}`;
  try {
    return statSync(c.ws.path(key)).size;
  } catch {
    return 4096;
  }
}

/** 6. A leaf entry changed at the model level (values, references, kinds, keys), node re-encoded. */
const leafEntry: Mutation = (c) => {
  const { db, node } = leafNodes(c);
  const entries = [...(node.node.entries as LeafEntry[])];
  const i = c.rng.int(entries.length);
  const e = entries[i] as LeafEntry;
  const name = keyString(e.key);
  const op = c.rng.pick(["ref", "ref", "json", "json", "json", "inline-bytes", "kind", "entries"] as const);
  switch (op) {
    case "ref": {
      if (e.value.kind !== "indirect") throw new Skip("inline value");
      const ref = e.value.ref;
      const size = sizeOf(c, db, ref.file);
      const what = c.rng.pick(["offset", "length", "file", "range"] as const);
      const n = () => Number(c.rng.pick([0n, 1n, BigInt(size), BigInt(size + 1), 2n ** 31n, 2n ** 32n, 2n ** 40n]));
      const next =
        what === "offset"
          ? { ...ref, offset: n() }
          : what === "length"
            ? { ...ref, length: c.rng.chance(0.5) ? n() : Math.max(0, ref.length + c.rng.range(-8, 8)) }
            : what === "file"
              ? { ...ref, file: pickFileId(c, db, node.transitive) }
              : { ...ref, offset: c.rng.int(size + 1), length: c.rng.int(size + 1) };
      entries[i] = { key: e.key, value: { kind: "indirect", ref: next } };
      c.log.push(`value ${what} of ${name}: ${JSON.stringify({ ...ref, file: undefined })} -> ${JSON.stringify(next)}`);
      break;
    }
    case "json": {
      const meta = entries
        .map((x, j) => [x, j] as const)
        .filter(([x]) => x.value.kind === "inline" && /(\.zarray|zarr\.json)$/.test(keyString(x.key)));
      if (meta.length === 0) throw new Skip("no inline metadata");
      const [m, j] = c.rng.pick(meta);
      if (m.value.kind !== "inline") throw new Skip("not inline");
      const bytes = mutateJsonBytes(c, m.value.bytes, true);
      entries[j] = { key: m.key, value: { kind: "inline", bytes } };
      c.log.push(`in ${keyString(m.key)}`);
      break;
    }
    case "inline-bytes": {
      if (e.value.kind !== "inline") throw new Skip("not inline");
      c.log.push(`inline value of ${name}:`);
      entries[i] = { key: e.key, value: { kind: "inline", bytes: zstdHeaderOrDamage(c, e.value.bytes) } };
      break;
    }
    case "kind": {
      entries[i] =
        e.value.kind === "inline"
          ? {
              key: e.key,
              value: {
                kind: "indirect",
                ref: { file: pickFileId(c, db, node.transitive), offset: c.rng.int(4096), length: c.rng.int(4096) },
              },
            }
          : { key: e.key, value: { kind: "inline", bytes: c.rng.bytes(c.rng.int(64)) } };
      c.log.push(`value of ${name} switched from ${e.value.kind}`);
      break;
    }
    case "entries": {
      const what = c.rng.pick(["delete", "duplicate", "swap", "rename", "drop-metadata", "keep-one"] as const);
      if (what === "delete") entries.splice(i, 1);
      else if (what === "duplicate") entries.splice(i, 0, e);
      else if (what === "swap") {
        const j = c.rng.int(entries.length);
        entries[i] = entries[j] as LeafEntry;
        entries[j] = e;
      } else if (what === "rename") entries[i] = { ...e, key: Buffer.concat([e.key, c.rng.bytes(1)]) };
      else if (what === "drop-metadata")
        entries.splice(0, entries.length, ...entries.filter((x) => !/(\.zarray|zarr\.json)$/.test(keyString(x.key))));
      else entries.splice(0, entries.length, e);
      if (entries.length === 0) throw new Skip("would empty the node");
      c.log.push(`entries: ${what} at ${i} (${name})`);
      break;
    }
  }
  c.log.push(`in leaf ${describeTarget({ kind: "node", db, node })}`);
  rewriteNode(c.ws, db, node.id, { height: 0, entries }, c.rng.chance(0.3));
};

/** 7. An interior entry's child reference retargeted (cycles, other heights), or its range / file changed. */
const childRef: Mutation = (c) => {
  const db = pickDb(c);
  const interior = db.nodes.filter((n) => n.height > 0);
  if (interior.length === 0) throw new Skip("no interior node");
  const node = c.rng.pick(interior);
  const entries = [...(node.node.entries as InteriorEntry[])];
  const i = c.rng.int(entries.length);
  const e = entries[i] as InteriorEntry;
  const what = c.rng.pick(["retarget", "retarget", "offset", "length", "file", "prefix"] as const);
  if (what === "retarget") {
    const target = c.rng.pick(db.nodes);
    if (!target.ref.file.basePath.startsWith(node.transitive)) throw new Skip("other base path");
    entries[i] = { ...e, ref: target.ref };
    c.log.push(`child ${i} of node ${node.id} (height ${node.height}) -> node ${target.id} (height ${target.height})`);
  } else if (what === "file") {
    entries[i] = { ...e, ref: { ...e.ref, file: pickFileId(c, db, node.transitive) } };
    c.log.push(`child ${i} of node ${node.id}: file -> ${JSON.stringify(entries[i]?.ref.file)}`);
  } else if (what === "prefix") {
    const k = c.rng.int(e.key.length + 1);
    if (k < node.prefix.length) throw new Skip("prefix shorter than the node's");
    entries[i] = { ...e, childPrefix: e.key.subarray(0, k) };
    c.log.push(`child ${i} of node ${node.id}: subtree prefix length -> ${k}`);
  } else {
    const v = Number(c.rng.pick([0n, 1n, 12n, 2n ** 31n, 2n ** 32n, 2n ** 40n, BigInt(e.ref[what] + 1)]));
    entries[i] = { ...e, ref: { ...e.ref, [what]: v } };
    c.log.push(`child ${i} of node ${node.id}: ${what} ${e.ref[what]} -> ${v}`);
  }
  rewriteNode(c.ws, db, node.id, { height: node.height, entries });
};

/** 8. Rewrites the tree as a multi-level B+tree, then (mostly) damages it further. */
const reshape: Mutation = (c) => {
  const db = liveDbs(c)[0] as DbModel;
  const arity = c.rng.range(2, 8);
  const rebuilt = rebuildTree(c.ws, db, arity);
  c.dbs = c.dbs.map((d) => (d === db ? rebuilt : d));
  c.log.push(`reshaped ${db.manifestKey} into a tree of arity ${arity} (${rebuilt.nodes.length} nodes)`);
  if (c.rng.chance(0.8)) applyOne(c, [childRef, childRef, fieldValue, bodyDamage, leafEntry, zstdTricks]);
};

/** 9. Database-level: remove the merged root (readers fall back to the per-process union), numbered manifests, root file. */
const dbLevel: Mutation = (c) => {
  const db = pickDb(c);
  const op = c.rng.pick(["unmerge", "numbered", "root-file", "root-range"] as const);
  if (op === "unmerge") {
    if (c.fx.mode !== "step" || c.dbs.length < 2) throw new Skip("nothing to fall back to");
    c.ws.remove((c.dbs[0] as DbModel).manifestKey);
    c.log.push(`removed ${(c.dbs[0] as DbModel).manifestKey}`);
    if (c.rng.chance(0.7)) applyOne(c, [fieldValue, bodyDamage, leafEntry, zstdTricks, rawFile]);
    return;
  }
  const version = db.manifest.inlineVersions[db.manifest.inlineVersions.length - 1];
  if (!version?.root) throw new Skip("empty database");
  if (op === "numbered") {
    // Config-only manifest.ocdbt plus manifest.<16 hex> holding the versions.
    const config = { ...db.manifest.config, manifestKind: "numbered" as const };
    const w = encodeManifest({ ...db.manifest, config });
    const configOnly = w.finish().subarray(0, (w.fields.find((f) => f.name === "data file count") as Field).start);
    const name = c.rng.pick(["0000000000000001", `${version.generation.toString(16).padStart(16, "0")}`, "00000000000000ff"]);
    c.ws.write(db.manifestKey, encodeEnvelope("manifest", configOnly, { compression: 0 }));
    c.ws.write(
      db.manifestKey.replace(/ocdbt$/, name),
      encodeEnvelope("manifest", encodeManifest(db.manifest).finish(), { compression: 0 }),
    );
    c.log.push(`numbered manifest kind, versions in manifest.${name}`);
  } else if (op === "root-file") {
    const file = pickFileId(c, db, "");
    writeManifest(c.ws, db, withRoot(db.manifest, { ...version.root, file }));
    c.log.push(`root node file -> ${JSON.stringify(file)}`);
  } else {
    const length = Number(c.rng.pick([0n, 1n, 16n, BigInt(version.root.length - 1), 2n ** 31n, 2n ** 40n]));
    writeManifest(c.ws, db, withRoot(db.manifest, { ...version.root, length }, c.rng.chance(0.3) ? c.rng.range(0, 255) : undefined));
    c.log.push(`root node length -> ${length}`);
  }
};

/** 10. JSON documents: _METADATA, _CHECKPOINT_METADATA (structure-aware). */
const jsonFile: Mutation = (c) => {
  const keys = c.ws.files().filter((k) => /(^|\/)(_METADATA|_CHECKPOINT_METADATA)$/.test(k));
  if (keys.length === 0) throw new Skip("no JSON file");
  const key = c.rng.pick(keys);
  c.log.push(`in ${key}`);
  c.ws.write(key, mutateJsonBytes(c, c.ws.read(key), false));
};

/** 11. The zstd frame header of an out-of-line chunk, overwritten in its data file (data files have no CRC). */
const chunkHeader: Mutation = (c) => {
  const db = pickDb(c);
  const values = db.nodes.flatMap((n) =>
    n.height === 0 ? (n.node.entries as LeafEntry[]).flatMap((e) => (e.value.kind === "indirect" ? [e.value.ref] : [])) : [],
  );
  if (values.length === 0) throw new Skip("no out-of-line value");
  const ref = c.rng.pick(values);
  const key = `${db.root ? `${db.root}/` : ""}${ref.file.basePath}${ref.file.relativePath}`;
  if (!c.ws.exists(key)) throw new Skip("data file gone");
  const file = c.ws.read(key);
  if (ref.offset + ref.length > file.length) throw new Skip("data file already cut short");
  const value = file.subarray(ref.offset, ref.offset + ref.length);
  c.log.push(`chunk ${key}@${ref.offset}+${ref.length}:`);
  const next = zstdHeaderOrDamage(c, value);
  if (next.length !== value.length) throw new Skip("length changed");
  file.set(next, ref.offset);
  c.ws.write(key, file);
};

/** Overwrites zstd frame-header bytes (descriptor, window, content size, first block header) or damages bytes. */
function zstdHeaderOrDamage(c: Ctx, bytes: Uint8Array): Uint8Array {
  const out = bytes.slice();
  if (out.length < 9 || c.rng.chance(0.3)) return damageBytes(c.rng, bytes, c.log);
  const at = c.rng.pick([4, 5, 5, 6, 7, 8, 9, 10]);
  if (at >= out.length) return out;
  const v = c.rng.pick([...INTERESTING_BYTES, 0x20, 0x60, 0xa0, 0xe0, 0x08, 0x04, 0x03, c.rng.int(256)]);
  c.log.push(`zstd header byte ${at}: ${out[at]} -> ${v}`);
  out[at] = v;
  return out;
}

const JSON_VALUES: readonly unknown[] = [
  0,
  -1,
  1,
  2,
  1.5,
  255,
  65536,
  2 ** 31,
  2 ** 32,
  2 ** 40,
  2 ** 53 - 1,
  2 ** 53 + 2,
  1e21,
  1e308,
  "NaN",
  "Infinity",
  "0x7fc00000",
  "",
  "x",
  "0",
  "<f4",
  "|b1",
  "bfloat16",
  "zstd",
  "sharding_indexed",
  null,
  true,
  false,
  [],
  {},
  [0],
  [1, 1],
  [2 ** 31],
  [-1],
];

/** JSON-aware mutation (falls back to byte damage when the bytes are not JSON or 1 time in 5). */
function mutateJsonBytes(c: Ctx, bytes: Uint8Array, zarr: boolean): Uint8Array {
  let doc: unknown;
  try {
    doc = JSON.parse(keyString(bytes));
  } catch {
    return damageBytes(c.rng, bytes, c.log);
  }
  if (c.rng.chance(0.2)) return damageBytes(c.rng, bytes, c.log);
  for (let attempt = 0; attempt < 20; attempt++) {
    const copy = structuredClone(doc);
    const note = mutateJson(c.rng, copy);
    if (zarr && legitimatelyHuge(copy)) continue;
    c.log.push(`json ${note}`);
    return new TextEncoder().encode(JSON.stringify(copy));
  }
  throw new Skip("only huge-but-valid arrays came out");
}

type Slot = { parent: Record<string, unknown> | unknown[]; key: string | number; path: string };

function mutateJson(rng: Rng, doc: unknown): string {
  const slots: Slot[] = [];
  const walk = (v: unknown, path: string) => {
    if (Array.isArray(v))
      v.forEach((x, i) => {
        slots.push({ parent: v, key: i, path: `${path}[${i}]` });
        walk(x, `${path}[${i}]`);
      });
    else if (v !== null && typeof v === "object")
      for (const [k, x] of Object.entries(v)) {
        slots.push({ parent: v as Record<string, unknown>, key: k, path: `${path}.${k}` });
        walk(x, `${path}.${k}`);
      }
  };
  walk(doc, "");
  if (slots.length === 0) return "(no slot)";
  // Shapes and chunk shapes drive every allocation on the zarr side: favour them.
  const shapeSlots = slots.filter((s) => /shape|chunks/.test(s.path));
  const s = shapeSlots.length && rng.chance(0.5) ? rng.pick(shapeSlots) : rng.pick(slots);
  const get = () => (s.parent as Record<string | number, unknown>)[s.key];
  const set = (v: unknown) => {
    (s.parent as Record<string | number, unknown>)[s.key] = v;
  };
  const old = get();
  const op = rng.pick(["value", "value", "number", "delete", "grow", "shrink"] as const);
  if (op === "number" && typeof old === "number") {
    const v = rng.pick([old + 1, old - 1, old * 2, old * 1000, -old, old + 0.5, 2 ** 31, 2 ** 40]);
    set(v);
    return `${s.path}: ${old} -> ${v}`;
  }
  if (op === "delete") {
    if (Array.isArray(s.parent)) s.parent.splice(s.key as number, 1);
    else delete s.parent[s.key as string];
    return `${s.path}: deleted`;
  }
  if (op === "grow" && Array.isArray(old)) {
    old.push(old.length ? old[old.length - 1] : 1);
    return `${s.path}: one more element`;
  }
  if (op === "shrink" && Array.isArray(old) && old.length) {
    old.pop();
    return `${s.path}: one element fewer`;
  }
  const v = structuredClone(rng.pick(JSON_VALUES));
  set(v);
  return `${s.path}: ${JSON.stringify(old)?.slice(0, 40)} -> ${JSON.stringify(v)}`;
}

/**
 * True when zarr metadata still describes a well-formed array whose absent chunks read as a fill value but
 * whose declared size is huge: reading it legitimately takes time and memory proportional to that size.
 */
function legitimatelyHuge(doc: unknown): boolean {
  if (doc === null || typeof doc !== "object") return false;
  const j = doc as Record<string, unknown>;
  const hasFill = j.zarr_format === 3 || (j.fill_value !== null && j.fill_value !== undefined);
  if (!hasFill) return false;
  const dims = (v: unknown) => (Array.isArray(v) && v.every((x) => Number.isSafeInteger(x) && x >= 0) ? (v as number[]) : undefined);
  const grid = j.chunk_grid as { configuration?: { chunk_shape?: unknown } } | undefined;
  const codec = (Array.isArray(j.codecs) ? j.codecs[0] : undefined) as { configuration?: { chunk_shape?: unknown } } | undefined;
  const sizes = [j.shape, j.chunks, grid?.configuration?.chunk_shape, codec?.configuration?.chunk_shape]
    .map(dims)
    .filter((d): d is number[] => d !== undefined)
    .map((d) => d.reduce((a, b) => a * b, 1) * 16);
  return sizes.some((s) => s > MAX_DECLARED_ARRAY_BYTES);
}

const MUTATIONS: readonly (readonly [number, Mutation])[] = [
  [12, rawFile],
  [12, bodyDamage],
  [6, payloadDamage],
  [20, fieldValue],
  [5, envelopeHeader],
  [8, zstdTricks],
  [18, leafEntry],
  [6, childRef],
  [8, reshape],
  [5, dbLevel],
  [4, jsonFile],
  [6, chunkHeader],
];

function applyOne(c: Ctx, choices: readonly Mutation[] | readonly (readonly [number, Mutation])[]): void {
  const weighted = (choices as readonly unknown[]).map((x) => (typeof x === "function" ? ([1, x] as const) : x)) as [number, Mutation][];
  for (let attempt = 0; attempt < 20; attempt++) {
    const m = c.rng.weighted(weighted);
    try {
      m(c);
      return;
    } catch (e) {
      if (!(e instanceof Skip)) throw e;
    }
  }
  c.log.push("(no applicable mutation)");
}

function mutate(c: Ctx): void {
  applyOne(c, MUTATIONS);
  if (c.rng.chance(0.2)) applyOne(c, [rawFile, fieldValue, leafEntry, chunkHeader, jsonFile]);
}

// ---------------------------------------------------------------------------------------------------------
// The loop
// ---------------------------------------------------------------------------------------------------------

interface Failure {
  readonly iteration: number;
  readonly fixture: string;
  readonly mutations: readonly string[];
  readonly problem: string;
  readonly savedAt: string;
}

/** A short signature to group failures: the problem's first line and the first src/ frame of its stack. */
function signature(problem: string): string {
  const first = problem.split("\n")[0]?.replace(/\d{3,}/g, "N") ?? "";
  const frame = /at [^\n]*?src\/[^\n]*?\.[jt]s:\d+/.exec(problem)?.[0] ?? "";
  return `${first.slice(0, 120)} ${frame.replace(/\S*?\/src\//, "src/")}`;
}

test(
  `fuzz: mutated fixtures give only typed errors (seed ${SEED}, ${ONLY_ITER === undefined ? `${SECONDS} s` : `iteration ${ONLY_ITER}`})`,
  async () => {
    console.log(`fuzz seed ${SEED}: replay with FUZZ_SEED=${SEED} (one iteration: FUZZ_SEED=${SEED} FUZZ_ITER=<i>)`);
    const runner = await FuzzRunner.create();
    const work = mkdtempSync(join(tmpdir(), "orbax2reg-fuzz-"));
    const keep = env.FUZZ_KEEP ?? join(tmpdir(), `orbax2reg-fuzz-failures-${SEED}`);
    if (env.FUZZ_KEEP === undefined) rmSync(keep, { recursive: true, force: true });
    const failures: Failure[] = [];
    const outcomes = new Map<string, number>();
    const t0 = performance.now();
    let iterations = 0;
    try {
      const copies = new Map<Fixture, Workspace>();
      for (const fx of FIXTURES) {
        const ws = workingCopy(fx, work);
        copies.set(fx, ws);
        const r = await runner.run({ mode: fx.mode, dir: ws.dir }, 30_000);
        expect(r.outcome, `pristine ${fx.name}: ${JSON.stringify(r.error)}`).toBe("ok");
      }
      for (let i = ONLY_ITER ?? 0; ; i++) {
        if (ONLY_ITER !== undefined ? i !== ONLY_ITER : performance.now() - t0 > SECONDS * 1000) break;
        const rng = new Rng(iterationSeed(SEED, i));
        const fx = rng.pick(FIXTURES);
        const ws = workingCopy(fx, work, copies.get(fx));
        copies.set(fx, ws);
        const dir = ws.dir;
        const ctx: Ctx = { rng, ws, fx, log: [], dbs: [...fx.dbs] };
        try {
          mutate(ctx);
        } catch (e) {
          // A bug in this test, not in src/: report it like a failure, keep fuzzing.
          const problem = `fuzz harness error while mutating (a bug in the test): ${(e as Error).stack}`;
          failures.push({ iteration: i, fixture: fx.name, mutations: [...ctx.log], problem, savedAt: "not saved" });
          continue;
        }
        const r: JobResult = await runner.run({ mode: fx.mode, dir }, ITER_TIMEOUT_MS);
        iterations++;
        const label = r.outcome === "typed" ? `typed ${r.error?.name}` : r.outcome;
        outcomes.set(label, (outcomes.get(label) ?? 0) + 1);
        if (ONLY_ITER !== undefined) console.log(`iteration ${i} (${fx.name}): ${ctx.log.join("; ")}\n-> ${JSON.stringify(r, null, 2)}`);
        const problem = violation(r);
        if (problem === undefined) continue;
        let savedAt = "not saved: over 50 failures";
        if (failures.length < 50) {
          savedAt = join(keep, `iter-${i}`);
          mkdirSync(savedAt, { recursive: true });
          cpSync(dir, join(savedAt, basename(dir)), { recursive: true });
        }
        failures.push({ iteration: i, fixture: fx.name, mutations: [...ctx.log], problem, savedAt });
      }
    } finally {
      await runner.close();
      rmSync(work, { recursive: true, force: true });
    }
    const seconds = ((performance.now() - t0) / 1000).toFixed(1);
    const histogram = [...outcomes].sort((a, b) => b[1] - a[1]).map(([k, n]) => `${k}: ${n}`);
    console.log(
      `fuzz seed ${SEED}: ${iterations} iterations in ${seconds} s over ${FIXTURES.map((f) => f.name).join(", ")}; ` +
        `${runner.workersStarted} worker(s); outcomes: ${histogram.join(", ")}`,
    );
    const groups = new Map<string, Failure[]>();
    for (const f of failures) groups.set(signature(f.problem), [...(groups.get(signature(f.problem)) ?? []), f]);
    const summary = [...groups.values()].map((fs) => {
      const f = fs[0] as Failure;
      return [
        `${fs.length}x ${f.problem.split("\n").slice(0, 6).join("\n    ")}`,
        `  first: iteration ${f.iteration} on ${f.fixture}: ${f.mutations.join("; ")}`,
        `  replay: FUZZ_SEED=${SEED} FUZZ_ITER=${f.iteration} npx vitest run test/fuzz/ocdbt-fuzz.test.ts   (case: ${f.savedAt})`,
      ].join("\n");
    });
    expect(failures.length, `${failures.length} failing iteration(s), ${groups.size} distinct:\n\n${summary.join("\n\n")}`).toBe(0);
  },
  (ONLY_ITER === undefined ? SECONDS * 1000 : 0) + 120_000,
);
