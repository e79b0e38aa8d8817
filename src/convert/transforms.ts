import { crc32c } from "../codecs/crc32c.js";
import { compress, decodeChunkStream, FRAME_HEADER_MAX, FrameEncoder, readFrameHeader, rleFrame } from "../codecs/zstd.js";
import { ChecksumError, FormatError } from "../errors.js";
import { rangedOf, replayable, replayOf } from "../store/replay.js";
import { describe, joinKey, type RangeCopy, type Store } from "../store/store.js";
import { ElementAligner } from "../util/elements.js";
import { once } from "../util/streams.js";
import { type CastDtype, castTarget, castToBfloat16 } from "../zarr/cast.js";
import { decodeChunk } from "../zarr/chunk.js";
import { product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { fillBuffer } from "../zarr/region.js";
import { SHARD_INDEX_BYTES } from "./plan.js";
import { type DataRef, dataLength, type PlannedObject, type Transform } from "./plan-format.js";
import type { Recorded } from "./records.js";

/** Memory reserved for one streamed object (piece buffers on both sides), unless its destination buffers more. */
export const STREAM_RESERVE = 4 << 20;
/**
 * Largest chunk (decoded bytes) cast whole; a larger one is streamed. Whole is faster for small chunks (one
 * native call each way), and 16 MiB keeps a cast job under ~2.5x that in memory.
 */
export const CAST_WHOLE_MAX = 16 << 20;
/**
 * Memory of a streamed cast beyond its read and write buffers: the zstd decoder's window and block buffers (a
 * level-1 frame of a large chunk has a 512 KiB window), the level-1 encoder's (about 1.5 MiB), and a few pieces
 * of 128 KiB in flight.
 */
const CAST_STREAM_STATE = 4 << 20;
/** Buffer of a direct copy (Store.rangeCopyTo), reused from object to object. */
const COPY_BUFFER = 1 << 20;

type Range = Extract<DataRef, { kind: "range" }>;

/** What the handlers of one run share. */
export interface Run {
  readonly source: Store;
  readonly stepDir: string;
  /** The source's direct copy into the destination, where it has one (local to local). */
  readonly copy: RangeCopy | undefined;
  /** COPY_BUFFER-sized buffers of direct copies, reused from object to object. */
  readonly buffers: Uint8Array[];
  /** Memory reserved for one streamed object: what the destination's write buffers (see Store.writeBuffer). */
  readonly streamReserve: number;
  /** Largest chunk (decoded bytes) a cast does whole (CAST_WHOLE_MAX; smaller in tests and benchmarks). */
  readonly castWholeMax: number;
  /** The source metadata of the array a transcode, fill or cast object belongs to. */
  meta(o: PlannedObject): ZarrArrayMeta;
  /** The dtype that array is written as when the export casts it (plan.arrays[o.array].castTo). */
  castTo(o: PlannedObject): CastDtype | undefined;
}

/**
 * How one object is made: the bytes it holds in memory at most (its weight in the memory budget), and the
 * work, which yields the bytes to write (and how many it accounts for), or what a direct copy stored.
 */
export interface Job {
  readonly weight: number;
  /** What a streamed write of its output may buffer (WriteOptions.bufferBytes), where less than `weight`. */
  readonly buffer?: number;
  run(): Promise<Output>;
}

export type Output =
  /** `bytes` undefined: a stream of a length known once written (what the write stored). */
  | { readonly data: Uint8Array | AsyncIterable<Uint8Array>; readonly bytes: number | undefined }
  | { readonly stored: Recorded; readonly bytes: number };

/** One handler per transform (see Transform in plan-format.ts). */
export const HANDLERS: Readonly<Record<Transform, (run: Run, o: PlannedObject) => Job>> = {
  copy,
  "shard-inner": shardInner,
  transcode,
  fill,
  cast,
};

/**
 * Verbatim: inline bytes as they are; a range by the stores' direct copy, else streamed from read to write. A
 * zstd chunk's frame header is checked first (checkFrameHeader).
 */
function copy(run: Run, o: PlannedObject): Job {
  const d = o.data;
  const check = checkFrameHeader(run, o);
  if (d.kind === "inline")
    return {
      weight: dataLength(d),
      run: async () => {
        const bytes = Buffer.from(d.base64, "base64");
        check?.(bytes);
        return { data: bytes, bytes: dataLength(d) };
      },
    };
  const direct = run.copy;
  if (direct !== undefined) {
    return {
      weight: COPY_BUFFER,
      run: async () => {
        // The direct copy hands no bytes back: the header is a ranged read of its own (a local file's).
        if (check !== undefined) check(await run.source.readRange(d.key, d.offset, Math.min(FRAME_HEADER_MAX, d.length)));
        const buffer = run.buffers.pop() ?? new Uint8Array(COPY_BUFFER);
        try {
          return { stored: await direct(d.key, d.offset, d.length, joinKey(run.stepDir, o.target), buffer), bytes: d.length };
        } finally {
          run.buffers.push(buffer);
        }
      },
    };
  }
  return {
    weight: Math.min(d.length, run.streamReserve),
    run: async () => {
      const pieces = run.source.readStream(d.key, d.offset, d.length);
      return { data: check === undefined ? pieces : headChecked(pieces, check), bytes: d.length };
    },
  };
}

/** A shard of one inner chunk, streamed: its inner chunk, checked against the shard index (and its frame header). */
function shardInner(run: Run, o: PlannedObject): Job {
  const r = o.data as Range;
  const check = checkFrameHeader(run, o);
  return {
    weight: Math.min(r.length, run.streamReserve),
    run: async () => {
      const pieces = innerChunkOfShard(run.source, r);
      return { data: check === undefined ? pieces : headChecked(pieces, check), bytes: r.length - SHARD_INDEX_BYTES };
    },
  };
}

/**
 * For a zstd chunk passed through as its source stored it (copy, shard-inner), the check of its first bytes:
 * where its frame header declares a content size (RFC 8878 3.1.1.1; read, nothing decoded), it must be what the
 * chunk's shape holds, or TensorStore could not read the chunk: refused as the source's fault, before anything
 * of it is written. A frame without a declared size passes (only decoding tells; `verify` does). Undefined for
 * objects that are not such chunks (a `.zarray`, an uncompressed array, a plan without the object's array).
 */
export function checkFrameHeader(run: Run, o: PlannedObject): ((head: Uint8Array) => void) | undefined {
  if (o.array === undefined || (o.transform !== "copy" && o.transform !== "shard-inner")) return undefined;
  const meta = run.meta(o);
  if (meta.encoding.compressor !== "zstd") return undefined;
  const size = product(meta.chunkShape) * meta.dtype.itemSize;
  const d = o.data;
  const where = d.kind === "range" ? { path: describe(run.source, d.key), offset: d.offset } : { path: describe(run.source, "") };
  return (head) => {
    const declared = readFrameHeader(head, where.path, where.offset).contentSize;
    if (declared === undefined || declared === size) return;
    const slash = o.target.lastIndexOf("/");
    throw new FormatError(
      `chunk ${o.target.slice(slash + 1)} of ${o.target.slice("gda/".length, slash)}: its zstd frame declares ${declared} bytes decoded, ` +
        `the chunk's shape ${JSON.stringify(meta.chunkShape)} of ${meta.dtype.name} holds ${size}; TensorStore could not read it`,
      where,
    );
  };
}

/**
 * `data` handed on once its first FRAME_HEADER_MAX bytes (or all, if fewer) pass `check`. A store's stream stays
 * what it was (replay.ts): readable again, and from any offset, so a GCS destination still streams it without
 * buffering and can retry. A read from an offset past the start skips the check: an upload reads from the start
 * first and reopens at an offset only to resume, after that read checked the header.
 */
export function headChecked(data: AsyncIterable<Uint8Array>, check: (head: Uint8Array) => void): AsyncIterable<Uint8Array> {
  const replay = replayOf(data);
  if (replay === undefined) return checkedPieces(data, check);
  const ranged = rangedOf(data);
  return replayable(
    () => checkedPieces(replay(), check),
    ranged && { length: ranged.length, from: (skip) => (skip === 0 ? checkedPieces(ranged.from(0), check) : ranged.from(skip)) },
  );
}

async function* checkedPieces(pieces: AsyncIterable<Uint8Array>, check: (head: Uint8Array) => void): AsyncIterable<Uint8Array> {
  const held: Uint8Array[] = [];
  let have = 0;
  const checkHeld = () => check((held.length === 1 ? (held[0] as Uint8Array) : Buffer.concat(held)).subarray(0, FRAME_HEADER_MAX));
  for await (const p of pieces) {
    if (have >= FRAME_HEADER_MAX) {
      yield p;
      continue;
    }
    held.push(p);
    have += p.length;
    if (have < FRAME_HEADER_MAX) continue;
    checkHeld();
    yield* held.splice(0);
  }
  if (have < FRAME_HEADER_MAX) {
    checkHeld();
    yield* held;
  }
}

/** Decoded with the source array's codecs, re-encoded as one zstd frame. */
function transcode(run: Run, o: PlannedObject): Job {
  const d = o.data;
  const meta = run.meta(o);
  const size = product(meta.chunkShape) * meta.dtype.itemSize;
  return {
    weight: dataLength(d) + 2 * size,
    run: async () => {
      const stored = d.kind === "inline" ? Buffer.from(d.base64, "base64") : await run.source.readRange(d.key, d.offset, d.length);
      const encoded = compress(decodeChunk(meta, stored, d.kind === "range" ? describe(run.source, d.key) : o.target));
      return { data: encoded, bytes: encoded.length };
    },
  };
}

/**
 * Decoded with the source array's codecs, its float32/float64 elements cast to bfloat16 (zarr/cast.ts), encoded
 * as one zstd level-1 frame: what AXLearn's regular writer stores for a bfloat16 array's chunk. A chunk of up to
 * CAST_WHOLE_MAX decoded bytes is done whole: in memory at once the stored chunk, its elements, the cast elements
 * and their frame (at most the cast elements' size). A larger one is streamed (castStream), when it is stored as
 * one piece: its memory is that of a streamed copy plus the coders' state, whatever the chunk's size.
 */
function cast(run: Run, o: PlannedObject): Job {
  const d = o.data;
  const meta = run.meta(o);
  const elements = product(meta.chunkShape);
  const size = elements * meta.dtype.itemSize;
  const stream = size > run.castWholeMax ? castSource(run, meta, d, size) : undefined;
  if (stream !== undefined) {
    const path = d.kind === "range" ? describe(run.source, d.key) : o.target;
    return {
      weight: run.streamReserve + CAST_STREAM_STATE,
      buffer: run.streamReserve,
      // Replayable (a failed upload starts over): every iteration reads, decodes and encodes afresh.
      run: async () => ({ data: replayable(() => castStream(stream(), meta, size, path)), bytes: undefined }),
    };
  }
  return {
    weight: dataLength(d) + size + 2 * elements * 2,
    run: async () => {
      const stored = d.kind === "inline" ? Buffer.from(d.base64, "base64") : await run.source.readRange(d.key, d.offset, d.length);
      const decoded = decodeChunk(meta, stored, d.kind === "range" ? describe(run.source, d.key) : o.target);
      const encoded = compress(castToBfloat16(decoded, meta.dtype));
      return { data: encoded, bytes: encoded.length };
    },
  };
}

/**
 * How to stream a chunk's stored elements (still zstd-compressed, where the array is), or undefined where the
 * whole-chunk path must do it: a shard of several inner chunks, or one stored otherwise than as planned (the
 * whole path's decodeChunk reports it, or reads the fill value of an empty shard).
 */
function castSource(run: Run, meta: ZarrArrayMeta, d: DataRef, size: number): (() => AsyncIterable<Uint8Array>) | undefined {
  const enc = meta.encoding;
  const inner = enc.kind === "v3-sharded";
  if (inner && (enc.innerChunkShape.length !== meta.chunkShape.length || enc.innerChunkShape.some((n, i) => n !== meta.chunkShape[i])))
    return undefined;
  const length = inner ? dataLength(d) - SHARD_INDEX_BYTES : dataLength(d);
  if (enc.compressor === "zstd" ? length <= 0 : length !== size) return undefined;
  if (d.kind === "inline") {
    // Small by construction (the plan holds it); streamed only when a test forces every cast to be. A shard's
    // index is checked only by the whole path.
    if (inner) return undefined;
    const bytes = Buffer.from(d.base64, "base64");
    return () => once(bytes);
  }
  return inner ? () => innerChunkOfShard(run.source, d) : () => run.source.readStream(d.key, d.offset, d.length);
}

/**
 * The cast chunk's frame, from the stored chunk's pieces: decoded as TensorStore reads it (ChunkDecoder: one
 * frame of exactly `size` bytes), cast piece by piece (whole elements: ElementAligner), encoded as one zstd level-1 frame declaring its size (FrameEncoder).
 */
export async function* castStream(
  stored: AsyncIterable<Uint8Array>,
  meta: ZarrArrayMeta,
  size: number,
  path: string,
): AsyncIterable<Uint8Array> {
  const item = meta.dtype.itemSize;
  const out: Uint8Array[] = [];
  const encoder = new FrameEncoder((size / item) * 2, out);
  const aligned = new ElementAligner(item);
  const castPiece = (piece: Uint8Array): void => {
    const whole = aligned.take(piece);
    if (whole.length > 0) encoder.push(castToBfloat16(whole, meta.dtype));
  };
  // A chunk stored without a compressor is its elements: cast as they come.
  const fed = meta.encoding.compressor === "zstd" ? decodeChunkStream(stored, size, path, castPiece) : each(stored, castPiece);
  try {
    for await (const _ of fed) yield* out.splice(0);
    encoder.end();
    yield* out.splice(0);
  } finally {
    encoder.release();
  }
}

/** Hands each piece to `onPiece`, yielding after each (decodeChunkStream's shape, for pieces stored as they are). */
async function* each(pieces: AsyncIterable<Uint8Array>, onPiece: (piece: Uint8Array) => void): AsyncGenerator<void> {
  for await (const piece of pieces) {
    onPiece(piece);
    yield;
  }
}

/** A chunk of the fill value (cast, when the array is): a run-length frame when every byte is the same, else compressed. */
function fill(run: Run, o: PlannedObject): Job {
  const source = run.meta(o);
  const to = castTarget(source.dtype, run.castTo(o));
  const fillValue = source.fill ?? new Uint8Array(source.dtype.itemSize);
  const meta = { chunkShape: source.chunkShape, dtype: to ?? source.dtype };
  const size = product(meta.chunkShape) * meta.dtype.itemSize;
  const value = to === undefined ? fillValue : castToBfloat16(fillValue, source.dtype);
  const uniform = value.every((b) => b === value[0]);
  return {
    weight: uniform ? 1 : 2 * size,
    run: async () => {
      const encoded = uniform ? rleFrame(value[0] as number, size) : compress(fillBuffer(value, size));
      return { data: encoded, bytes: encoded.length };
    },
  };
}

/**
 * Streams a zarr v3 shard holding one inner chunk and yields only that chunk's bytes. The shard index
 * (offset, nbytes, CRC-32C) sits in its last SHARD_INDEX_BYTES; it is checked before the stream ends, so a
 * shard that is not laid out as planned fails the write instead of producing a wrong object.
 */
export async function* innerChunkOfShard(source: Store, r: Range): AsyncIterable<Uint8Array> {
  const keep = r.length - SHARD_INDEX_BYTES;
  const tail = new Uint8Array(SHARD_INDEX_BYTES);
  const crcAt = SHARD_INDEX_BYTES - 4;
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
  const stored = view.getUint32(crcAt, true);
  const actual = crc32c(tail.subarray(0, crcAt));
  if (stored !== actual) throw new ChecksumError("shard index CRC-32C mismatch", { path, offset: r.offset + r.length - 4 });
  const offset = view.getBigUint64(0, true);
  const nbytes = view.getBigUint64(8, true);
  if (offset !== 0n || nbytes !== BigInt(keep)) {
    throw new FormatError(`shard index says inner chunk at ${offset}+${nbytes}, expected 0+${keep}`, { path, offset: r.offset + keep });
  }
}
