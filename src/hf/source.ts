import { createHash } from "node:crypto";
import { decodeChunkFrame, decodeChunkStream } from "../codecs/zstd.js";
import { sharedDecodePool } from "../codecs/zstd-decode-pool.js";
import { SHARD_INDEX_BYTES } from "../convert/plan.js";
import { innerChunkOfShard } from "../convert/transforms.js";
import { MetadataError, NotFoundError, UsageError } from "../errors.js";
import type { ValueLocation } from "../ocdbt/database.js";
import { chunkKeyPattern, listArrays } from "../orbax/arrays.js";
import { OcdbtSource, UnionSource } from "../orbax/kv-source.js";
import { type OrbaxStep, openStep, parseStepName } from "../orbax/step.js";
import { parseIndex } from "../regular/index-file.js";
import { regularChunkKey } from "../regular/zarray.js";
import { INPUT, openStore } from "../store/open.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { Budget } from "../util/budget.js";
import { castToBfloat16 } from "../zarr/cast.js";
import { decodeChunk } from "../zarr/chunk.js";
import { DTYPES } from "../zarr/dtype.js";
import { chunkKey, parseZarrMetadata, product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { fillBuffer } from "../zarr/region.js";

/**
 * The arrays of a step to export, whatever stores them: an Orbax step (OCDBT or per-array directories, zarr v2
 * or v3) or a regular (TensorStore zarr v2) step. Each chunk is read as a stream of decoded bytes (C order of
 * the chunk's full shape), compressed bytes fetched a window at a time and decoded as they come, so that a
 * chunk of any size costs a window and a decoder's history, never the chunk.
 */
export interface SourceArray {
  /** The leaf's path, `/`-joined (`model/decoder/emb/token_emb/weight`). */
  readonly path: string;
  readonly meta: ZarrArrayMeta;
  /**
   * Decoded bytes of the chunk at grid `index`, in pieces (each the caller's to keep); its compressed bytes read
   * `window` at a time (readWindow's when not given). With `bf16` (only where `castsToBf16`), its float32 elements
   * as bfloat16 (zarr/cast.ts's rounding), cast where it is decoded (on a worker thread, where one decodes it).
   */
  chunk(index: readonly number[], window?: number, bf16?: boolean): AsyncIterable<Uint8Array>;
  describeChunk(index: readonly number[]): string;
  /**
   * Its chunks are read and decoded whole (WHOLE_CHUNK_BYTES): an open one holds its decoded bytes (and, while it
   * is read, its compressed ones), not a streaming decoder's context and windows.
   */
  readonly wholeChunks?: boolean;
  /**
   * Its chunks can be read cast to bfloat16 (`chunk`'s `bf16`): float32 chunks decoded whole. The cast is made
   * with the decode, off the thread that lays the elements out, and an open chunk holds half the bytes.
   */
  readonly castsToBf16?: boolean;
}

export interface ExportSource {
  readonly kind: "orbax" | "regular";
  /** The step directory as given or chosen. */
  readonly location: string;
  readonly step: number | undefined;
  readonly arrays: readonly SourceArray[];
  /** Non-array leaves (a regular index's strings and scalars), skipped. */
  readonly otherLeaves: readonly string[];
  /** What identifies the source's bytes: paths, shapes, dtypes and where every chunk is stored (sha256). */
  readonly fingerprint: string;
  /** How a checkpoint root's step was chosen, when the location was a root. */
  readonly chosenBy?: string;
}

const FLOAT32 = DTYPES.find((d) => d.name === "float32") as (typeof DTYPES)[number];

/**
 * Compressed bytes fetched per read of a streamed chunk (one more is fetched ahead). Every chunk a layer covers
 * has its decoder open (a stacked weight's chunks span every layer), so this is paid per open chunk: small on
 * a local disk, larger over GCS, where each read is a request.
 */
export const READ_WINDOW = 256 << 10;
export const GCS_READ_WINDOW = 1 << 20;
/** The largest window over GCS, when few decoders are open (export.ts, exportWindow). */
export const MAX_GCS_READ_WINDOW = 4 << 20;

/** The read window for a source at `location`. */
export function readWindow(location: string): number {
  return location.startsWith("gs://") ? GCS_READ_WINDOW : READ_WINDOW;
}

/** `length` bytes at `offset` of `key`, a window at a time, the next window fetched while this one decodes. */
async function* windows(store: Store, key: string, offset: number, length: number, window: number): AsyncIterable<Uint8Array> {
  let at = 0;
  const fetch = (from: number) => store.readRange(key, offset + from, Math.min(window, length - from));
  let next = length > 0 ? fetch(0) : undefined;
  while (next !== undefined) {
    const piece = await next;
    at += piece.length;
    next = at < length ? fetch(at) : undefined;
    yield piece;
  }
}

/** Decodes a zstd chunk as it streams in (decodeChunkStream), each decoded piece copied out. */
async function* decoded(compressed: AsyncIterable<Uint8Array>, size: number, path: string): AsyncIterable<Uint8Array> {
  const out: Uint8Array[] = [];
  for await (const _ of decodeChunkStream(compressed, size, path, (piece) => out.push(piece.slice()))) yield* out.splice(0);
}

/**
 * A zstd chunk of at most this many decoded bytes is read in one request and decoded whole into one buffer:
 * what it holds is at most this, less than a streaming decoder's context, windows and pieces (DECODER_BYTES),
 * and a finely cut source's thousands of small chunks cost a read and a decode call each instead of a window,
 * a decoder kept open across layers and a copy of every piece (with the cursors' changes, the 2 GB fuji step's
 * params cut 256 and 1,024 ways, 630 and 157 KB chunks, went from 5.8 and 7.1 s of CPU to 4.5 and 5.6 s, peak
 * RSS from 467 and 250 MiB to 246 and 170: bench/README.md, "--cuts").
 */
export const WHOLE_CHUNK_BYTES = 1 << 20;

/** Sizes of the read buffers: a compressed chunk's length rounded up to this, so that similar chunks share one. */
const READ_BUFFER_STEP = 16 << 10;
/**
 * Whole chunks read at once through a source's buffers: as many as a local store reads at once (its descriptors),
 * so no read waits longer than it did, and a pass that asks for all its 1,024 chunks at once has 128 buffers out,
 * not 1,024 taken before their reads could start.
 */
const READS_AT_ONCE = 128;
/** The most a source's idle read buffers hold (those of the classes used last). */
const IDLE_BYTES = 32 << 20;
/**
 * A whole chunk decoding to fewer bytes than this is decoded on the calling thread: handing it to a worker and
 * back costs about what its decode does.
 */
const POOL_MIN_BYTES = 32 << 10;

/**
 * Buffers a whole chunk's compressed bytes are read into (Store.readRangeInto) and given back once decoded: a
 * source cut 1,024 ways reads 5,134 chunk files, and a fresh buffer per read (670 MB in all) aged into the old
 * generation and kept V8's concurrent marking busy (bench/README.md, "--cuts").
 */
class ReadBuffers {
  private readonly reads = new Budget(READS_AT_ONCE);
  /** Idle buffers by size; a Map keeps its sizes in the order first used, the oldest given up first. */
  private readonly idle = new Map<number, Uint8Array[]>();
  private idleBytes = 0;

  /**
   * The chunk whose `length` compressed bytes are at `offset` of `key`, decoded (decodeChunkFrame: `size` bytes,
   * failures named by `path`; cast to bfloat16 with `bf16`): read into one of the buffers (shared memory, which the
   * pool's worker reads in place), decoded there or, when small, here; then the buffer kept for the next read.
   */
  async readDecoded(
    store: Store & Required<Pick<Store, "readRangeInto">>,
    key: string,
    offset: number,
    length: number,
    size: number,
    path: string,
    bf16: boolean,
  ): Promise<Uint8Array> {
    const release = await this.reads.acquire();
    try {
      const buffer = this.take(length);
      // A failed read's or decode's buffer is dropped rather than given back.
      const bytes = await store.readRangeInto(key, offset, length, buffer);
      if (size < POOL_MIN_BYTES || bytes.buffer !== buffer.buffer) {
        const decoded = decodeHere(bytes, size, path, bf16);
        this.give(buffer);
        return decoded;
      }
      const decoded = await sharedDecodePool(WHOLE_CHUNK_BYTES).decode(bytes, size, path, bf16);
      this.give(buffer);
      return decoded;
    } finally {
      release();
    }
  }

  private take(length: number): Uint8Array {
    const size = Math.ceil(length / READ_BUFFER_STEP) * READ_BUFFER_STEP;
    const list = this.idle.get(size);
    const buffer = list?.pop();
    if (buffer === undefined) return new Uint8Array(new SharedArrayBuffer(size));
    if (list?.length === 0) this.idle.delete(size);
    this.idleBytes -= size;
    return buffer;
  }

  private give(buffer: Uint8Array): void {
    const size = buffer.length;
    if (size > IDLE_BYTES) return;
    // Make room by giving up the oldest sizes' buffers: a weight's chunks differ from the last weight's.
    for (const [other, list] of this.idle) {
      if (this.idleBytes + size <= IDLE_BYTES) break;
      while (list.length > 0 && this.idleBytes + size > IDLE_BYTES) {
        list.pop();
        this.idleBytes -= other;
      }
      if (list.length === 0) this.idle.delete(other);
    }
    this.idleBytes += size;
    const list = this.idle.get(size);
    if (list === undefined) this.idle.set(size, [buffer]);
    else list.push(buffer);
  }
}

/**
 * A whole chunk decoded on this thread (decodeChunkFrame), cast to bfloat16 with `bf16` into a buffer of the cast's
 * size (not the decode pool's cast in place, whose view would keep the float32 chunk alive while it is held).
 */
function decodeHere(bytes: Uint8Array, size: number, path: string, bf16: boolean): Uint8Array {
  const decoded = decodeChunkFrame(bytes, size, path);
  return bf16 ? castToBfloat16(decoded, FLOAT32) : decoded;
}

/** A small chunk read and decoded whole, through a reused buffer where the store reads into one. */
async function* wholeZstdChunk(
  store: Store,
  buffers: ReadBuffers,
  key: string,
  offset: number,
  length: number,
  size: number,
  path: string,
  bf16: boolean,
): AsyncIterable<Uint8Array> {
  if (store.readRangeInto === undefined) yield decodeHere(await store.readRange(key, offset, length), size, path, bf16);
  else yield await buffers.readDecoded(store as Store & Required<Pick<Store, "readRangeInto">>, key, offset, length, size, path, bf16);
}

/** A zstd chunk: decoded whole when small (WHOLE_CHUNK_BYTES), else streamed a window at a time. */
function zstdChunk(
  store: Store,
  buffers: ReadBuffers,
  key: string,
  offset: number,
  length: number,
  size: number,
  window: number,
  path: string,
  bf16: boolean,
): AsyncIterable<Uint8Array> {
  // A frame of at most WHOLE_CHUNK_BYTES is at most a few bytes a block longer: a longer one is streamed, and
  // fails there as corrupt without being read whole.
  if (size <= WHOLE_CHUNK_BYTES && length <= WHOLE_CHUNK_BYTES + (64 << 10))
    return wholeZstdChunk(store, buffers, key, offset, length, size, path, bf16);
  const pieces = decoded(windows(store, key, offset, length, window), size, path);
  return bf16 ? castWhole(pieces, size) : pieces;
}

/** A chunk of the fill value, in pieces of a window. */
function* filled(fill: Uint8Array, size: number): Iterable<Uint8Array> {
  const piece = fillBuffer(fill, Math.min(size, Math.max(fill.length, Math.floor(READ_WINDOW / fill.length) * fill.length)));
  for (let at = 0; at < size; at += piece.length) yield piece.subarray(0, Math.min(piece.length, size - at)).slice();
}

/** A chunk no store holds: the array's fill value, or a NotFoundError when it has none. */
function missingChunk(meta: ZarrArrayMeta, size: number, path: string): AsyncIterable<Uint8Array> {
  const fill = meta.fill;
  if (fill === null) throw new NotFoundError("chunk is missing and the array has no fill value", { path });
  return (async function* () {
    yield* filled(fill, size);
  })();
}

/** A float32 chunk's `size` decoded bytes, however they come, as one piece of bfloat16 (a chunk decoded whole is small). */
async function* castWhole(pieces: AsyncIterable<Uint8Array>, size: number): AsyncIterable<Uint8Array> {
  const all = new Uint8Array(size);
  let at = 0;
  for await (const p of pieces) {
    all.set(p.subarray(0, size - at), at);
    at += p.length;
  }
  yield castToBfloat16(all, FLOAT32);
}

function castIf(bf16: boolean, pieces: AsyncIterable<Uint8Array>, size: number): AsyncIterable<Uint8Array> {
  return bf16 ? castWhole(pieces, size) : pieces;
}

function chunkBytes(meta: ZarrArrayMeta): number {
  return product(meta.chunkShape) * meta.dtype.itemSize;
}

/** Where a value location's key lives: the store its data files are relative to. */
function valueStore(step: OrbaxStep): Store {
  const s = step.source;
  if (s instanceof OcdbtSource) return s.db.store;
  if (s instanceof UnionSource) return (s.dbs[0] as { store: Store }).store;
  return (s as unknown as { store: Store }).store;
}

/** One Orbax chunk's decoded bytes: streamed where its encoding allows (zstd, raw, one-chunk shards), else whole. */
function orbaxChunk(
  step: OrbaxStep,
  store: Store,
  buffers: ReadBuffers,
  meta: ZarrArrayMeta,
  value: ValueLocation | undefined,
  path: string,
  window: number,
  bf16: boolean,
): AsyncIterable<Uint8Array> {
  const size = chunkBytes(meta);
  const enc = meta.encoding;
  if (value === undefined) return castIf(bf16, missingChunk(meta, size, path), size);
  if (value.kind === "file") {
    const range = { kind: "range" as const, key: value.key, offset: value.offset, length: value.length };
    if ((enc.kind === "v2" || enc.kind === "v3") && enc.compressor === "zstd")
      return zstdChunk(store, buffers, value.key, value.offset, value.length, size, window, path, bf16);
    if (
      enc.kind === "v3-sharded" &&
      enc.compressor === "zstd" &&
      enc.indexLocation === "end" &&
      enc.indexChecksum &&
      enc.innerChunkShape.every((c, d) => c === meta.chunkShape[d]) &&
      value.length > SHARD_INDEX_BYTES
    ) {
      return castIf(bf16, decoded(innerChunkOfShard(store, range), size, path), size);
    }
  }
  // Inline values (small), uncompressed or otherwise encoded chunks: read and decoded whole.
  return castIf(
    bf16,
    (async function* () {
      yield decodeChunk(meta, await step.source.read(value), path);
    })(),
    size,
  );
}

async function openOrbax(step: OrbaxStep, location: string): Promise<ExportSource> {
  const arrays: SourceArray[] = [];
  const hash = createHash("sha256");
  const store = valueStore(step);
  const buffers = new ReadBuffers();
  for await (const a of listArrays(step)) {
    const meta = a.meta;
    hash.update(`${a.leaf.path}|${meta.dtype.name}|${meta.shape}|${meta.chunkShape}\n`);
    for (const [k, e] of a.chunks)
      hash.update(
        `${k}=${e.value.kind === "file" ? `${e.value.key}@${e.value.offset}+${e.value.length}` : Buffer.from(e.value.bytes).toString("base64")}\n`,
      );
    const describeChunk = (index: readonly number[]) => step.source.describe(`${a.leaf.name}/${chunkKey(meta, index)}`);
    const wholeChunks = (meta.encoding.kind === "v2" || meta.encoding.kind === "v3") && chunkBytes(meta) <= WHOLE_CHUNK_BYTES;
    arrays.push({
      path: a.leaf.path,
      meta,
      describeChunk,
      wholeChunks,
      castsToBf16: wholeChunks && meta.dtype.name === "float32",
      chunk: (index, window = readWindow(store.url), bf16 = false) =>
        orbaxChunk(step, store, buffers, meta, a.chunks.get(chunkKey(meta, index))?.value, describeChunk(index), window, bf16),
    });
  }
  return {
    kind: "orbax",
    location,
    step: step.step,
    arrays,
    // AXLearn's state keeps an empty dict for every parameterless child (dropout, kv_cache, rope_pos_emb_layer):
    // structure, not a leaf a consumer could miss.
    otherLeaves: step.leaves.filter((l) => !l.isArray && !l.isEmptyNode).map((l) => l.path),
    fingerprint: hash.digest("hex"),
    ...(step.chosen === undefined ? {} : { chosenBy: step.chosen.chosenBy }),
  };
}

const isRegularStep = async (store: Store, dir: string) => {
  const top = await store.listDir(dir);
  return top.files.some((f) => f.key === joinKey(dir, "index") || f.key === "index") && top.dirs.includes("gda");
};

/** A regular step (`index` + `gda/`): its index names the arrays, each a zarr v2 directory under gda/. */
async function openRegular(store: Store, dir: string, location: string): Promise<ExportSource> {
  const indexKey = joinKey(dir, "index");
  const { step, entries } = parseIndex(new TextDecoder().decode(await store.read(indexKey)), describe(store, indexKey));
  const arrays: SourceArray[] = [];
  const otherLeaves: string[] = [];
  const hash = createHash("sha256");
  const buffers = new ReadBuffers();
  for (const [path, value] of entries) {
    const isArray = typeof value === "object" && value !== null && "dtype" in value && "shape" in value;
    if (!isArray) {
      otherLeaves.push(path);
      continue;
    }
    const base = joinKey(dir, "gda", path);
    const zarray = joinKey(base, ".zarray");
    const meta = parseZarrMetadata(".zarray", await store.read(zarray), { path: describe(store, zarray) });
    const pattern = chunkKeyPattern(meta.keyEncoding, meta.shape.length);
    const sizes = new Map<string, number>();
    for await (const o of store.list(`${base}/`)) {
      const name = o.key.slice(base.length + 1);
      if (pattern.test(name)) sizes.set(name, o.size);
    }
    hash.update(`${path}|${meta.dtype.name}|${meta.shape}|${meta.chunkShape}|${[...sizes].join(",")}\n`);
    const keyOf = (index: readonly number[]) =>
      meta.keyEncoding.separator === "." && meta.keyEncoding.prefix === "" ? regularChunkKey(index) : chunkKey(meta, index);
    // base is a key (not empty): base/name is joinKey(base, name), without its normalizing per chunk.
    const describeChunk = (index: readonly number[]) => describe(store, `${base}/${keyOf(index)}`);
    arrays.push({
      path,
      meta,
      describeChunk,
      wholeChunks: chunkBytes(meta) <= WHOLE_CHUNK_BYTES,
      castsToBf16: chunkBytes(meta) <= WHOLE_CHUNK_BYTES && meta.dtype.name === "float32",
      chunk: (index, window = readWindow(store.url), bf16 = false) => {
        const name = keyOf(index);
        const key = `${base}/${name}`;
        const length = sizes.get(name);
        const value: ValueLocation | undefined = length === undefined ? undefined : { kind: "file", key, offset: 0, length };
        return regularChunk(store, buffers, meta, value, describe(store, key), window, bf16);
      },
    });
  }
  return { kind: "regular", location, step, arrays, otherLeaves, fingerprint: hash.digest("hex") };
}

function regularChunk(
  store: Store,
  buffers: ReadBuffers,
  meta: ZarrArrayMeta,
  value: ValueLocation | undefined,
  path: string,
  window: number,
  bf16: boolean,
): AsyncIterable<Uint8Array> {
  const size = chunkBytes(meta);
  if (value === undefined || value.kind !== "file") return castIf(bf16, missingChunk(meta, size, path), size);
  const enc = meta.encoding;
  if (enc.kind === "v2" && enc.compressor === "zstd")
    return zstdChunk(store, buffers, value.key, 0, value.length, size, window, path, bf16);
  return castIf(
    bf16,
    (async function* () {
      yield decodeChunk(meta, await store.read(value.key), path);
    })(),
    size,
  );
}

/**
 * Opens what `location` names: a regular step (`index` and `gda/`), a root of regular steps (the highest
 * step_* holding an index, or `step`), or anything openStep opens (an Orbax step, root or item; `step` as there).
 */
export async function openExportSource(location: string, options: { readonly step?: number } = {}): Promise<ExportSource> {
  const trimmed = location.replace(/\/+$/, "");
  const store = await openStore(trimmed, INPUT);
  if (await isRegularStep(store, "")) {
    const source = await openRegular(store, "", trimmed);
    // As openStep says of an Orbax step directory given with another --step.
    if (options.step !== undefined && source.step !== options.step) {
      throw new UsageError(
        `is the directory of step ${source.step}, not of step ${options.step} (--step chooses a step under a checkpoint root)`,
        {
          path: store.url,
        },
      );
    }
    return source;
  }
  const top = await store.listDir("");
  const steps = top.dirs
    .filter((d) => parseStepName(d) !== undefined)
    .sort((a, b) => (parseStepName(a) as number) - (parseStepName(b) as number));
  const orbaxMarkers = top.files.some((f) => /(^|\/)(_CHECKPOINT_METADATA|commit_success\.txt|_METADATA|manifest\.ocdbt)$/.test(f.key));
  const given = options.step === undefined ? undefined : steps.find((d) => parseStepName(d) === options.step);
  if (!orbaxMarkers && given !== undefined && (await isRegularStep(store, given))) {
    return { ...(await openRegular(store, given, `${trimmed}/${given}`)), chosenBy: "given" };
  }
  if (!orbaxMarkers && steps.length > 0 && options.step === undefined) {
    for (const d of [...steps].reverse()) {
      if ((await store.stat(joinKey(d, "index"))) !== undefined && (await isRegularStep(store, d))) {
        return { ...(await openRegular(store, d, `${trimmed}/${d}`)), chosenBy: "the highest regular step under the root" };
      }
      break;
    }
  }
  // An Orbax step, root or item; with --step, a regular root without that step is said to lack it there.
  const step = await openStep(trimmed, options.step === undefined ? {} : { step: options.step });
  if (step.leaves.length === 0) throw new MetadataError("the step has no leaves", { path: trimmed });
  return openOrbax(step, step.stepDir === "" ? trimmed : `${trimmed}/${step.stepDir}`);
}
