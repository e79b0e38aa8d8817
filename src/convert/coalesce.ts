import type { DataRef, PlannedObject } from "./plan-format.js";

/** Ranges of one data file closer than this are read together... */
const COALESCE_GAP = 256 << 10;
/** ...into reads of at most this many bytes, and only objects below an eighth of it are coalesced. */
const COALESCE_MAX = 8 << 20;

type Range = Extract<DataRef, { kind: "range" }>;

/** Verbatim copies read with one ranged read: `key` from `offset`, `span` bytes, holding each object's range. */
export interface Batch {
  readonly objects: readonly PlannedObject[];
  readonly key: string;
  readonly offset: number;
  readonly span: number;
}

/**
 * Splits `objects` (in plan order) into single objects and batches of consecutive small verbatim copies
 * from nearby ranges of one data file, each batch for one read (as zarrita's withRangeCoalescing and
 * TensorStore's coalescing kvstore merge nearby reads).
 */
export function* coalesce(objects: readonly PlannedObject[]): Iterable<PlannedObject | Batch> {
  let batch: PlannedObject[] = [];
  let spanStart = 0;
  const flush = function* (): Iterable<PlannedObject | Batch> {
    if (batch.length === 1) yield batch[0] as PlannedObject;
    else if (batch.length > 1) yield toBatch(batch);
    batch = [];
  };
  for (const o of objects) {
    const d = o.data;
    const small = o.transform === "copy" && d.kind === "range" && d.length < COALESCE_MAX / 8;
    if (!small) {
      yield* flush();
      yield o;
      continue;
    }
    const prev = batch[batch.length - 1]?.data as Range | undefined;
    const fits =
      prev !== undefined &&
      prev.key === d.key &&
      d.offset >= prev.offset + prev.length &&
      d.offset - (prev.offset + prev.length) <= COALESCE_GAP &&
      d.offset + d.length - spanStart <= COALESCE_MAX;
    if (!fits) {
      yield* flush();
      spanStart = d.offset;
    }
    batch.push(o);
  }
  yield* flush();
}

function toBatch(objects: PlannedObject[]): Batch {
  const first = objects[0]?.data as Range;
  const last = objects[objects.length - 1]?.data as Range;
  return { objects, key: first.key, offset: first.offset, span: last.offset + last.length - first.offset };
}

/** The bytes of `o` (an object of `batch`) within the batch's read `bytes`. */
export function sliceOf(batch: Batch, bytes: Uint8Array, o: PlannedObject): Uint8Array {
  const d = o.data as Range;
  return bytes.subarray(d.offset - batch.offset, d.offset - batch.offset + d.length);
}
