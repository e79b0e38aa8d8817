// The bytes of an upload, handed out chunk by chunk from any offset the server asks for: a resumable upload
// (gcs.ts) sends a chunk, learns how much of it the server kept, and sends the rest again with what follows.
// A stream is read into one buffer of a chunk's size, reused for the whole upload, so that a failed chunk is
// sent again from memory and the source is read once; bytes in memory already are handed out as views.
import { crc32c } from "../codecs/crc32c.js";
import type { Ranged } from "./replay.js";

export interface Chunk {
  /** The bytes from the offset asked for (a view, valid until the next take). */
  readonly bytes: Uint8Array;
  /** Whether they end the object: then `offset + bytes.length` is its size. */
  readonly last: boolean;
}

export interface ChunkSource {
  /**
   * Up to `max` bytes from `offset`, which must not precede the offset of the previous take (what the server
   * kept is never asked for again). Fewer than `max` only at the end of the object.
   */
  take(offset: number, max: number): Promise<Chunk>;
  /** The size and CRC-32C of the whole object, once its last chunk was taken. */
  readonly total: { size: number; crc32c: number } | undefined;
  /** Closes the source (a stream's download) before its end. */
  close(): Promise<void>;
}

/** Bytes already in memory: views, no copy. */
export function memoryChunks(data: Uint8Array): ChunkSource {
  let total: { size: number; crc32c: number } | undefined;
  return {
    take: async (offset, max) => {
      const bytes = data.subarray(offset, offset + max);
      const last = offset + bytes.length >= data.length;
      if (last) total ??= { size: data.length, crc32c: crc32c(data) };
      return { bytes, last };
    },
    get total() {
      return total;
    },
    close: async () => {},
  };
}

/**
 * A stream, through one buffer of `capacity` bytes (the largest chunk asked for). `head` holds pieces already
 * read from `rest`. The CRC-32C is taken as bytes enter the buffer, each once and in order.
 */
export function streamChunks(head: Uint8Array[], rest: AsyncIterator<Uint8Array>, capacity: number): ChunkSource {
  const buffer = new Uint8Array(capacity);
  let start = 0; // the object offset of buffer[0]
  let filled = 0; // bytes of the buffer in use
  let crc = 0;
  let size = 0;
  let ended = false;
  const pending = head; // read from the source, not yet in the buffer (the array is ours)
  let total: { size: number; crc32c: number } | undefined;

  /** The next piece of the source, or undefined at its end. */
  const next = async (): Promise<Uint8Array | undefined> => {
    const p = pending.shift();
    if (p !== undefined) return p;
    if (ended) return undefined;
    const n = await rest.next();
    if (n.done) {
      ended = true;
      return undefined;
    }
    return n.value;
  };

  return {
    take: async (offset, max) => {
      if (offset < start || offset > start + filled) throw new RangeError(`chunk at ${offset} is outside the buffered ${start}+${filled}`);
      if (max > capacity) throw new RangeError(`chunk of ${max} bytes is larger than the buffer (${capacity})`);
      // Drop what the server kept, keep the rest at the front.
      buffer.copyWithin(0, offset - start, filled);
      filled -= offset - start;
      start = offset;
      while (filled < max) {
        const piece = await next();
        if (piece === undefined) break;
        const used = Math.min(piece.length, max - filled);
        buffer.set(piece.subarray(0, used), filled);
        crc = crc32c(piece.subarray(0, used), crc);
        size += used;
        filled += used;
        if (used < piece.length) pending.unshift(piece.subarray(used));
      }
      // Whether these bytes end the object: a full chunk ends it only if nothing follows.
      let last = filled < max;
      if (!last) {
        const after = await next();
        if (after === undefined) last = true;
        else pending.unshift(after);
      }
      if (last && pending.length === 0) total ??= { size, crc32c: crc };
      return { bytes: buffer.subarray(0, Math.min(filled, max)), last };
    },
    get total() {
      return total;
    },
    close: async () => {
      if (!ended) await rest.return?.(undefined);
      ended = true;
    },
  };
}

/** What a RangeReader knows: the CRC-32C of the source's first `at` bytes. */
export interface CrcPoint {
  readonly at: number;
  readonly crc: number;
}

/**
 * A ranged source read forward, its CRC-32C taken on the way, handed out in pieces as they arrive (no buffer):
 * a chunk of a resumable upload is streamed from it, and after a failure it is reopened from a point whose
 * CRC-32C is known, the bytes up to where the server resumes hashed but not sent (at most one chunk).
 */
export class RangeReader {
  private it: AsyncIterator<Uint8Array> | undefined;
  private carry: Uint8Array | undefined;
  /** Where the reader is, and the CRC-32C of everything before; undefined when it must be reopened. */
  private point: CrcPoint | undefined;

  constructor(
    readonly source: Ranged,
    private readonly tooShort: (got: number) => Error,
  ) {}

  /** Where the reader is, if it is in a known state. */
  get position(): CrcPoint | undefined {
    return this.point;
  }

  /** Positions the reader at `to`, reopening the source at `known` (at or before `to`) unless it is there. */
  async seek(known: CrcPoint, to: number): Promise<void> {
    if (this.point?.at === to) return;
    await this.close();
    this.it = this.source.from(known.at)[Symbol.asyncIterator]();
    this.point = known;
    for await (const _ of this.pieces(to - known.at)) {
      // hashed, not sent
    }
  }

  /**
   * The next `n` bytes as pieces. Leaving early (a failed request) leaves the reader in no known state, so the
   * next seek reopens it.
   */
  async *pieces(n: number): AsyncGenerator<Uint8Array> {
    const p = this.point;
    const it = this.it;
    if (p === undefined || it === undefined) throw new RangeError("RangeReader read before seek");
    this.point = undefined;
    let { at, crc } = p;
    const end = at + n;
    while (at < end) {
      let piece = this.carry;
      this.carry = undefined;
      if (piece === undefined) {
        const r = await it.next();
        if (r.done) throw this.tooShort(at);
        piece = r.value;
      }
      if (piece.length > end - at) {
        this.carry = piece.subarray(end - at);
        piece = piece.subarray(0, end - at);
      }
      crc = crc32c(piece, crc);
      at += piece.length;
      yield piece;
    }
    this.point = { at, crc };
  }

  async close(): Promise<void> {
    const it = this.it;
    this.it = undefined;
    this.carry = undefined;
    this.point = undefined;
    await it?.return?.(undefined);
  }
}
