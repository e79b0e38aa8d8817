import { createHash } from "node:crypto";
import { ChunkDecoder, decodeChunkFrame } from "../codecs/zstd.js";
import { FormatError, isPermanent, NotFoundError, UsageError } from "../errors.js";
import type { ValueLocation } from "../ocdbt/database.js";
import { chunkKeyPattern, listArrays, type StoredArray } from "../orbax/arrays.js";
import { iteratorOwner, missingIterators, relativeToStep } from "../orbax/processes.js";
import { type OrbaxStep, openStep, parseStepName } from "../orbax/step.js";
import { parseIndex, structureStrings } from "../regular/index-file.js";
import { regularChunkKey } from "../regular/zarray.js";
import { INPUT, openStore } from "../store/open.js";
import { describe, type Store } from "../store/store.js";
import { Budget, forEachLimited } from "../util/budget.js";
import { firstDifference, once } from "../util/streams.js";
import { CAST_DTYPES, type CastDtype, castTarget, castToBfloat16 } from "../zarr/cast.js";
import { decodeChunk } from "../zarr/chunk.js";
import type { DType } from "../zarr/dtype.js";
import { chunkGrid, chunkKey, parseZarrMetadata, product } from "../zarr/metadata.js";
import { unravel } from "../zarr/read-array.js";
import { chunkMode, expectedIndexText, iteratorFiles, keptByParamsOnly, SHARD_INDEX_BYTES } from "./plan.js";
import { innerChunkOfShard, STREAM_RESERVE } from "./transforms.js";

const VERIFY_CONCURRENCY = 4;
/**
 * Memory for chunks compared decoded (a cast, or bytes that differ from the source's): each holds both sides
 * encoded and decoded, so a chunk over this runs alone. Chunks stored as their source are compared and decoded
 * streamed.
 */
const VERIFY_MEMORY = 512 << 20;
/** AXLearn's zarr v2 chunk keys: indices joined by ".". */
const REGULAR_KEYS = { prefix: "", separator: "." } as const;

export interface Check {
  readonly name: string;
  readonly ok: boolean;
  readonly detail?: string;
}

export interface VerifyResult {
  readonly checks: Check[];
  readonly passed: number;
  readonly failed: number;
}

const text = new TextDecoder();

/**
 * Refuses, as bad input, a regular step location that is no step at all: one that does not exist, or the
 * destination root given for the step under it (the mistake the two arguments invite). A step that is there
 * but wrong is what the checks are for.
 */
async function assertRegularStep(dest: Store): Promise<void> {
  if ((await dest.stat("index")) !== undefined) return;
  const top = await dest.listDir("");
  if (top.absent) throw new NotFoundError("does not exist", { path: dest.url });
  const steps = top.dirs.filter((d) => parseStepName(d) !== undefined);
  if (top.files.length === 0 && steps.length > 0) {
    const step = steps.at(-1) as string;
    throw new UsageError(
      `a root of step_* directories, not a converted step: verify takes the step itself, e.g. ${dest.url.replace(/\/+$/, "")}/${step}`,
      { path: dest.url },
    );
  }
}

/**
 * Compares a regular checkpoint with the Orbax step it came from: the index (byte for byte, and AXLearn's
 * EXACT structure check), every `.zarray`, every chunk decoded as TensorStore reads it (one zstd frame of
 * exactly the chunk's shape, nothing after it) and against the source's (byte for byte and streamed where it
 * holds the source's bytes under the same codec, element for element where it does not or the export casts),
 * and that nothing extra sits under `gda/`. Also catches what AXLearn's restore would silently accept (a
 * missing chunk file, a smaller stored shape, a different dtype).
 */
export async function verify(
  orbaxLocation: string,
  regularStepLocation: string,
  onArray?: (done: number, total: number) => void,
): Promise<VerifyResult> {
  const source = await openStep(orbaxLocation);
  const dest = await openStore(regularStepLocation, INPUT);
  await assertRegularStep(dest);
  // A source that does not name its step (a bare PyTree item) was converted with --step: the regular
  // step directory's name says which.
  const step = source.step ?? parseStepName(regularStepLocation.replace(/\/+$/, "").split("/").pop() ?? "") ?? 0;
  const checks: Check[] = [];
  const check = async (name: string, run: () => Promise<string | undefined>) => {
    try {
      const problem = await run();
      checks.push(problem === undefined ? { name, ok: true } : { name, ok: false, detail: problem });
    } catch (e) {
      // A fault of the data fails the check; one of the storage (retryable) fails the verification.
      if (!isPermanent(e)) throw e;
      checks.push({ name, ok: false, detail: e.message });
    }
  };

  // The source is listed once (each array's metadata and chunk locations), the destination's gda/ once.
  const all: StoredArray[] = [];
  for await (const a of listArrays(source)) all.push(a);
  // Which export it is (everything or --params-only, each as stored or --dtype cast) is read off its index.
  let choice: Choice = { paramsOnly: false, dtype: undefined };
  await check("index", async () => {
    const actual = text.decode(await dest.read("index"));
    const full = await expectedIndex(source, step, all, choice);
    for (const c of CHOICES) {
      if (actual === (await expectedIndex(source, step, all, c))) {
        choice = c;
        return undefined;
      }
    }
    const parsed = parseIndex(actual, describe(dest, "index"));
    const want = parseIndex(full, "expected");
    const a = structureStrings(parsed.step, parsed.entries);
    const b = structureStrings(want.step, want.entries);
    const diff = b.filter((x) => !a.includes(x)).concat(a.filter((x) => !b.includes(x)));
    return `index differs from the expected bytes${diff.length ? `; structure differs at: ${diff.slice(0, 3).join("; ")}` : " (same structure)"}`;
  });

  const arrays = choice.paramsOnly ? all.filter((a) => keptByParamsOnly(a.leaf.path)) : all;
  await checkIterators(source, dest, choice.paramsOnly, check);
  // Every object under gda/, by its directory (an array's) and name.
  const stored = new Map<string, Map<string, number>>();
  for await (const o of dest.list("gda/")) {
    const dir = o.key.slice(0, o.key.lastIndexOf("/") + 1);
    let names = stored.get(dir);
    if (names === undefined) {
      names = new Map();
      stored.set(dir, names);
    }
    names.set(o.key.slice(dir.length), o.size);
  }
  const memory = new Budget(VERIFY_MEMORY);
  for (const [i, a] of arrays.entries()) {
    const castTo = castTarget(a.meta.dtype, choice.dtype);
    await check(`gda/${a.leaf.path}${castTo === undefined ? "" : ` (cast to ${castTo.name})`}`, () =>
      compareArray(source, a, dest, stored.get(`gda/${a.leaf.path}/`) ?? new Map(), castTo, memory),
    );
    onArray?.(i + 1, arrays.length);
  }
  await check("nothing else under gda/", async () => {
    // Only each array's .zarray and chunk keys; anything else is an array the index does not know, or debris.
    const ranks = new Map(arrays.map((a) => [`gda/${a.leaf.path}/`, a.meta.shape.length]));
    const extra: string[] = [];
    for (const [dir, names] of stored) {
      const rank = ranks.get(dir);
      const pattern = rank === undefined ? undefined : chunkKeyPattern(REGULAR_KEYS, rank);
      for (const name of names.keys()) {
        if (extra.length >= 5) break;
        if (pattern === undefined || (name !== ".zarray" && !pattern.test(name))) extra.push(dir + name);
      }
    }
    return extra.length ? `not part of any source array: ${extra.join(", ")}` : undefined;
  });
  const failed = checks.filter((c) => !c.ok).length;
  return { checks, passed: checks.length - failed, failed };
}

/**
 * Each process's iterator files, byte for byte against the source's (one check per process that saved the step):
 * a process whose files the source or the output lacks fails, as AXLearn's restore on that process would. An
 * export without iterators (--params-only) must hold none; nothing but the planned files may sit in tf_<i>/ or
 * python_<i>/.
 */
async function checkIterators(
  source: OrbaxStep,
  dest: Store,
  paramsOnly: boolean,
  check: (name: string, run: () => Promise<string | undefined>) => Promise<void>,
): Promise<void> {
  const planned = paramsOnly ? [] : iteratorFiles(source, { url: dest.url });
  const top = await dest.listDir("");
  const present = new Set<string>();
  for (const dir of top.dirs.filter((d) => /^(tf|python)_\d+$/.test(d))) for await (const o of dest.list(`${dir}/`)) present.add(o.key);
  const missing = paramsOnly ? [] : missingIterators(source.processes);
  const steps = relativeToStep(source.iteratorFiles, source.stepDir, source.layout);
  const ownerOf = new Map(source.iteratorFiles.map((f, i) => [f.key, iteratorOwner(steps[i] as string)?.process]));
  const processes = paramsOnly ? [] : source.processes.iterators.filter((p) => p.files.length > 0 || missing.length > 0);
  for (const p of processes) {
    await check(`iterator files of process ${p.process}`, async () => {
      const lacking = missing.filter((m) => m.process === p.process).map((m) => m.file);
      if (lacking.length > 0)
        return `the source lacks ${lacking.join(", ")}, which the other processes have (AXLearn's restore fails on process ${p.process})`;
      for (const f of planned.filter((x) => ownerOf.get(x.source) === p.process)) {
        if (!present.has(f.target)) return `${f.target} is missing`;
        const [mine, theirs] = await Promise.all([dest.read(f.target), source.store.read(f.source)]);
        if (!Buffer.from(mine).equals(theirs))
          return `${f.target} differs from ${describe(source.store, f.source)} (sha256 ${sha(mine)} vs ${sha(theirs)})`;
      }
      return undefined;
    });
  }
  await check("nothing else in tf_<i>/ and python_<i>/", async () => {
    const expected = new Set(planned.map((f) => f.target));
    const extra = [...present].filter((k) => !expected.has(k)).slice(0, 5);
    return extra.length
      ? `not an iterator file of the source${paramsOnly ? " (a --params-only export has none)" : ""}: ${extra.join(", ")}`
      : undefined;
  });
}

/** What a conversion may have chosen: everything or --params-only, each as stored or cast. */
interface Choice {
  readonly paramsOnly: boolean;
  readonly dtype: CastDtype | undefined;
}

const CHOICES: readonly Choice[] = [false, true].flatMap((paramsOnly) =>
  [undefined, ...CAST_DTYPES].map((dtype) => ({ paramsOnly, dtype })),
);

/** What the index must be, from the source, as the planner computes it. */
async function expectedIndex(source: OrbaxStep, step: number, all: readonly StoredArray[], choice: Choice): Promise<string> {
  const arrays = all
    .filter((a) => !choice.paramsOnly || keptByParamsOnly(a.leaf.path))
    .map((a) => {
      const castTo = castTarget(a.meta.dtype, choice.dtype);
      return { path: a.leaf.path, dtype: a.meta.dtype.name, shape: a.meta.shape, ...(castTo ? { castTo: castTo.name as CastDtype } : {}) };
    });
  return expectedIndexText(source, step, arrays, choice.paramsOnly);
}

/**
 * Compares one array with its source; with `castTo`, with the source's elements cast (zarr/cast.ts). `present`
 * holds the size of each object in the array's directory.
 */
async function compareArray(
  source: OrbaxStep,
  a: StoredArray,
  dest: Store,
  present: ReadonlyMap<string, number>,
  castTo: DType | undefined,
  memory: Budget,
): Promise<string | undefined> {
  const prefix = `gda/${a.leaf.path}`;
  const meta = parseZarrMetadata(".zarray", await dest.read(`${prefix}/.zarray`), { path: describe(dest, `${prefix}/.zarray`) });
  const same = (x: readonly number[], y: readonly number[]) => x.length === y.length && x.every((v, i) => v === y[i]);
  if (!same(meta.shape, a.meta.shape)) return `.zarray shape ${JSON.stringify(meta.shape)}, source ${JSON.stringify(a.meta.shape)}`;
  if (!same(meta.chunkShape, a.meta.chunkShape))
    return `.zarray chunks ${JSON.stringify(meta.chunkShape)}, source ${JSON.stringify(a.meta.chunkShape)}`;
  const want = castTo ?? a.meta.dtype;
  if (meta.dtype.name !== want.name)
    return `.zarray dtype ${meta.dtype.name}, ${castTo ? `the source's ${a.meta.dtype.name} cast to ${want.name}` : "source"} ${want.name}`;
  const grid = chunkGrid(meta);
  const size = product(meta.chunkShape) * meta.dtype.itemSize;
  // Stored bytes are compared as they are only where both sides decode them the same way (below).
  const mode =
    castTo === undefined && meta.encoding.kind === "v2" && meta.encoding.compressor === a.meta.encoding.compressor
      ? chunkMode(a.meta)
      : "decode";
  const problems: string[] = [];
  // A few chunks at a time: enough to overlap reads.
  await forEachLimited(
    Array.from({ length: product(grid) }, (_, i) => i),
    VERIFY_CONCURRENCY,
    async (i) => {
      if (problems.length > 0) return;
      const index = meta.shape.length === 0 ? [] : unravel(i, grid);
      const name = regularChunkKey(index);
      const key = `${prefix}/${name}`;
      const stored = present.get(name);
      if (stored === undefined) {
        problems.push(`chunk ${name} is missing (AXLearn would silently read zeros)`);
        return;
      }
      const entry = a.chunks.get(chunkKey(a.meta, index));
      const sourcePath = source.source.describe(`${a.leaf.name}/${chunkKey(a.meta, index)}`);
      const frame = mode === "decode" || entry === undefined ? undefined : storedFrame(source, entry.value, mode, sourcePath);
      // Every chunk is decoded as TensorStore's zarr driver reads it (codecs/zstd.ts ChunkDecoder: one frame of
      // exactly the chunk's bytes): the same bytes as the source's prove the same elements, not that they read.
      const zstd = meta.encoding.kind === "v2" && meta.encoding.compressor === "zstd";
      if (frame !== undefined && frame.length === stored) {
        const release = await memory.acquire(STREAM_RESERVE);
        const decoder = zstd ? new ChunkDecoder(size, describe(dest, key)) : undefined;
        try {
          // Compared and decoded streamed, nothing held: a chunk of any size costs a few pieces and the
          // decoder's window. Decoding stops at the first byte past the chunk's shape.
          const at = await firstDifference(feed(dest.readStream(key, 0, stored), decoder), frame.bytes);
          if (at === undefined) {
            decoder?.end();
            if (!zstd && stored !== size) problems.push(`chunk ${name} holds ${stored} bytes, its shape ${size} (as does its source)`);
            return;
          }
        } catch (e) {
          if (decoder?.failure === undefined) throw e;
          problems.push(unreadable(name, decoder.failure));
          return;
        } finally {
          decoder?.release();
          release();
        }
        // Different bytes may still be the same elements (another encoder's frame): decoded below.
      }
      // Both sides decoded (and cast): held whole, so as many at once as the memory budget allows.
      const weight = stored + (entry === undefined || entry.value.kind === "inline" ? 0 : entry.value.length) + 3 * size;
      const release = await memory.acquire(weight);
      try {
        if (problems.length > 0) return;
        const [mineBytes, theirBytes] = await Promise.all([
          dest.read(key),
          entry === undefined ? undefined : source.source.read(entry.value),
        ]);
        let mine: Uint8Array;
        try {
          mine = zstd ? decodeChunkFrame(mineBytes, size, describe(dest, key)) : decodeChunk(meta, mineBytes, describe(dest, key));
        } catch (e) {
          if (!(e instanceof FormatError)) throw e;
          problems.push(unreadable(name, e));
          return;
        }
        const decoded = decodeChunk(a.meta, theirBytes, sourcePath);
        const theirs = castTo === undefined ? decoded : castToBfloat16(decoded, a.meta.dtype);
        if (!Buffer.from(mine.buffer, mine.byteOffset, mine.length).equals(theirs)) {
          const what = castTo === undefined ? "the source" : `the source cast to ${castTo.name}`;
          problems.push(`chunk ${name} differs from ${what} (sha256 ${sha(mine)} vs ${sha(theirs)})`);
        }
      } finally {
        release();
      }
    },
  );
  return problems[0];
}

/**
 * The bytes a pass-through conversion stores for this chunk (plan.ts chunkMode): the source object itself
 * (copy), or the inner chunk of a one-chunk shard (its index checked as it streams by). Undefined where it
 * is not a stream (a small shard inline in the tree: decoded instead).
 */
function storedFrame(
  source: OrbaxStep,
  value: ValueLocation,
  mode: ReturnType<typeof chunkMode>,
  path: string,
): { bytes: AsyncIterable<Uint8Array>; length: number } | undefined {
  if (mode === "transcode") return undefined;
  if (value.kind === "inline") return mode === "copy" ? { bytes: once(value.bytes), length: value.bytes.length } : undefined;
  if (mode === "copy") return { bytes: source.store.readStream(value.key, value.offset, value.length), length: value.length };
  if (value.length < SHARD_INDEX_BYTES) throw new FormatError(`shard of ${value.length} bytes has no room for its index`, { path });
  const range = { kind: "range", key: value.key, offset: value.offset, length: value.length } as const;
  return { bytes: innerChunkOfShard(source.store, range), length: value.length - SHARD_INDEX_BYTES };
}

/** Passes `pieces` through, each fed to `decoder` first (whose failure stops the stream). */
async function* feed(pieces: AsyncIterable<Uint8Array>, decoder: ChunkDecoder | undefined): AsyncIterable<Uint8Array> {
  for await (const p of pieces) {
    decoder?.push(p);
    yield p;
  }
}

function unreadable(name: string, e: FormatError): string {
  return `chunk ${name}: ${e.detail}; TensorStore cannot read it`;
}

function sha(b: Uint8Array): string {
  return createHash("sha256").update(b).digest("hex").slice(0, 12);
}
