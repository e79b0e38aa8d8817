/**
 * Shared machinery for the fuzz tests (test/fuzz/*.test.ts):
 *
 * 1. a seeded PRNG;
 * 2. small OCDBT *encoders* (envelope, zstd raw-block frames, data-file table, manifest, B+tree node) that
 *    record where every field lies, so a test can decode a real node with src/, change one field or the
 *    decompressed body, and write it back with a correct length and CRC-32C: the decoder itself, not only
 *    the checksum, then sees the corruption;
 * 3. a model of a database's tree (loaded from a pristine fixture) and a workspace that rewrites a node by
 *    appending the new encoding to its data file and re-linking every ancestor up to the manifest;
 * 4. a runner that executes openStep + inspectStep (or a raw database listing) in a worker thread, so a hang
 *    (even a loop that never yields to the event loop) is ended by terminating the worker, and that counts
 *    every typed-array / ArrayBuffer allocation, so an allocation past the limit is seen even when it is
 *    transient or lazily committed.
 *
 * The worker runs a copy of src/ transpiled with the project's own `typescript` (transpileModule, no type
 * check) into a temporary directory; nothing under src/ or dist/ is touched.
 */
import {
  appendFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from "node:fs";
import { tmpdir } from "node:os";
import { dirname, join, relative, resolve } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import v8 from "node:v8";
import vm from "node:vm";
import { parentPort, Worker } from "node:worker_threads";
import { Orbax2RegError } from "../../src/errors.js";
import { type BtreeNode, decodeBtreeNode, type InteriorEntry, type LeafEntry } from "../../src/ocdbt/btree.js";
import type { DataFileId } from "../../src/ocdbt/data-file-table.js";
import { OcdbtDatabase } from "../../src/ocdbt/database.js";
import { decodeEnvelope, type EnvelopeKind } from "../../src/ocdbt/envelope.js";
import { decodeManifest } from "../../src/ocdbt/manifest.js";
import type { IndirectRef } from "../../src/ocdbt/node-reference.js";
import { inspectStep } from "../../src/orbax/inspect.js";
import { openStep } from "../../src/orbax/step.js";
import { LocalStore } from "../../src/store/local.js";
import { joinKey } from "../../src/store/store.js";
import { encodeBtreeNode, encodeManifest, envelopeOf, type VersionsManifest } from "../helpers/ocdbt-encode.js";
import { prng } from "../helpers/prng.js";

/** Orbax's max_decoded_node_bytes (100 MB): no single allocation and no retained growth may pass it. */
export const MEMORY_LIMIT = 100_000_000;

// ---------------------------------------------------------------------------------------------------------
// PRNG
// ---------------------------------------------------------------------------------------------------------

/** Mutations drawn from prng (mulberry32): the whole run is a function of the seed. */
export class Rng {
  private readonly next: () => number;
  constructor(seed: number) {
    this.next = prng(seed);
  }
  u32(): number {
    return this.next() * 2 ** 32;
  }
  /** Uniform in [0, n). */
  int(n: number): number {
    return Math.floor((this.u32() / 2 ** 32) * n);
  }
  /** Uniform in [lo, hi]. */
  range(lo: number, hi: number): number {
    return lo + this.int(hi - lo + 1);
  }
  chance(p: number): boolean {
    return this.u32() / 2 ** 32 < p;
  }
  pick<T>(xs: readonly T[]): T {
    if (xs.length === 0) throw new Error("pick from an empty list");
    return xs[this.int(xs.length)] as T;
  }
  /** Picks by weight: `[[weight, value], ...]`. */
  weighted<T>(choices: readonly (readonly [number, T])[]): T {
    const total = choices.reduce((s, [w]) => s + w, 0);
    let x = (this.u32() / 2 ** 32) * total;
    for (const [w, v] of choices) {
      x -= w;
      if (x < 0) return v;
    }
    return (choices[choices.length - 1] as readonly [number, T])[1];
  }
  bytes(n: number): Uint8Array {
    const out = new Uint8Array(n);
    for (let i = 0; i < n; i++) out[i] = this.u32() & 0xff;
    return out;
  }
}

/** The seed of iteration `i` of a run: every iteration can be replayed alone (FUZZ_SEED + FUZZ_ITER). */
export function iterationSeed(seed: number, i: number): number {
  let h = Math.imul(seed ^ 0x9e3779b9, 0x85ebca6b) ^ Math.imul(i + 1, 0xc2b2ae35);
  h = Math.imul(h ^ (h >>> 16), 0x7feb352d);
  h = Math.imul(h ^ (h >>> 15), 0x846ca68b);
  return (h ^ (h >>> 16)) >>> 0;
}

// ---------------------------------------------------------------------------------------------------------
// OCDBT encoders: the shared test encoder (test/helpers/ocdbt-encode.ts), re-exported for the fuzz tests
// ---------------------------------------------------------------------------------------------------------

export {
  concat,
  encodeBtreeNode,
  encodeEnvelope,
  encodeManifest,
  envelopeOf,
  type Field,
  type FieldKind,
  FieldWriter,
  overlongVarint,
  type RawEnvelopeOptions as EnvelopeOptions,
  replaceField,
  resealEnvelope,
  type VersionsManifest,
  varintBytes,
  writeDataFileTable,
  type ZstdFrameOptions,
  zstdFrame,
  zstdSkippableFrame,
} from "../helpers/ocdbt-encode.js";

/** The decoded (decompressed) body of a valid envelope, decoded by src/. */
export function envelopeBody(bytes: Uint8Array, kind: EnvelopeKind): Uint8Array {
  return decodeEnvelope(bytes, kind, "fuzz", 1 << 30).bytes.slice();
}

function lcp(a: Uint8Array, b: Uint8Array): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

// ---------------------------------------------------------------------------------------------------------
// Database model and workspace
// ---------------------------------------------------------------------------------------------------------

export interface NodeInfo {
  readonly id: number;
  /** Store key (relative to the workspace root) of the data file holding the node. */
  readonly dataKey: string;
  readonly ref: IndirectRef;
  /** Base path the node is read through (its data-file table is relative to it). */
  readonly transitive: string;
  readonly prefix: Uint8Array;
  readonly height: number;
  readonly node: BtreeNode;
  readonly parent: { readonly node: number; readonly entry: number } | "manifest";
}

export interface DbModel {
  /** Key prefix of the database inside the workspace ("" for the workspace root). */
  readonly root: string;
  readonly manifestKey: string;
  readonly manifest: VersionsManifest;
  readonly nodes: readonly NodeInfo[];
}

/** Reads a database's manifest and every node of its latest version, with src/'s own decoders. */
export function loadDb(dir: string, root: string): DbModel {
  const read = (key: string) => new Uint8Array(readFileSync(join(dir, ...key.split("/"))));
  const manifestKey = joinKey(root, "manifest.ocdbt");
  const manifest = decodeManifest(decodeEnvelope(read(manifestKey), "manifest", manifestKey, 1 << 30));
  if (manifest.kind !== "versions") throw new Error(`${manifestKey}: numbered manifests are not modelled`);
  const nodes: NodeInfo[] = [];
  const latest = manifest.inlineVersions[manifest.inlineVersions.length - 1];
  const visit = (ref: IndirectRef, prefix: Uint8Array, height: number, parent: NodeInfo["parent"]) => {
    const dataKey = joinKey(root, ref.file.basePath + ref.file.relativePath);
    const bytes = read(dataKey).subarray(ref.offset, ref.offset + ref.length);
    const body = decodeEnvelope(bytes, "btreeNode", dataKey, 1 << 30);
    const node = decodeBtreeNode(body, prefix, ref.file.basePath, height);
    const info: NodeInfo = { id: nodes.length, dataKey, ref, transitive: ref.file.basePath, prefix, height, node, parent };
    nodes.push(info);
    if (height > 0) {
      (node.entries as InteriorEntry[]).forEach((e, i) => {
        visit(e.ref, e.childPrefix, height - 1, { node: info.id, entry: i });
      });
    }
  };
  if (latest?.root) visit(latest.root, new Uint8Array(0), latest.rootHeight, "manifest");
  return { root, manifestKey, manifest, nodes };
}

/** Every leaf entry of the model, in key order. */
export function leafEntries(db: DbModel): LeafEntry[] {
  const out: LeafEntry[] = [];
  const byEntry = (a: NodeInfo, b: NodeInfo) =>
    (a.parent === "manifest" ? 0 : a.parent.entry) - (b.parent === "manifest" ? 0 : b.parent.entry);
  const walk = (id: number) => {
    const info = db.nodes[id] as NodeInfo;
    if (info.height === 0) out.push(...(info.node.entries as LeafEntry[]));
    else for (const child of db.nodes.filter((n) => n.parent !== "manifest" && n.parent.node === id).sort(byEntry)) walk(child.id);
  };
  const root = db.nodes.find((n) => n.parent === "manifest");
  if (root) walk(root.id);
  return out;
}

/**
 * A mutable copy of a fixture directory; keys are `/`-separated paths relative to it. Every key written,
 * appended to or removed is recorded in `touched`, so the copy can be restored file by file.
 */
export class Workspace {
  readonly touched = new Set<string>();
  constructor(readonly dir: string) {}
  path(key: string): string {
    return join(this.dir, ...key.split("/"));
  }
  exists(key: string): boolean {
    return existsSync(this.path(key));
  }
  read(key: string): Uint8Array {
    return new Uint8Array(readFileSync(this.path(key)));
  }
  write(key: string, bytes: Uint8Array): void {
    this.touched.add(key);
    mkdirSync(dirname(this.path(key)), { recursive: true });
    writeFileSync(this.path(key), bytes);
  }
  /** Appends and returns the offset the bytes start at. */
  append(key: string, bytes: Uint8Array): number {
    this.touched.add(key);
    const offset = existsSync(this.path(key)) ? statSync(this.path(key)).size : 0;
    mkdirSync(dirname(this.path(key)), { recursive: true });
    appendFileSync(this.path(key), bytes);
    return offset;
  }
  remove(key: string): void {
    this.touched.add(key);
    rmSync(this.path(key), { force: true });
  }
  /** Every file, as keys, sorted. */
  files(): string[] {
    return readdirSync(this.dir, { recursive: true, withFileTypes: true })
      .filter((e) => e.isFile())
      .map((e) => relative(this.dir, join(e.parentPath, e.name)).split("\\").join("/"))
      .sort();
  }
}

/** Writes a manifest raw (compression 0). */
export function writeManifest(ws: Workspace, db: DbModel, manifest: VersionsManifest, zstd = false): void {
  ws.write(db.manifestKey, envelopeOf("manifest", encodeManifest(manifest).finish(), zstd));
}

/** The manifest with its latest version's root replaced. */
export function withRoot(m: VersionsManifest, root: IndirectRef, rootHeight?: number): VersionsManifest {
  const versions = [...m.inlineVersions];
  const last = versions[versions.length - 1];
  if (last === undefined) throw new Error("manifest has no version");
  versions[versions.length - 1] = { ...last, root, rootHeight: rootHeight ?? last.rootHeight };
  return { ...m, inlineVersions: versions };
}

/**
 * Stores `envelope` as the new encoding of node `id`: appended to the node's data file, then every ancestor
 * re-encoded (raw) with the new reference, up to the manifest. Other nodes and values keep their offsets.
 */
export function replaceNode(ws: Workspace, db: DbModel, id: number, envelope: Uint8Array): void {
  const info = db.nodes[id] as NodeInfo;
  const offset = ws.append(info.dataKey, envelope);
  relink(ws, db, id, { ...info.ref, offset, length: envelope.length });
}

function relink(ws: Workspace, db: DbModel, id: number, ref: IndirectRef): void {
  const info = db.nodes[id] as NodeInfo;
  if (info.parent === "manifest") {
    writeManifest(ws, db, withRoot(db.manifest, ref));
    return;
  }
  const { node: parentId, entry } = info.parent;
  const parent = db.nodes[parentId] as NodeInfo;
  const entries = (parent.node.entries as InteriorEntry[]).map((e, i) => (i === entry ? { ...e, ref } : e));
  const body = encodeBtreeNode({ height: parent.height, entries }, parent.prefix, parent.transitive).finish();
  replaceNode(ws, db, parentId, envelopeOf("btreeNode", body));
}

/** Re-encodes node `id` after `edit` changed its entries (a model-level mutation). */
export function rewriteNode(ws: Workspace, db: DbModel, id: number, node: BtreeNode, zstd = false): void {
  const info = db.nodes[id] as NodeInfo;
  replaceNode(ws, db, id, envelopeOf("btreeNode", encodeBtreeNode(node, info.prefix, info.transitive).finish(), zstd));
}

/**
 * Rewrites the whole tree as a fresh B+tree of the given arity (leaves of `arity` entries, interior nodes
 * of `arity` children) in a new data file `<root>/d/fuzz-tree`, with the same keys and values, and points
 * the manifest at it. Turns a fixture whose tree is a single leaf into one with interior nodes.
 */
export function rebuildTree(ws: Workspace, db: DbModel, arity: number): DbModel {
  const entries = leafEntries(db);
  if (entries.length === 0) return db;
  const file: DataFileId = { basePath: "", relativePath: "d/fuzz-tree" };
  const dataKey = joinKey(db.root, "d/fuzz-tree");
  interface Built {
    first: Uint8Array;
    last: Uint8Array;
    lcp: Uint8Array;
    numKeys: number;
    ref: IndirectRef;
    node: BtreeNode;
    children: Built[];
  }
  const write = (node: BtreeNode, first: Uint8Array, last: Uint8Array, children: Built[], numKeys: number): Built => {
    const prefix = first.subarray(0, lcp(first, last));
    const env = envelopeOf("btreeNode", encodeBtreeNode(node, prefix, "").finish());
    const offset = ws.append(dataKey, env);
    return { first, last, lcp: prefix, numKeys, ref: { file, offset, length: env.length }, node, children };
  };
  let level: Built[] = [];
  for (let i = 0; i < entries.length; i += arity) {
    const chunk = entries.slice(i, i + arity);
    const first = (chunk[0] as LeafEntry).key;
    const last = (chunk[chunk.length - 1] as LeafEntry).key;
    level.push(write({ height: 0, entries: chunk }, first, last, [], chunk.length));
  }
  let height = 0;
  while (level.length > 1) {
    height++;
    const next: Built[] = [];
    for (let i = 0; i < level.length; i += arity) {
      const kids = level.slice(i, i + arity);
      const ents: InteriorEntry[] = kids.map((k) => ({
        key: k.first,
        childPrefix: k.lcp,
        ref: k.ref,
        stats: { numKeys: k.numKeys, numTreeBytes: k.ref.length, numIndirectValueBytes: 0 },
      }));
      const first = (kids[0] as Built).first;
      const last = (kids[kids.length - 1] as Built).last;
      next.push(
        write(
          { height, entries: ents },
          first,
          last,
          kids,
          kids.reduce((s, k) => s + k.numKeys, 0),
        ),
      );
    }
    level = next;
  }
  const top = level[0] as Built;
  const manifest = withRoot(db.manifest, top.ref, height);
  writeManifest(ws, db, manifest);
  const nodes: NodeInfo[] = [];
  const add = (b: Built, h: number, prefix: Uint8Array, parent: NodeInfo["parent"]) => {
    const info: NodeInfo = { id: nodes.length, dataKey, ref: b.ref, transitive: "", prefix, height: h, node: b.node, parent };
    nodes.push(info);
    b.children.forEach((c, i) => {
      add(c, h - 1, c.lcp, { node: info.id, entry: i });
    });
  };
  add(top, height, new Uint8Array(0), "manifest");
  return { root: db.root, manifestKey: db.manifestKey, manifest, nodes };
}

// ---------------------------------------------------------------------------------------------------------
// Running the code under test in a worker
// ---------------------------------------------------------------------------------------------------------

export interface Job {
  /**
   * "step": openStep + inspectStep({checksums: true}) + a few get()s; "get": openStep + one get(`key`);
   * "db": OcdbtDatabase.open on `dir`, list, get and read every value.
   */
  readonly mode: "step" | "get" | "db";
  readonly dir: string;
  readonly key?: string;
}

export type Outcome = "ok" | "typed" | "untyped" | "timeout" | "crash";

export interface ErrorInfo {
  readonly name: string;
  readonly code?: string;
  readonly message: string;
  readonly stack?: string;
}

export interface JobResult {
  readonly outcome: Outcome;
  /** The first error (for "untyped": the first non-Orbax2RegError). */
  readonly error?: ErrorInfo;
  /** The largest single typed-array / ArrayBuffer allocation during the job, in bytes. */
  readonly maxAlloc: number;
  /** Stack of the first allocation larger than MEMORY_LIMIT. */
  readonly allocStack?: string;
  /** process.memoryUsage().arrayBuffers of the worker after the job (after a gc when it is over 16 MiB). */
  readonly arrayBuffers: number;
  /** arrayBuffers minus the worker's value after its first job. */
  readonly arrayBuffersGrowth: number;
  readonly unhandledRejections: readonly string[];
  readonly ms: number;
}

interface AllocStats {
  max: number;
  stack: string | undefined;
  /** The same maximum in memory shared with the main thread, readable after the worker is terminated. */
  shared: Float64Array;
}

/** Set by the worker bootstrap (below), before any module that allocates is loaded. */
function allocStats(): AllocStats | undefined {
  return (globalThis as { __orbax2regFuzzAlloc?: AllocStats }).__orbax2regFuzzAlloc;
}

function errorInfo(e: unknown): ErrorInfo {
  if (e instanceof Error) {
    const code = (e as { code?: unknown }).code;
    return { name: e.name, ...(typeof code === "string" ? { code } : {}), message: e.message, ...(e.stack ? { stack: e.stack } : {}) };
  }
  return { name: typeof e, message: String(e) };
}

async function exerciseStep(dir: string): Promise<void> {
  const step = await openStep(dir);
  try {
    await inspectStep(step, { checksums: true });
  } finally {
    // Point lookups walk the tree differently from listings (and are what conversion uses).
    const names = step.leaves.filter((l) => l.isArray).map((l) => l.name);
    for (const name of names.slice(0, 4)) {
      await step.source.get(`${name}/.zarray`).catch(ignoreTyped);
      await step.source.get(`${name}/zarr.json`).catch(ignoreTyped);
    }
    await step.source.get("~missing").catch(ignoreTyped);
  }
}

function ignoreTyped(e: unknown): undefined {
  if (e instanceof Orbax2RegError) return undefined;
  throw e;
}

async function exerciseDb(dir: string): Promise<void> {
  const db = await OcdbtDatabase.open(new LocalStore(dir), "");
  const keys: string[] = [];
  for await (const e of db.list("")) {
    keys.push(e.key);
    await db.readValue(e.value);
  }
  for (const k of [...keys.slice(0, 16), "", "~missing", "baz/", "baz/y"]) {
    const e = await db.get(k);
    if (e) await db.readValue(e.value);
  }
  for await (const _ of db.list("baz/")) {
    // prefix listing: exercises the bounded walk
  }
}

/** ArrayBuffer memory above which the worker collects garbage before reporting it. */
const GC_THRESHOLD = 16 << 20;

/** Worker side: answers each Job with a JobResult. Started by the bootstrap in FuzzRunner. */
export async function workerMain(): Promise<void> {
  const port = parentPort;
  if (port === null) throw new Error("workerMain outside a worker");
  let gc: (() => void) | undefined;
  try {
    v8.setFlagsFromString("--expose-gc");
    gc = vm.runInNewContext("gc") as () => void;
  } catch {
    gc = undefined;
  }
  let rejections: string[] = [];
  process.on("unhandledRejection", (r) => rejections.push(errorInfo(r).stack ?? String(r)));
  port.postMessage("ready");
  port.on("message", async (job: Job) => {
    const stats = allocStats();
    if (stats) {
      stats.max = 0;
      stats.stack = undefined;
      stats.shared[0] = 0;
    }
    rejections = [];
    const t0 = performance.now();
    let outcome: Outcome = "ok";
    let error: ErrorInfo | undefined;
    try {
      if (job.mode === "step") await exerciseStep(job.dir);
      else if (job.mode === "get") await (await openStep(job.dir)).source.get(job.key ?? "");
      else await exerciseDb(job.dir);
    } catch (e) {
      outcome = e instanceof Orbax2RegError ? "typed" : "untyped";
      error = errorInfo(e);
    }
    const ms = performance.now() - t0;
    // Let stray rejections (prefetched nodes nobody awaited) surface before reporting.
    await new Promise((r) => setTimeout(r, 0));
    // A full gc costs more than most jobs: collect only when what is left could matter (retained growth).
    if (process.memoryUsage().arrayBuffers > GC_THRESHOLD) gc?.();
    const result: Omit<JobResult, "arrayBuffersGrowth"> = {
      outcome,
      ...(error ? { error } : {}),
      maxAlloc: stats?.max ?? 0,
      ...(stats?.stack ? { allocStack: stats.stack } : {}),
      arrayBuffers: process.memoryUsage().arrayBuffers,
      unhandledRejections: rejections,
      ms,
    };
    port.postMessage(result);
  });
}

/**
 * Runs in the worker before anything else (CommonJS, `eval: true`). Wraps every typed-array and
 * ArrayBuffer constructor in a Proxy, and Buffer.alloc*, to record the largest requested size (also in
 * shared memory, so the main thread still knows it after terminating a hung worker) and to refuse with a
 * RangeError anything over `hardLimit`: a bad input can then neither take the machine down nor reach
 * fs.read with a length past 2^31 (which aborts the whole process on Node 20). Then loads the transpiled
 * copy of this file and calls workerMain; fzstd, zstd-napi and src/ all see the wrapped functions.
 */
const BOOTSTRAP = `
const { workerData } = require("node:worker_threads");
process.setSourceMapsEnabled(true);
const stats = { max: 0, stack: undefined, shared: new Float64Array(workerData.shared) };
globalThis.__orbax2regFuzzAlloc = stats;
const track = (bytes) => {
  if (!(bytes > stats.max)) return;
  stats.max = bytes;
  stats.shared[0] = bytes;
  if (bytes > workerData.reportLimit && stats.stack === undefined) stats.stack = new Error("allocation of " + bytes + " bytes").stack;
  if (bytes > workerData.hardLimit) throw new RangeError("fuzz harness: refused an allocation of " + bytes + " bytes");
};
for (const name of ["ArrayBuffer", "SharedArrayBuffer", "Uint8Array", "Uint8ClampedArray", "Int8Array", "Uint16Array", "Int16Array",
    "Uint32Array", "Int32Array", "Float32Array", "Float64Array", "BigInt64Array", "BigUint64Array"]) {
  const C = globalThis[name];
  const bpe = C.BYTES_PER_ELEMENT || 1;
  globalThis[name] = new Proxy(C, {
    construct(target, args, newTarget) {
      if (typeof args[0] === "number") track(args[0] * bpe);
      return Reflect.construct(target, args, newTarget);
    },
  });
}
// Buffer.alloc* create their memory inside Node (not through the globals above); zstd-napi, for one, sizes
// its output with Buffer.allocUnsafe(declared content size).
for (const name of ["alloc", "allocUnsafe", "allocUnsafeSlow"]) {
  const f = Buffer[name];
  Buffer[name] = function (size, ...rest) {
    if (typeof size === "number") track(size);
    return f.call(this, size, ...rest);
  };
}
import(workerData.entry).then((m) => m.workerMain());
`;

const REPO = resolve(dirname(fileURLToPath(import.meta.url)), "../..");

/** Transpiles src/**\/*.ts and this file into a temporary ESM tree the worker can import. */
async function transpileForWorker(): Promise<string> {
  const ts = (await import("typescript")).default;
  const out = mkdtempSync(join(tmpdir(), "orbax2reg-fuzz-build-"));
  writeFileSync(join(out, "package.json"), '{ "type": "module" }\n');
  symlinkSync(join(REPO, "node_modules"), join(out, "node_modules"), "dir");
  const sources = readdirSync(join(REPO, "src"), { recursive: true, withFileTypes: true })
    .filter((e) => e.isFile() && e.name.endsWith(".ts") && !e.name.endsWith(".d.ts"))
    .map((e) => join(e.parentPath, e.name));
  sources.push(fileURLToPath(import.meta.url));
  sources.push(join(REPO, "test/helpers/ocdbt-encode.ts"), join(REPO, "test/helpers/prng.ts")); // the helpers this file imports
  for (const file of sources) {
    const { outputText } = ts.transpileModule(readFileSync(file, "utf8"), {
      fileName: file,
      // Inline source maps: stacks from the worker name src/*.ts lines (see setSourceMapsEnabled below).
      compilerOptions: {
        module: ts.ModuleKind.ES2022,
        target: ts.ScriptTarget.ES2022,
        inlineSourceMap: true,
        sourceRoot: `${pathToFileURL(dirname(file)).href}/`,
      },
    });
    const dest = join(out, relative(REPO, file).replace(/\.ts$/, ".js"));
    mkdirSync(dirname(dest), { recursive: true });
    writeFileSync(dest, outputText);
  }
  return out;
}

export interface RunnerOptions {
  /** Allocations above this are recorded with their stack (default MEMORY_LIMIT). */
  readonly reportLimit?: number;
  /** Allocations above this are refused with a RangeError (default 1 GiB). */
  readonly hardLimit?: number;
  /** V8 old-space limit of the worker, so a runaway JS heap ends the worker, not the machine. */
  readonly maxOldGenerationSizeMb?: number;
}

/** Runs Jobs one at a time in a worker; a job past its deadline terminates the worker (a new one follows). */
export class FuzzRunner {
  private worker: Worker | undefined;
  private baseline: number | undefined;
  private shared = new Float64Array(new SharedArrayBuffer(8));
  workersStarted = 0;

  private constructor(
    private readonly buildDir: string,
    private readonly options: RunnerOptions,
  ) {}

  static async create(options: RunnerOptions = {}): Promise<FuzzRunner> {
    return new FuzzRunner(await transpileForWorker(), options);
  }

  /** A new worker, once it has loaded everything (start-up time is not charged to the first job). */
  private async spawn(): Promise<Worker> {
    const entry = pathToFileURL(join(this.buildDir, relative(REPO, fileURLToPath(import.meta.url)).replace(/\.ts$/, ".js"))).href;
    this.shared = new Float64Array(new SharedArrayBuffer(8));
    const w = new Worker(BOOTSTRAP, {
      eval: true,
      workerData: {
        entry,
        shared: this.shared.buffer,
        reportLimit: this.options.reportLimit ?? MEMORY_LIMIT,
        hardLimit: this.options.hardLimit ?? 2 ** 30,
      },
      resourceLimits: { maxOldGenerationSizeMb: this.options.maxOldGenerationSizeMb ?? 768 },
      stdout: false,
      stderr: false,
    });
    w.unref();
    this.baseline = undefined;
    this.workersStarted++;
    // Between jobs nobody else listens: an error must not become an uncaught 'error' event here, and a
    // worker that died is replaced at the next job.
    w.on("error", () => undefined);
    w.on("exit", () => {
      if (this.worker === w) this.worker = undefined;
    });
    await new Promise<void>((resolveReady, reject) => {
      const onExit = (code: number) => reject(new Error(`fuzz worker exited with code ${code} while starting`));
      w.once("exit", onExit);
      w.once("message", () => {
        w.off("exit", onExit);
        resolveReady();
      });
    });
    this.worker = w;
    return w;
  }

  private drop(w: Worker): void {
    if (this.worker === w) this.worker = undefined;
    void w.terminate();
  }

  async run(job: Job, timeoutMs: number): Promise<JobResult> {
    const w = this.worker ?? (await this.spawn());
    const shared = this.shared;
    const t0 = performance.now();
    return new Promise((resolvePromise) => {
      const finish = (r: Omit<JobResult, "arrayBuffersGrowth">) => {
        clearTimeout(timer);
        w.off("message", onMessage);
        w.off("error", onError);
        w.off("exit", onExit);
        if (r.outcome !== "timeout" && r.outcome !== "crash" && this.baseline === undefined) this.baseline = r.arrayBuffers;
        resolvePromise({ ...r, arrayBuffersGrowth: r.arrayBuffers - (this.baseline ?? r.arrayBuffers) });
      };
      const failed = (outcome: "timeout" | "crash", error: ErrorInfo) => {
        this.drop(w);
        finish({ outcome, error, maxAlloc: shared[0] ?? 0, arrayBuffers: 0, unhandledRejections: [], ms: performance.now() - t0 });
      };
      const onMessage = (r: Omit<JobResult, "arrayBuffersGrowth">) => finish(r);
      const onError = (e: unknown) => failed("crash", errorInfo(e));
      const onExit = (code: number) => failed("crash", { name: "WorkerExit", message: `worker exited with code ${code}` });
      const timer = setTimeout(
        () => failed("timeout", { name: "Timeout", message: `no answer within ${timeoutMs} ms (hang or busy loop)` }),
        timeoutMs,
      );
      w.on("message", onMessage);
      w.on("error", onError);
      w.on("exit", onExit);
      w.postMessage(job);
    });
  }

  async close(): Promise<void> {
    const w = this.worker;
    this.worker = undefined;
    if (w) await w.terminate();
    rmSync(this.buildDir, { recursive: true, force: true });
  }
}

/** What is wrong with a result, or undefined when it meets the requirement. */
export function violation(r: JobResult, limit = MEMORY_LIMIT): string | undefined {
  if (r.outcome === "untyped") return `non-typed error escaped: ${r.error?.stack ?? `${r.error?.name}: ${r.error?.message}`}`;
  if (r.outcome === "timeout" || r.outcome === "crash") return `${r.outcome}: ${r.error?.message}`;
  if (r.maxAlloc > limit) return `allocation of ${r.maxAlloc} bytes (limit ${limit}) at ${r.allocStack ?? "?"}`;
  if (r.arrayBuffersGrowth > limit) return `ArrayBuffer memory grew by ${r.arrayBuffersGrowth} bytes (limit ${limit})`;
  if (r.unhandledRejections.length > 0) return `unhandled rejection: ${r.unhandledRejections[0]}`;
  return undefined;
}
