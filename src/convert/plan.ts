import { createHash, randomBytes } from "node:crypto";
import { MetadataError, NotFoundError, UsageError } from "../errors.js";
import type { ValueLocation } from "../ocdbt/database.js";
import { listArrays, type StoredArray } from "../orbax/arrays.js";
import type { Leaf } from "../orbax/pytree-metadata.js";
import { type OrbaxStep, stepDirName } from "../orbax/step.js";
import { arrayEntry, type IndexEntry, indexText, parseIndex } from "../regular/index-file.js";
import { regularChunkKey, zarrayText } from "../regular/zarray.js";
import { checkKey, describe } from "../store/store.js";
import { chunkGrid, chunkKey, product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { unravel } from "../zarr/read-array.js";
import { readShardIndex } from "../zarr/sharding.js";
import { balance } from "./groups.js";
import {
  type DataRef,
  dataLength,
  PLAN_FORMAT,
  PLAN_VERSION,
  type Plan,
  type PlanGroup,
  type PlannedArray,
  type PlannedFile,
  type PlannedObject,
} from "./plan-format.js";

export interface PlanOptions {
  /** Number of parameter groups for convert-group (>= 1). */
  readonly groups: number;
  /** Keep only `model/...` leaves (a serving/evaluation export); the index is filtered to match. */
  readonly paramsOnly: boolean;
  /** Step number when the source does not say (a bare PyTree item). */
  readonly step?: number;
}

const decoder = new TextDecoder();
/** The index at the end of a zarr v3 shard of one inner chunk: one (offset, nbytes) pair of u64, then its CRC-32C. */
export const SHARD_INDEX_BYTES = 16 + 4;

/** `--params-only` keeps these leaves: the model's parameters, for serving and evaluation. */
export const isParam = (path: string) => path === "model" || path.startsWith("model/");

/**
 * Reads the source once (tree, metadata, shard indexes of inline shards) and decides every object of the
 * regular checkpoint: where its bytes come from and how they are transformed. Reads no chunk data.
 */
export async function buildPlan(source: OrbaxStep, destinationRoot: string, options: PlanOptions): Promise<Plan> {
  if (!Number.isSafeInteger(options.groups) || options.groups < 1)
    throw new UsageError(`--groups must be a positive integer, got ${options.groups}`);
  const step = source.step ?? options.step;
  if (step === undefined) throw new UsageError("the source does not name its step (not a step_XXXXXXXX directory); pass --step");
  if (step < 0 || step >= 1e8) throw new UsageError(`step ${step} is outside AXLearn's 0..99999999`);
  const stepDir = stepDirName(step);
  const keep = (leaf: Leaf) => !options.paramsOnly || isParam(leaf.path);

  const arrays: PlannedArray[] = [];
  const perArray: { items: PlannedObject[]; sizes: number[] }[] = [];
  const where = { url: `${destinationRoot}/${stepDir}` };
  const keys = new Map<string, string>();
  for await (const a of listArrays(source)) {
    if (!keep(a.leaf)) continue;
    const objects = await planArray(source, a, arrays.length, where, keys);
    arrays.push({
      path: a.leaf.path,
      name: a.leaf.name,
      dtype: a.meta.dtype.name,
      shape: a.meta.shape,
      chunkShape: a.meta.chunkShape,
      sourceMetadataKind: a.meta.metadataKey,
      sourceMetadata: decoder.decode(await source.source.read(a.metadataEntry.value)),
      bytes: objects.reduce((s, o) => s + dataLength(o.data), 0),
    });
    perArray.push({ items: objects, sizes: objects.map((o) => dataLength(o.data)) });
  }

  const { objects, groups } = layOut(perArray, options.groups);

  const files = options.paramsOnly ? [] : iteratorFiles(source, where);
  const index = await expectedIndexText(source, step, arrays, options.paramsOnly);
  // Hashed object by object: one JSON text of every object would cost a third of planning a large step.
  const hash = createHash("sha256");
  for (const o of objects) hash.update(`${JSON.stringify([o.target, o.data, o.transform])}\n`);
  const fingerprint = hash.update(JSON.stringify({ files, index, paramsOnly: options.paramsOnly })).digest("hex");
  return {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    id: randomBytes(8).toString("hex"),
    createdAt: new Date().toISOString(),
    source: { root: source.store.url, stepDir: source.stepDir, layout: source.layout, fingerprint },
    destination: { root: destinationRoot, stepDir },
    step,
    options: { paramsOnly: options.paramsOnly },
    arrays,
    objects,
    groups,
    files,
    index,
    totals: { arrays: arrays.length, objects: objects.length, bytes: arrays.reduce((s, a) => s + a.bytes, 0) },
  };
}

/**
 * The plan's objects, group after group (balanced by bytes, groups.ts), and each group's range of them.
 * Built without spreading into a call: a step may have millions of objects.
 */
export function layOut(
  perArray: readonly { items: readonly PlannedObject[]; sizes: readonly number[] }[],
  n: number,
): { objects: PlannedObject[]; groups: PlanGroup[] } {
  const objects: PlannedObject[] = [];
  const groups: PlanGroup[] = [];
  for (const units of balance(perArray, n)) {
    const start = objects.length;
    const items = units.flatMap((u) => u.items);
    // Within a group, data-file order lets adjacent ranges be read together.
    items.sort(byDataLocation);
    for (const o of items) objects.push(o);
    groups.push({
      start,
      end: objects.length,
      bytes: units.reduce((s, u) => s + u.bytes, 0),
      arrays: new Set(units.map((u) => u.array)).size,
    });
  }
  return { objects, groups };
}

function byDataLocation(a: PlannedObject, b: PlannedObject): number {
  const ka = a.data.kind === "range" ? a.data.key : "";
  const kb = b.data.kind === "range" ? b.data.key : "";
  if (ka !== kb) return ka < kb ? -1 : 1;
  const oa = a.data.kind === "range" ? a.data.offset : 0;
  const ob = b.data.kind === "range" ? b.data.offset : 0;
  return oa - ob;
}

/**
 * `keys` holds one copy of each data file's key: the tree's reader spells the key anew for every value, and
 * a plan of 520k objects in a few data files would otherwise hold 520k copies of a few strings.
 */
function toDataRef(v: ValueLocation, keys: Map<string, string>): DataRef {
  if (v.kind === "inline") return { kind: "inline", base64: Buffer.from(v.bytes).toString("base64") };
  const key = keys.get(v.key) ?? v.key;
  keys.set(key, key);
  return { kind: "range", key, offset: v.offset, length: v.length };
}

const inline = (bytes: Uint8Array | string): DataRef => ({ kind: "inline", base64: Buffer.from(bytes).toString("base64") });

/** The objects of one array: its `.zarray`, then every chunk of the grid in C order. */
async function planArray(
  source: OrbaxStep,
  a: StoredArray,
  arrayIndex: number,
  where: { url: string },
  keys: Map<string, string>,
): Promise<PlannedObject[]> {
  const prefix = `gda/${a.leaf.path}`;
  checkKey(where, `${prefix}/.zarray`);
  const meta = a.meta;
  const out: PlannedObject[] = [];
  if (meta.zarrFormat === 2) {
    // Orbax's zarr v2 metadata is what AXLearn writes: copy it verbatim.
    const data = toDataRef(a.metadataEntry.value, keys);
    out.push({ target: `${prefix}/.zarray`, data, transform: "copy", size: dataLength(data) });
  } else {
    const text = zarrayText(meta);
    out.push({ target: `${prefix}/.zarray`, data: inline(text), transform: "copy", size: Buffer.byteLength(text) });
  }
  const grid = chunkGrid(meta);
  const count = product(grid);
  const mode = chunkMode(meta);
  for (let i = 0; i < count; i++) {
    const index = meta.shape.length === 0 ? [] : unravel(i, grid);
    const target = `${prefix}/${regularChunkKey(index)}`;
    const sourceKey = chunkKey(meta, index);
    const entry = a.chunks.get(sourceKey);
    if (entry === undefined) {
      if (meta.fill === null) {
        throw new NotFoundError(`chunk ${sourceKey} of ${a.leaf.path} is missing and the array has no fill value`, {
          path: source.source.describe(`${a.leaf.name}/${sourceKey}`),
        });
      }
      out.push({ target, data: inline(new Uint8Array(0)), transform: "fill", array: arrayIndex, size: null });
      continue;
    }
    const data = toDataRef(entry.value, keys);
    if (mode === "copy") {
      out.push({ target, data, transform: "copy", size: dataLength(data) });
    } else if (mode === "shard-inner") {
      out.push(await planShard(source, a, arrayIndex, target, sourceKey, entry.value, data));
    } else {
      out.push({ target, data, transform: "transcode", array: arrayIndex, size: null });
    }
  }
  return out;
}

/** How chunks of this array become zarr v2 chunks compressed with zstd. */
function chunkMode(meta: ZarrArrayMeta): "copy" | "shard-inner" | "transcode" {
  const enc = meta.encoding;
  if (enc.kind === "v2") return enc.compressor === "zstd" || enc.compressor === "none" ? "copy" : "transcode";
  // zarr v3 `bytes` + `zstd` stores exactly zstd(elements): the v2 chunk.
  if (enc.kind === "v3") return enc.compressor === "zstd" ? "copy" : "transcode";
  const single = enc.innerChunkShape.every((c, d) => c === meta.chunkShape[d]);
  return single && enc.compressor === "zstd" && enc.indexLocation === "end" && enc.indexChecksum ? "shard-inner" : "transcode";
}

async function planShard(
  source: OrbaxStep,
  a: StoredArray,
  arrayIndex: number,
  target: string,
  sourceKey: string,
  value: ValueLocation,
  data: DataRef,
): Promise<PlannedObject> {
  const path = source.source.describe(`${a.leaf.name}/${sourceKey}`);
  if (value.kind === "inline") {
    // Small shards live in the tree: cut the inner chunk out now (checking the index and its CRC).
    const enc = a.meta.encoding as Extract<ZarrArrayMeta["encoding"], { kind: "v3-sharded" }>;
    const [range] = readShardIndex(value.bytes, enc, 1, path);
    if (range === null || range === undefined)
      return { target, data: inline(new Uint8Array(0)), transform: "fill", array: arrayIndex, size: null };
    return { target, data: inline(value.bytes.subarray(range.offset, range.offset + range.length)), transform: "copy", size: range.length };
  }
  if (value.length < SHARD_INDEX_BYTES) throw new MetadataError(`shard of ${value.length} bytes has no room for its index`, { path });
  // An out-of-line shard is checked while it streams through (the index is at its end): a single inner
  // chunk written first fills everything before the 20-byte index.
  return { target, data, transform: "shard-inner", array: arrayIndex, size: value.length - SHARD_INDEX_BYTES };
}

/** AXLearn's iterator files, renamed from the Orbax layout to the regular one. */
function iteratorFiles(source: OrbaxStep, where: { url: string }): PlannedFile[] {
  const byName = new Map(source.leaves.map((l) => [l.name, l.path]));
  const out: PlannedFile[] = [];
  const base = source.stepDir === "" ? "" : `${source.stepDir}/`;
  for (const f of source.iteratorFiles) {
    let rel = f.key.startsWith(base) ? f.key.slice(base.length) : f.key;
    if (source.layout === "emergency") {
      // non-tensors/step_X/tf_<pid>/... written by the regular checkpointer (which nests tf_<pid> twice).
      rel = f.key.replace(/^non-tensors\/step_\d+\//, "").replace(/^(tf_\d+)\/\1\//, "$1/");
      out.push({ source: f.key, target: checkKey(where, rel), size: f.size });
      continue;
    }
    // tfds/tf_<pid>/<name>.index -> tf_<pid>/<path>.index ; python/python_<pid>/<name> -> python_<pid>/<path>
    const m = /^(?:tfds|python)\/((?:tf|python)_\d+)\/(.+?)((?:\.index|\.data-\d+-of-\d+)?)$/.exec(rel);
    if (m) rel = `${m[1]}/${byName.get(m[2] as string) ?? m[2]}${m[3]}`;
    out.push({ source: f.key, target: checkKey(where, rel), size: f.size });
  }
  return out;
}

/**
 * The index text: Orbax's `index` item verbatim when it exists (filtered for --params-only), else built
 * from the arrays (already filtered by the caller).
 */
export async function expectedIndexText(
  source: OrbaxStep,
  step: number,
  arrays: readonly Pick<PlannedArray, "path" | "dtype" | "shape">[],
  paramsOnly: boolean,
): Promise<string> {
  if (source.indexKey !== undefined) {
    const text = decoder.decode(await source.store.read(source.indexKey));
    const path = describe(source.store, source.indexKey);
    const parsed = parseIndex(text, path);
    if (parsed.step !== step)
      throw new MetadataError(`index says step ${parsed.step}, the directory is step ${step}`, { path, key: "step" });
    if (!paramsOnly) return text;
    return indexText(
      step,
      parsed.entries.filter(([p]) => isParam(p)),
    );
  }
  const entries: IndexEntry[] = arrays.map((a) => arrayEntry(a.path, a.dtype, a.shape));
  return indexText(step, entries);
}
