import { crc32c } from "../codecs/crc32c.js";
import { compress, rleFrame } from "../codecs/zstd.js";
import { ChecksumError, FormatError } from "../errors.js";
import { describe, joinKey, type RangeCopy, type Store } from "../store/store.js";
import { type CastDtype, castTarget, castToBfloat16 } from "../zarr/cast.js";
import { decodeChunk } from "../zarr/chunk.js";
import { product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { fillBuffer } from "../zarr/region.js";
import { SHARD_INDEX_BYTES } from "./plan.js";
import { type DataRef, dataLength, type PlannedObject, type Transform } from "./plan-format.js";
import type { Recorded } from "./records.js";

/** Memory reserved for one streamed object (piece buffers on both sides), unless its destination buffers more. */
export const STREAM_RESERVE = 4 << 20;
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
  run(): Promise<Output>;
}

export type Output =
  | { readonly data: Uint8Array | AsyncIterable<Uint8Array>; readonly bytes: number }
  | { readonly stored: Recorded; readonly bytes: number };

/** One handler per transform (see Transform in plan-format.ts). */
export const HANDLERS: Readonly<Record<Transform, (run: Run, o: PlannedObject) => Job>> = {
  copy,
  "shard-inner": shardInner,
  transcode,
  fill,
  cast,
};

/** Verbatim: inline bytes as they are; a range by the stores' direct copy, else streamed from read to write. */
function copy(run: Run, o: PlannedObject): Job {
  const d = o.data;
  if (d.kind === "inline")
    return { weight: dataLength(d), run: async () => ({ data: Buffer.from(d.base64, "base64"), bytes: dataLength(d) }) };
  const direct = run.copy;
  if (direct !== undefined) {
    return {
      weight: COPY_BUFFER,
      run: async () => {
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
    run: async () => ({ data: run.source.readStream(d.key, d.offset, d.length), bytes: d.length }),
  };
}

/** A shard of one inner chunk, streamed: its inner chunk, checked against the shard index. */
function shardInner(run: Run, o: PlannedObject): Job {
  const r = o.data as Range;
  return {
    weight: Math.min(r.length, run.streamReserve),
    run: async () => ({ data: innerChunkOfShard(run.source, r), bytes: r.length - SHARD_INDEX_BYTES }),
  };
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
 * as one zstd level-1 frame: what AXLearn's regular writer stores for a bfloat16 array's chunk. In memory at once:
 * the stored chunk, its elements, the cast elements and their frame (at most the cast elements' size).
 */
function cast(run: Run, o: PlannedObject): Job {
  const d = o.data;
  const meta = run.meta(o);
  const elements = product(meta.chunkShape);
  return {
    weight: dataLength(d) + elements * meta.dtype.itemSize + 2 * elements * 2,
    run: async () => {
      const stored = d.kind === "inline" ? Buffer.from(d.base64, "base64") : await run.source.readRange(d.key, d.offset, d.length);
      const decoded = decodeChunk(meta, stored, d.kind === "range" ? describe(run.source, d.key) : o.target);
      const encoded = compress(castToBfloat16(decoded, meta.dtype));
      return { data: encoded, bytes: encoded.length };
    },
  };
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
