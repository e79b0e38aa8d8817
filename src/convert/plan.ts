import { createHash, randomBytes } from "node:crypto";
import { IteratorsError, MetadataError, NotFoundError, UsageError } from "../errors.js";
import type { ValueLocation } from "../ocdbt/database.js";
import { listArrays, type StoredArray } from "../orbax/arrays.js";
import { missingIterators } from "../orbax/processes.js";
import type { Leaf } from "../orbax/pytree-metadata.js";
import { isStepNumber, type OrbaxStep, stepDirName } from "../orbax/step.js";
import { arrayEntry, type IndexEntry, indexText, parseIndex } from "../regular/index-file.js";
import { regularChunkKey, zarrayText } from "../regular/zarray.js";
import { checkKey, describe, joinKey, type Store } from "../store/store.js";
import { buildIdentity } from "../version.js";
import { type CastDtype, castTarget } from "../zarr/cast.js";
import type { DType } from "../zarr/dtype.js";
import { chunkGrid, chunkKey, product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { unravel } from "../zarr/read-array.js";
import { readShardIndex } from "../zarr/sharding.js";
import { balanceRanges, type UnitRange } from "./groups.js";
import {
  commitText,
  type DataRef,
  dataLength,
  PLAN_FORMAT,
  PLAN_VERSION,
  type Plan,
  type PlanGroup,
  type PlannedArray,
  type PlannedFile,
  type PlannedObject,
  partPieces,
} from "./plan-format.js";
import { commitPartKey, planPartKey } from "./work-dir.js";

export interface PlanOptions {
  /** Number of parameter groups for convert-group (>= 1). */
  readonly groups: number;
  /** Keep only `model/...` leaves and `prng_key` (a serving export, keptByParamsOnly); the index is filtered to match. */
  readonly paramsOnly: boolean;
  /** Write floating-point leaves of 32 or 64 bits as this dtype (`--dtype`); the index says so too. */
  readonly dtype?: CastDtype;
  /** Step number when the source does not say (a bare PyTree item). */
  readonly step?: number;
  /** Objects per part of the plan; partObjectsFor(groups) by default (tests use small parts). */
  readonly partObjects?: number;
}

const decoder = new TextDecoder();
/** The index at the end of a zarr v3 shard of one inner chunk: one (offset, nbytes) pair of u64, then its CRC-32C. */
export const SHARD_INDEX_BYTES = 16 + 4;

/**
 * `--params-only` keeps these leaves: the model's parameters and the PRNG key, what AXLearn's InferenceRunner
 * restores (axlearn/common/inference.py: its state is `{prng_key: uint32[4], model: ...}`, read with
 * CONTAINS_STATE_UP_TO_DTYPE, so a checkpoint without `prng_key` does not load there).
 */
export const keptByParamsOnly = (path: string) => path === "prng_key" || path === "model" || path.startsWith("model/");

/** Objects per part at most, and objects a plan holds in its groups' unfilled parts at once (while writing them). */
const MAX_PART_OBJECTS = 16_384;
const MIN_PART_OBJECTS = 1024;
const BUFFERED_OBJECTS = 65_536;

/** Objects per part for `groups` groups: every group fills a part of its own at once while the plan is written. */
export function partObjectsFor(groups: number): number {
  return Math.max(MIN_PART_OBJECTS, Math.min(MAX_PART_OBJECTS, Math.floor(BUFFERED_OBJECTS / groups)));
}

/** A plan decided but not yet written: its head and commit part, and how to write its parts. */
export interface PlanDraft {
  readonly plan: Plan;
  /**
   * Plans the objects again from the source, array by array, into each group's parts (sorted within a part
   * by data location), writing each part as it fills; then the commit part, last. `id`: the plan id to write
   * under (the draft's own, or the identical plan's on record). Gives the text of the plan's only part when
   * it has one (a small step's), which a conversion in this process then need not read back.
   */
  writeParts(destination: Store, id: string): Promise<string | undefined>;
}

/**
 * Decides every object of the regular checkpoint (where its bytes come from and how they are transformed)
 * without holding them all: a first pass over the source's arrays keeps only each object's size (to balance
 * the groups) and a hash of them all (the plan's fingerprint); the objects themselves are planned again when
 * the parts are written (PlanDraft.writeParts), an array at a time. Reads no chunk data.
 */
export async function buildPlan(source: OrbaxStep, destinationRoot: string, options: PlanOptions): Promise<PlanDraft> {
  if (!Number.isSafeInteger(options.groups) || options.groups < 1)
    throw new UsageError(`--groups must be a positive integer, got ${options.groups}`);
  const step = source.step ?? options.step;
  if (step === undefined) throw new UsageError("the source does not name its step (not a step_XXXXXXXX directory); pass --step");
  if (!isStepNumber(step)) throw new UsageError(`step ${step} is outside AXLearn's 0..99999999`);
  const stepDir = stepDirName(step);
  const keep = (leaf: Leaf) => !options.paramsOnly || keptByParamsOnly(leaf.path);

  const arrays: PlannedArray[] = [];
  const sizes: Float64Array[] = [];
  const where = { url: `${destinationRoot}/${stepDir}` };
  const keys = new Map<string, string>();
  // Hashed object by object: one JSON text of every object would cost a third of planning a large step.
  const hash = createHash("sha256");
  for await (const a of listArrays(source)) {
    if (!keep(a.leaf)) continue;
    const castTo = castTarget(a.meta.dtype, options.dtype);
    const objects = await planArray(source, a, arrays.length, where, keys, castTo);
    const lengths = new Float64Array(objects.length);
    let bytes = 0;
    for (const [i, o] of objects.entries()) {
      hash.update(`${JSON.stringify([o.target, o.data, o.transform])}\n`);
      lengths[i] = dataLength(o.data);
      bytes += lengths[i] as number;
    }
    arrays.push({
      path: a.leaf.path,
      name: a.leaf.name,
      dtype: a.meta.dtype.name,
      shape: a.meta.shape,
      chunkShape: a.meta.chunkShape,
      sourceMetadataKind: a.meta.metadataKey,
      sourceMetadata: decoder.decode(await source.source.read(a.metadataEntry.value)),
      bytes,
      ...(castTo === undefined ? {} : { castTo: castTo.name as CastDtype }),
    });
    sizes.push(lengths);
  }

  const units = balanceRanges(sizes, options.groups);
  const partObjects = options.partObjects ?? partObjectsFor(options.groups);
  if (!Number.isSafeInteger(partObjects) || partObjects < 1)
    throw new UsageError(`objects per plan part must be a positive integer, got ${partObjects}`);
  const groups = groupRanges(units, partObjects);
  if (!options.paramsOnly) requireSameIterators(source);
  const files = options.paramsOnly ? [] : iteratorFiles(source, where);
  const index = await expectedIndexText(source, step, arrays, options.paramsOnly);
  const choices = { paramsOnly: options.paramsOnly, ...(options.dtype === undefined ? {} : { dtype: options.dtype }) };
  // The layout is part of the identity: the same source planned in other groups is another conversion.
  const layout = units.map((g) => g.map((u) => [u.array, u.start, u.end]));
  const fingerprint = hash.update(JSON.stringify({ files, index, ...choices, layout, partObjects })).digest("hex");
  const plan: Plan = {
    format: PLAN_FORMAT,
    version: PLAN_VERSION,
    id: randomBytes(8).toString("hex"),
    createdAt: new Date().toISOString(),
    source: { root: source.store.url, stepDir: source.stepDir, layout: source.layout, fingerprint },
    destination: { root: destinationRoot, stepDir },
    step,
    options: choices,
    arrays,
    groups,
    partObjects,
    files,
    index,
    totals: { arrays: arrays.length, objects: groups.at(-1)?.end ?? 0, bytes: arrays.reduce((s, a) => s + a.bytes, 0) },
    writtenBy: buildIdentity(),
  };
  return {
    plan,
    writeParts: (destination, id) =>
      writePlanParts(destination, { ...plan, id }, units, sizes, async function* () {
        let i = 0;
        for await (const a of listArrays(source))
          if (keep(a.leaf)) yield await planArray(source, a, i++, where, keys, castTarget(a.meta.dtype, options.dtype));
      }),
  };
}

/** Each group's range of the plan's objects (group after group) and its count of parts. */
function groupRanges(units: readonly (readonly UnitRange[])[], partObjects: number): PlanGroup[] {
  let start = 0;
  return units.map((g) => {
    const size = g.reduce((s, u) => s + u.end - u.start, 0);
    const range = {
      start,
      end: start + size,
      parts: Math.ceil(size / partObjects),
      bytes: g.reduce((s, u) => s + u.bytes, 0),
      arrays: new Set(g.map((u) => u.array)).size,
    };
    start += size;
    return range;
  });
}

/**
 * Writes the parts of `plan`: the objects of each array (from `planned`, in array order) go to their units'
 * groups, each group filling one part at a time; a full part is sorted by data location (adjacent ranges of a
 * data file are then read together) and written. Memory holds one array's objects and each group's unfilled
 * part. The commit part is written last.
 */
async function writePlanParts(
  destination: Store,
  plan: Plan,
  units: readonly (readonly UnitRange[])[],
  sizes: readonly Float64Array[],
  planned: () => AsyncIterable<PlannedObject[]>,
): Promise<string | undefined> {
  const stepDir = plan.destination.stepDir;
  // A plan of one part gives that part's text back (when under STREAM_PART_BYTES): a conversion in this
  // process runs it from memory instead of reading it back, a round trip before the first chunk.
  const onePart = plan.groups.reduce((n, g) => n + g.parts, 0) === 1;
  let only: string | undefined;
  // Each array's units, in order, with their group.
  const byArray = new Map<number, { start: number; end: number; group: number }[]>();
  units.forEach((g, group) => {
    for (const u of g) {
      const list = byArray.get(u.array) ?? [];
      list.push({ start: u.start, end: u.end, group });
      byArray.set(u.array, list);
    }
  });
  for (const list of byArray.values()) list.sort((a, b) => a.start - b.start);
  const filling = units.map(() => ({ part: 0, objects: [] as PlannedObject[] }));
  const flush = async (group: number) => {
    const f = filling[group] as { part: number; objects: PlannedObject[] };
    if (f.objects.length === 0) return;
    const objects = f.objects.sort(byDataLocation);
    const ref = { group, part: f.part++ };
    f.objects = [];
    const key = joinKey(stepDir, planPartKey(plan.id, ref.group, ref.part));
    const pieces = partPieces(plan.id, ref, plan.arrays, objects);
    if (!onePart) return writeText(destination, key, pieces);
    const text = [...pieces].join("");
    await writeText(destination, key, [text]);
    if (Buffer.byteLength(text) < STREAM_PART_BYTES) only = text;
  };
  const changed = () => new MetadataError("the source changed while it was planned; plan again", { path: plan.source.root });
  let array = 0;
  for await (const objects of planned()) {
    const expected = sizes[array];
    if (expected === undefined || expected.length !== objects.length || objects.some((o, i) => dataLength(o.data) !== expected[i]))
      throw changed();
    for (const u of byArray.get(array) ?? []) {
      const f = filling[u.group] as { objects: PlannedObject[] };
      for (let i = u.start; i < u.end; i++) {
        f.objects.push(objects[i] as PlannedObject);
        if (f.objects.length === plan.partObjects) await flush(u.group);
      }
    }
    array++;
  }
  if (array !== sizes.length) throw changed();
  for (let g = 0; g < filling.length; g++) await flush(g);
  await destination.write(joinKey(stepDir, commitPartKey(plan.id)), new TextEncoder().encode(commitText(plan, plan.id)));
  return only;
}

/** A part's text this large or more is streamed to the store, not encoded into one buffer. */
const STREAM_PART_BYTES = 8 << 20;

/** Writes a text given in pieces: one buffer when small (one simple upload to GCS), else a stream of them. */
async function writeText(destination: Store, key: string, pieces: Iterable<string>): Promise<void> {
  const encoder = new TextEncoder();
  const it = pieces[Symbol.iterator]();
  const head: Uint8Array[] = [];
  let size = 0;
  for (let r = it.next(); !r.done; r = it.next()) {
    const bytes = encoder.encode(r.value);
    head.push(bytes);
    size += bytes.length;
    if (size >= STREAM_PART_BYTES) {
      await destination.write(
        key,
        (async function* () {
          yield* head.splice(0);
          for (let n = it.next(); !n.done; n = it.next()) yield encoder.encode(n.value);
        })(),
      );
      return;
    }
  }
  await destination.write(key, head.length === 1 ? (head[0] as Uint8Array) : Buffer.concat(head));
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

/** The objects of one array: its `.zarray`, then every chunk of the grid in C order; cast when `castTo` says. */
async function planArray(
  source: OrbaxStep,
  a: StoredArray,
  arrayIndex: number,
  where: { url: string },
  keys: Map<string, string>,
  castTo: DType | undefined,
): Promise<PlannedObject[]> {
  const prefix = `gda/${a.leaf.path}`;
  checkKey(where, `${prefix}/.zarray`);
  const meta = a.meta;
  const out: PlannedObject[] = [];
  if (castTo !== undefined) {
    // What AXLearn's regular writer writes for an array of the cast dtype (TensorStore's zarr driver).
    const text = zarrayText({ ...meta, dtype: castTo });
    out.push({ target: `${prefix}/.zarray`, data: inline(text), transform: "copy", size: Buffer.byteLength(text) });
  } else if (meta.zarrFormat === 2) {
    // Orbax's zarr v2 metadata is what AXLearn writes: copy it verbatim.
    const data = toDataRef(a.metadataEntry.value, keys);
    out.push({ target: `${prefix}/.zarray`, data, transform: "copy", size: dataLength(data) });
  } else {
    const text = zarrayText(meta);
    out.push({ target: `${prefix}/.zarray`, data: inline(text), transform: "copy", size: Buffer.byteLength(text) });
  }
  const grid = chunkGrid(meta);
  const count = product(grid);
  const mode = castTo === undefined ? chunkMode(meta) : "cast";
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
      // The array is named so that the writer can check the frame header against the chunk's shape.
      out.push({ target, data, transform: "copy", array: arrayIndex, size: dataLength(data) });
    } else if (mode === "shard-inner") {
      out.push(await planShard(source, a, arrayIndex, target, sourceKey, entry.value, data));
    } else {
      out.push({ target, data, transform: mode, array: arrayIndex, size: null });
    }
  }
  return out;
}

/** How chunks of this array become zarr v2 chunks compressed with zstd. */
export function chunkMode(meta: ZarrArrayMeta): "copy" | "shard-inner" | "transcode" {
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
    const bytes = value.bytes.subarray(range.offset, range.offset + range.length);
    return { target, data: inline(bytes), transform: "copy", array: arrayIndex, size: range.length };
  }
  if (value.length < SHARD_INDEX_BYTES) throw new MetadataError(`shard of ${value.length} bytes has no room for its index`, { path });
  // An out-of-line shard is checked while it streams through (the index is at its end): a single inner
  // chunk written first fills everything before the 20-byte index.
  return { target, data, transform: "shard-inner", array: arrayIndex, size: value.length - SHARD_INDEX_BYTES };
}

/**
 * Refuses a step whose processes did not all save the same iterator files (processes.ts): its conversion would
 * restore on process 0 and fail on the process that lacks them. --allow-uncommitted does not waive it (the step
 * may be committed; its iterators are still not restorable); --params-only copies no iterators, so it converts.
 */
export function requireSameIterators(source: OrbaxStep): void {
  const missing = missingIterators(source.processes);
  if (missing.length === 0) return;
  const shown = missing.slice(0, 8).map((m) => `process ${m.process} lacks ${m.file}`);
  const more = missing.length > shown.length ? ` (and ${missing.length - shown.length} more)` : "";
  throw new IteratorsError(
    `the step was saved by ${source.processes.count} processes that do not all have the same iterator files: ${shown.join("; ")}${more}; ` +
      "AXLearn's restore of it would fail on those processes (--params-only converts it without iterators)",
    { path: describe(source.store, source.stepDir) },
  );
}

/** AXLearn's iterator files, renamed from the Orbax layout to the regular one. */
export function iteratorFiles(source: OrbaxStep, where: { url: string }): PlannedFile[] {
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
  arrays: readonly Pick<PlannedArray, "path" | "dtype" | "shape" | "castTo">[],
  paramsOnly: boolean,
): Promise<string> {
  // A cast array's entry names the dtype it is written as, as AXLearn's index of a state of that dtype does.
  const cast = new Map(arrays.flatMap((a) => (a.castTo === undefined ? [] : [[a.path, a.castTo] as const])));
  if (source.indexKey !== undefined) {
    const text = decoder.decode(source.indexBytes ?? (await source.store.read(source.indexKey)));
    const path = describe(source.store, source.indexKey);
    const parsed = parseIndex(text, path);
    if (parsed.step !== step)
      throw new MetadataError(`index says step ${parsed.step}, the directory is step ${step}`, { path, key: "step" });
    checkIndexArrays(
      parsed.entries.filter(([p]) => !paramsOnly || keptByParamsOnly(p)),
      arrays,
      path,
    );
    if (!paramsOnly && cast.size === 0) return text;
    return indexText(
      step,
      parsed.entries
        .filter(([p]) => !paramsOnly || keptByParamsOnly(p))
        .map(([p, v]): IndexEntry => {
          const to = cast.get(p);
          return to !== undefined && isArrayEntry(v) ? [p, { ...v, dtype: to }] : [p, v];
        }),
    );
  }
  const entries: IndexEntry[] = arrays.map((a) => arrayEntry(a.path, a.castTo ?? a.dtype, a.shape));
  return indexText(step, entries);
}

/**
 * Refuses an Orbax `index` item whose arrays are not the arrays written (`_METADATA`'s leaves, each with its
 * stored .zarray's dtype and shape): copied verbatim, it would be a commit marker describing another state,
 * which AXLearn's restore (its EXACT structure check of the index against the state it expects) refuses, or
 * worse, accepts for arrays that are not there. Every array has its entry, with its dtype and shape; every
 * array entry names an array. Other entries (iterators, raw values) are the index's own.
 */
function checkIndexArrays(
  entries: readonly IndexEntry[],
  arrays: readonly Pick<PlannedArray, "path" | "dtype" | "shape">[],
  path: string,
): void {
  const byPath = new Map(entries);
  for (const a of arrays) {
    const v = byPath.get(a.path);
    const want = arrayEntry(a.path, a.dtype, a.shape)[1] as { dtype: string; shape: string };
    if (v === undefined)
      throw new MetadataError(`index has no entry for array ${a.path} (${want.dtype} ${want.shape}), which _METADATA lists`, { path });
    if (!isArrayEntry(v) || v.dtype !== want.dtype || v.shape !== want.shape) {
      const says = isArrayEntry(v) ? `${v.dtype} ${v.shape}` : JSON.stringify(v);
      throw new MetadataError(`index says ${says} for array ${a.path}, but the array stored is ${want.dtype} ${want.shape}`, {
        path,
      });
    }
  }
  const written = new Set(arrays.map((a) => a.path));
  const stray = entries.find(([p, v]) => isArrayEntry(v) && !written.has(p));
  if (stray !== undefined) throw new MetadataError(`index names an array ${stray[0]} that _METADATA does not list`, { path });
}

/** An index entry's value for an array: `{"dtype": ..., "shape": ...}` (other entries are iterators or raw values). */
function isArrayEntry(v: unknown): v is { dtype: string; shape: string } {
  return typeof v === "object" && v !== null && !Array.isArray(v) && "dtype" in v && "shape" in v;
}
