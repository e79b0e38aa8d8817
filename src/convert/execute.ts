import { crc32c } from "../codecs/crc32c.js";
import { compress, rleFrame } from "../codecs/zstd.js";
import { ChecksumError, ConflictError, FormatError } from "../errors.js";
import { LocalStore } from "../store/local.js";
import { describe, joinKey, type Store } from "../store/store.js";
import { Budget } from "../util/budget.js";
import { decodeChunk } from "../zarr/chunk.js";
import { parseZarrMetadata, product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { fillBuffer } from "../zarr/region.js";
import { listStep, objectDefect } from "./finalize.js";
import { OwnerWatch, retreat } from "./ownership.js";
import { type DataRef, dataLength, type Plan, type PlannedObject } from "./plan-format.js";
import { type Recorded, RecordLog, readRecords, sourceCrc, storedCrc } from "./records.js";

export interface ExecuteOptions {
  /** Objects in flight at once. */
  readonly concurrency: number;
  /** Upper bound on bytes buffered in memory at once (reads, decodes, encodes). */
  readonly memoryBytes: number;
  /** Called after each object with the bytes it accounts for. */
  readonly onObject?: (event: { target: string; bytes: number; skipped: boolean }) => void;
  /**
   * Filled with what this process wrote or checked (target -> size and CRC-32C), so that a finalize in the
   * same process need not read those objects back.
   */
  readonly trusted?: Map<string, Recorded>;
}

export const DEFAULT_EXECUTE: ExecuteOptions = { concurrency: 16, memoryBytes: 256 << 20 };

export interface ExecuteReport {
  objects: number;
  written: number;
  skipped: number;
  bytesWritten: number;
  seconds: number;
}

/** Ranges of one data file closer than this are read together... */
const COALESCE_GAP = 256 << 10;
/** ...into reads of at most this many bytes, and only objects below this size are coalesced. */
const COALESCE_MAX = 8 << 20;
/** Memory reserved for one streamed object (piece buffers on both sides). */
const STREAM_RESERVE = 4 << 20;
/** Buffer of a local-to-local copy, reused from object to object. */
const COPY_BUFFER = 1 << 20;

/**
 * Writes `objects` (a slice of `plan.objects`) into the destination step. Objects already present with
 * their planned size are skipped, so a crashed or repeated run resumes. Small ranges of one data file
 * are read together; large objects stream from the ranged read to the write; a byte budget bounds memory.
 */
export async function executeObjects(
  plan: Plan,
  objects: readonly PlannedObject[],
  source: Store,
  destination: Store,
  options: ExecuteOptions,
): Promise<ExecuteReport> {
  const started = Date.now();
  const stepDir = plan.destination.stepDir;
  const log = new RecordLog(destination, stepDir, plan.id);
  const owner = new OwnerWatch(destination, plan);
  const wrote: string[] = [];
  const done = (o: PlannedObject, result: Recorded, recorded = false) => {
    if (!recorded) log.add(o.target, result);
    options.trusted?.set(o.target, result);
  };

  const report: ExecuteReport = { objects: objects.length, written: 0, skipped: 0, bytesWritten: 0, seconds: 0 };
  const todo: PlannedObject[] = [];
  for (const [o, found] of await alreadyDone(plan, objects, source, destination, options.concurrency)) {
    if (found === undefined) {
      todo.push(o);
      continue;
    }
    done(o, found.result, found.recorded);
    report.skipped++;
    options.onObject?.({ target: o.target, bytes: dataLength(o.data), skipped: true });
  }

  const slots = new Budget(options.concurrency);
  const memory = new Budget(options.memoryBytes);
  const metas = new Map<number, ZarrArrayMeta>();
  const buffers: Uint8Array[] = [];
  const metaOf = (o: PlannedObject): ZarrArrayMeta => {
    const i = o.array as number;
    let m = metas.get(i);
    if (m === undefined) {
      const a = plan.arrays[i];
      if (a === undefined)
        throw new FormatError(`plan object ${o.target} names array ${i}, which the plan lacks`, { path: PLAN_PATH(plan) });
      m = parseZarrMetadata(a.sourceMetadataKind, Buffer.from(a.sourceMetadata), { path: `${plan.source.root} (plan)`, key: a.name });
      metas.set(i, m);
    }
    return m;
  };
  const written = (o: PlannedObject, bytes: number, result: Recorded) => {
    wrote.push(o.target);
    done(o, result);
    report.written++;
    report.bytesWritten += bytes;
    options.onObject?.({ target: o.target, bytes: dataLength(o.data), skipped: false });
  };
  const put = async (o: PlannedObject, data: Uint8Array | AsyncIterable<Uint8Array>, bytes: number) => {
    written(o, bytes, await destination.write(joinKey(stepDir, o.target), data));
  };
  let failed = false;
  const withBudget = async (weight: number, work: () => Promise<void>) => {
    const releaseSlot = await slots.acquire();
    const releaseMemory = await memory.acquire(weight);
    try {
      // After the first failure, queued objects are not started: the run is going to fail anyway. Nor
      // are they once another conversion has taken the step over.
      if (!failed)
        await owner
          .check()
          .then(work)
          .catch((e) => {
            failed = true;
            throw e;
          });
    } finally {
      releaseMemory();
      releaseSlot();
    }
  };

  const tasks: Promise<void>[] = [];
  for (const batch of coalesce(todo)) {
    if (batch.length > 1) {
      const first = batch[0]?.data as Extract<DataRef, { kind: "range" }>;
      const last = batch[batch.length - 1]?.data as Extract<DataRef, { kind: "range" }>;
      const span = last.offset + last.length - first.offset;
      tasks.push(
        withBudget(span, async () => {
          const bytes = await source.readRange(first.key, first.offset, span);
          await Promise.all(
            batch.map((o) => {
              const d = o.data as Extract<DataRef, { kind: "range" }>;
              return put(o, bytes.subarray(d.offset - first.offset, d.offset - first.offset + d.length), d.length);
            }),
          );
        }),
      );
      continue;
    }
    const o = batch[0] as PlannedObject;
    tasks.push(runOne(o));
  }

  async function runOne(o: PlannedObject): Promise<void> {
    const d = o.data;
    switch (o.transform) {
      case "copy":
        if (d.kind === "inline") return withBudget(dataLength(d), () => put(o, Buffer.from(d.base64, "base64"), dataLength(d)));
        if (source instanceof LocalStore && destination instanceof LocalStore) {
          return withBudget(COPY_BUFFER, async () => {
            const buffer = buffers.pop() ?? new Uint8Array(COPY_BUFFER);
            try {
              written(o, d.length, await source.copyRangeTo(d.key, d.offset, d.length, destination, joinKey(stepDir, o.target), buffer));
            } finally {
              buffers.push(buffer);
            }
          });
        }
        return withBudget(Math.min(d.length, STREAM_RESERVE), () => put(o, source.readStream(d.key, d.offset, d.length), d.length));
      case "shard-inner": {
        const r = d as Extract<DataRef, { kind: "range" }>;
        return withBudget(Math.min(r.length, STREAM_RESERVE), () => put(o, innerChunkOfShard(source, r), r.length - 20));
      }
      case "transcode": {
        const meta = metaOf(o);
        const size = product(meta.chunkShape) * meta.dtype.itemSize;
        return withBudget(dataLength(d) + 2 * size, async () => {
          const stored = d.kind === "inline" ? Buffer.from(d.base64, "base64") : await source.readRange(d.key, d.offset, d.length);
          const encoded = compress(decodeChunk(meta, stored, d.kind === "range" ? describe(source, d.key) : o.target));
          await put(o, encoded, encoded.length);
        });
      }
      case "fill": {
        const meta = metaOf(o);
        const size = product(meta.chunkShape) * meta.dtype.itemSize;
        const fill = meta.fill ?? new Uint8Array(meta.dtype.itemSize);
        const uniform = fill.every((b) => b === fill[0]);
        return withBudget(uniform ? 1 : 2 * size, async () => {
          const encoded = uniform ? rleFrame(fill[0] as number, size) : compress(fillBuffer(fill, size));
          await put(o, encoded, encoded.length);
        });
      }
    }
  }

  // Every task settles before we report; the first failure is the error the caller sees. What was written
  // until then is recorded either way, so a re-run resumes from it.
  const results = await Promise.allSettled(tasks);
  const failure = results.find((r) => r.status === "rejected");
  const closed = log.close();
  if (failure) {
    await closed.catch(() => undefined);
    const reason = (failure as PromiseRejectedResult).reason;
    if (reason instanceof ConflictError) await retreat(destination, stepDir, wrote);
    throw reason;
  }
  await closed;
  report.seconds = (Date.now() - started) / 1000;
  return report;
}

/** An object already in place: what is stored, and whether a record of this plan already says so. */
interface Found {
  readonly result: Recorded;
  readonly recorded: boolean;
}

/**
 * Which of `objects` are already in the destination as this plan wants them, with what is stored: those a
 * record of this plan vouches for (size and CRC-32C of the stored bytes as recorded), and verbatim copies a
 * killed writer did not get to record whose bytes match their source (read again to compare).
 */
async function alreadyDone(
  plan: Plan,
  objects: readonly PlannedObject[],
  source: Store,
  destination: Store,
  concurrency: number,
): Promise<[PlannedObject, Found | undefined][]> {
  const stepDir = plan.destination.stepDir;
  const existing = await listStep(destination, stepDir);
  if (existing.size === 0) return objects.map((o) => [o, undefined]);
  const records = await readRecords(destination, stepDir, plan.id);
  const slots = new Budget(concurrency);
  const check = async (o: PlannedObject): Promise<Found | undefined> => {
    const key = joinKey(stepDir, o.target);
    const info = existing.get(o.target);
    if (info === undefined || (o.size !== null && info.size !== o.size)) return undefined;
    const record = records.get(o.target);
    if (record !== undefined)
      return (await objectDefect(source, destination, o, key, info, record)) === undefined ? { result: record, recorded: true } : undefined;
    const expected = await sourceCrc(source, o);
    if (expected === undefined) return undefined;
    const adopted = { size: info.size, crc32c: expected };
    return (await storedCrc(destination, key, info)) === expected ? { result: adopted, recorded: false } : undefined;
  };
  return Promise.all(
    objects.map(async (o): Promise<[PlannedObject, Found | undefined]> => {
      const release = await slots.acquire();
      try {
        return [o, await check(o)];
      } finally {
        release();
      }
    }),
  );
}

const PLAN_PATH = (plan: Plan) => `${plan.destination.root}/${plan.destination.stepDir}`;

/** Consecutive small verbatim copies from nearby ranges of one data file, as batches for one read each. */
function* coalesce(objects: readonly PlannedObject[]): Iterable<PlannedObject[]> {
  let batch: PlannedObject[] = [];
  let spanStart = 0;
  for (const o of objects) {
    const d = o.data;
    const small = o.transform === "copy" && d.kind === "range" && d.length < COALESCE_MAX / 8;
    if (!small) {
      if (batch.length) yield batch;
      batch = [];
      yield [o];
      continue;
    }
    const prev = batch[batch.length - 1]?.data as Extract<DataRef, { kind: "range" }> | undefined;
    const fits =
      prev !== undefined &&
      prev.key === d.key &&
      d.offset >= prev.offset + prev.length &&
      d.offset - (prev.offset + prev.length) <= COALESCE_GAP &&
      d.offset + d.length - spanStart <= COALESCE_MAX;
    if (!fits) {
      if (batch.length) yield batch;
      batch = [];
      spanStart = d.offset;
    }
    batch.push(o);
  }
  if (batch.length) yield batch;
}

/**
 * Streams a zarr v3 shard holding one inner chunk and yields only that chunk's bytes. The shard index
 * (offset, nbytes, CRC-32C) sits in the last 20 bytes; it is checked before the stream ends, so a shard
 * that is not laid out as planned fails the write instead of producing a wrong object.
 */
async function* innerChunkOfShard(source: Store, r: Extract<DataRef, { kind: "range" }>): AsyncIterable<Uint8Array> {
  const keep = r.length - 20;
  const tail = new Uint8Array(20);
  let seen = 0;
  for await (const piece of source.readStream(r.key, r.offset, r.length)) {
    const start = seen;
    seen += piece.length;
    if (start < keep) yield piece.subarray(0, Math.min(piece.length, keep - start));
    if (seen > keep) {
      const from = Math.max(0, keep - start);
      tail.set(piece.subarray(from), Math.max(0, start - keep));
    }
  }
  const path = describe(source, r.key);
  const view = new DataView(tail.buffer);
  const stored = view.getUint32(16, true);
  const actual = crc32c(tail.subarray(0, 16));
  if (stored !== actual) throw new ChecksumError("shard index CRC-32C mismatch", { path, offset: r.offset + r.length - 4 });
  const offset = view.getBigUint64(0, true);
  const nbytes = view.getBigUint64(8, true);
  if (offset !== 0n || nbytes !== BigInt(keep)) {
    throw new FormatError(`shard index says inner chunk at ${offset}+${nbytes}, expected 0+${keep}`, { path, offset: r.offset + keep });
  }
}
