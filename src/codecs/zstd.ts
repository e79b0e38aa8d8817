// zstd-napi: native libzstd (what TensorStore itself uses), ~6x faster than JS for bulk chunk data; its
// binding module's streaming context (ZSTD_decompressStream) decodes chunks piece by piece (ChunkDecoder).
// fzstd: pure-JS streaming decoder, used only for frames without a declared size, where the output has
// to be counted while decoding to keep it bounded.
import { Decompress } from "fzstd";
import * as native from "zstd-napi";
import binding from "zstd-napi/binding.js";
import { FormatError, LimitError } from "../errors.js";

const ZSTD_MAGIC = 0xfd2fb528;
/** Longest zstd frame header (RFC 8878 3.1.1): magic, descriptor, window, 4-byte dictionary id, 8-byte size. */
export const FRAME_HEADER_MAX = 18;
const SKIPPABLE_MASK = 0xfffffff0;
const SKIPPABLE_MAGIC = 0x184d2a50;

export interface FrameHeader {
  /** Declared decompressed size, if the frame carries one. */
  contentSize: number | undefined;
  /** Bytes the decoder must keep as its history window (what fzstd allocates). */
  windowSize: number;
}

/** Reads a zstd frame header (RFC 8878 §3.1.1.1) without decoding anything. */
export function readFrameHeader(data: Uint8Array, path: string, offset = 0): FrameHeader {
  const fail = (detail: string): never => {
    throw new FormatError(`zstd: ${detail}`, { path, offset });
  };
  if (data.length < 6) fail("frame shorter than its header");
  const magic = readU32(data, 0);
  if (magic !== ZSTD_MAGIC) fail(`bad frame magic 0x${magic.toString(16)}`);
  const fhd = data[4] as number;
  const fcsFlag = fhd >> 6;
  const singleSegment = (fhd >> 5) & 1;
  if (fhd & 0x08) fail("reserved frame header bit set");
  const dictIdBytes = [0, 1, 2, 4][fhd & 3] as number;
  let pos = 5;
  let windowSize = 0;
  if (!singleSegment) {
    const wd = data[pos++] as number;
    const base = 2 ** (10 + (wd >> 3));
    windowSize = base + (base / 8) * (wd & 7);
  }
  pos += dictIdBytes;
  const fcsBytes = fcsFlag === 0 ? singleSegment : 1 << fcsFlag;
  if (pos + fcsBytes > data.length) fail("frame header truncated");
  let contentSize: number | undefined;
  if (fcsBytes > 0) {
    let v = 0;
    for (let i = fcsBytes - 1; i >= 0; i--) v = v * 256 + (data[pos + i] as number);
    contentSize = fcsBytes === 2 ? v + 256 : v;
  }
  if (singleSegment) windowSize = contentSize ?? 0;
  return { contentSize, windowSize };
}

/**
 * Decompresses one or more concatenated zstd frames, refusing before allocation anything that would
 * decode to more than `maxBytes` (declared sizes and window sizes are checked first, actual output while
 * decoding), so corrupted input cannot exhaust memory. Decoder failures become FormatErrors.
 */
export function decompressBounded(data: Uint8Array, maxBytes: number, path: string, offset = 0): Uint8Array {
  // Decoders allocate the declared content size or window per frame; check every frame header up front.
  const declared = checkFrameHeaders(data, maxBytes, path, offset);
  if (declared !== undefined) {
    // Every frame declares its size and the total is within bounds: one native call.
    let out: Uint8Array;
    try {
      const b = native.decompress(data);
      out = new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
    } catch (e) {
      throw new FormatError(`zstd: corrupt compressed data (${(e as Error).message})`, { path, offset }, { cause: e });
    }
    if (out.length !== declared) {
      throw new FormatError(`zstd: decoded ${out.length} bytes, the frame header declares ${declared}`, { path, offset });
    }
    return out;
  }
  const parts: Uint8Array[] = [];
  let total = 0;
  const stream = new Decompress((chunk) => {
    total += chunk.length;
    if (total > maxBytes) {
      throw new LimitError(`zstd output exceeds the limit of ${maxBytes} bytes`, { path, offset });
    }
    parts.push(chunk);
  });
  try {
    stream.push(data, true);
  } catch (e) {
    if (e instanceof LimitError) throw e;
    throw new FormatError(`zstd: corrupt compressed data (${(e as Error).message})`, { path, offset }, { cause: e });
  }
  if (parts.length === 1) return parts[0] as Uint8Array;
  const out = new Uint8Array(total);
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** One zstd frame (with its content size) of `data` at `level`: TensorStore's zarr default is 1. */
export function compress(data: Uint8Array, level = 1): Uint8Array {
  const b = native.compress(data, { compressionLevel: level });
  return new Uint8Array(b.buffer, b.byteOffset, b.byteLength);
}

/** zstd compression parameters (ZSTD_cParameter, value), set in order on a context before ZSTD_compress2. */
export type ZstdParams = readonly (readonly [number, number])[];

/** A level alone: the frame zstd-napi's `compress` makes at that level. */
export const levelParams = (level: number): ZstdParams => [[binding.CParameter.compressionLevel, level]];

/** zstd.h: `#define ZSTD_c_literalCompressionMode ZSTD_c_experimentalParam5` (= 1002); ZSTD_ps_enable = 1. */
const LITERAL_COMPRESSION_MODE = 1002;
const PS_ENABLE = 1;

/**
 * For chunks of model weights made here (import-hf): level 1 with its match search all but skipped (targetLength,
 * the fast strategy's step, at 256) and the literals still Huffman-coded (literalCompressionMode forced on: left to
 * itself zstd stops coding them once targetLength is set, as at negative levels). Float weights have few repeated
 * byte strings to find, and what compresses them is the entropy of their exponent bytes: on float32 noise level 1
 * and these write the same bytes to 0.01 %; on bfloat16 weights widened to float32 (half their bytes zero, where
 * level 1 finds a short match every few bytes) these run 3.3x faster for 51.4 % of the size against 47.8 %. Any zstd
 * decoder reads the frames (the level is the writer's business).
 */
export const WEIGHT_PARAMS: ZstdParams = [
  [binding.CParameter.compressionLevel, 1],
  [binding.CParameter.targetLength, 256],
  [LITERAL_COMPRESSION_MODE, PS_ENABLE],
];

/**
 * Decompresses data that must decode to exactly `size` bytes (a zarr chunk of known shape).
 */
export function decompressExact(data: Uint8Array, size: number, path: string, offset = 0): Uint8Array {
  let out: Uint8Array;
  try {
    out = decompressBounded(data, size, path, offset);
  } catch (e) {
    // Here the size is known exactly, so more output is corrupt data rather than a resource limit.
    if (e instanceof LimitError)
      throw new FormatError(`zstd: decodes to more than the expected ${size} bytes`, { path, offset }, { cause: e });
    throw e;
  }
  if (out.length !== size) {
    throw new FormatError(`zstd: decoded ${out.length} bytes, expected ${size}`, { path, offset });
  }
  return out;
}

/** Checks every frame header; returns the total declared content size when every frame declares one. */
function checkFrameHeaders(data: Uint8Array, maxBytes: number, path: string, offset: number): number | undefined {
  // fzstd allocates each frame's declared content size (or window) up front, so every frame header is
  // checked before decoding starts; block headers give the way from one frame to the next.
  if (data.length === 0) throw new FormatError("zstd: empty input", { path, offset });
  let pos = 0;
  let declared = 0;
  let allDeclared = true;
  while (pos < data.length) {
    const at = offset + pos;
    if (data.length - pos < 8) throw new FormatError("zstd: truncated frame", { path, offset: at });
    const magic = readU32(data, pos);
    if ((magic & SKIPPABLE_MASK) >>> 0 === SKIPPABLE_MAGIC) {
      pos += 8 + readU32(data, pos + 4);
      continue;
    }
    const frame = data.subarray(pos);
    const h = readFrameHeader(frame, path, at);
    declared += h.contentSize ?? 0;
    if (h.contentSize === undefined) allDeclared = false;
    if (declared > maxBytes) {
      throw new LimitError(`zstd frames declare ${declared} bytes, over the limit of ${maxBytes}`, { path, offset: at });
    }
    if (h.windowSize > Math.max(maxBytes, 1 << 20)) {
      throw new LimitError(`zstd window of ${h.windowSize} bytes is over the limit of ${maxBytes}`, { path, offset: at });
    }
    pos += frameLength(frame, path, at);
  }
  return allDeclared ? declared : undefined;
}

/** Length in bytes of the zstd frame at the start of `frame`, found by walking its block headers. */
function frameLength(frame: Uint8Array, path: string, offset: number): number {
  const fhd = frame[4] as number;
  const singleSegment = (fhd >> 5) & 1;
  const fcsFlag = fhd >> 6;
  let pos = 5 + (singleSegment ? 0 : 1) + ([0, 1, 2, 4][fhd & 3] as number) + (fcsFlag === 0 ? singleSegment : 1 << fcsFlag);
  for (;;) {
    if (pos + 3 > frame.length) throw new FormatError("zstd: truncated block header", { path, offset: offset + pos });
    const bh = (frame[pos] as number) | ((frame[pos + 1] as number) << 8) | ((frame[pos + 2] as number) << 16);
    const last = bh & 1;
    const type = (bh >> 1) & 3;
    const size = bh >>> 3;
    if (type === 3) throw new FormatError("zstd: reserved block type", { path, offset: offset + pos });
    pos += 3 + (type === 1 ? 1 : size);
    if (pos > frame.length) throw new FormatError("zstd: truncated block", { path, offset: offset + pos });
    if (last) break;
  }
  if ((fhd >> 2) & 1) pos += 4; // content checksum
  if (pos > frame.length) throw new FormatError("zstd: truncated frame checksum", { path, offset: offset + pos });
  return pos;
}

function readU32(data: Uint8Array, pos: number): number {
  return (
    ((data[pos] as number) | ((data[pos + 1] as number) << 8) | ((data[pos + 2] as number) << 16) | ((data[pos + 3] as number) << 24)) >>> 0
  );
}

const MAX_BLOCK = 128 * 1024;

/**
 * A zstd frame of `size` copies of `byte`, made of RLE blocks: any size costs a few bytes per 128 KiB and
 * no buffer of `size` bytes (a 2 GiB all-zero chunk stays a 64 KiB frame).
 */
export function rleFrame(byte: number, size: number): Uint8Array {
  const blocks = Math.max(1, Math.ceil(size / MAX_BLOCK));
  const out = new Uint8Array(4 + 1 + 8 + blocks * 4);
  const view = new DataView(out.buffer);
  view.setUint32(0, ZSTD_MAGIC, true);
  out[4] = 0xe0; // 8-byte frame content size, single segment, no checksum, no dictionary
  view.setBigUint64(5, BigInt(size), true);
  let pos = 13;
  for (let b = 0, left = size; b < blocks; b++) {
    const n = Math.min(MAX_BLOCK, left);
    left -= n;
    const header = (n << 3) | (1 << 1) | (b === blocks - 1 ? 1 : 0); // size, RLE block, last flag
    out[pos] = header & 0xff;
    out[pos + 1] = (header >> 8) & 0xff;
    out[pos + 2] = (header >> 16) & 0xff;
    out[pos + 3] = byte;
    pos += 4;
  }
  return out;
}

/**
 * TensorStore's zarr driver reads a chunk with riegeli's ZstdReader, which accepts windows up to 2^31 bytes
 * (it sets ZSTD_d_windowLogMax to 31 on 64-bit machines): frames it reads must decode here too.
 */
const WINDOW_LOG_MAX = 31;
/** Output per decoder call: one block, the most ZSTD_decompressStream produces from its internal buffer at once. */
const OUT_PIECE = 128 << 10;
/** Decoding contexts kept for reuse: creating one per chunk leaves its buffers to the garbage collector. */
const idleContexts: binding.DCtx[] = [];
const IDLE_CONTEXTS = 8;

function takeContext(): binding.DCtx {
  const idle = idleContexts.pop();
  if (idle !== undefined) return idle;
  const d = new binding.DCtx();
  d.setParameter(binding.DParameter.windowLogMax, WINDOW_LOG_MAX);
  return d;
}

function giveBack(d: binding.DCtx): void {
  // Abandons a frame left half-decoded; keeps the window limit.
  d.reset(binding.ResetDirective.sessionOnly);
  if (idleContexts.length < IDLE_CONTEXTS) idleContexts.push(d);
}

/**
 * Decodes a zarr chunk's zstd bytes as TensorStore's zarr driver reads them, fed piece by piece and never held
 * whole: exactly one zstd frame (riegeli's ZstdReader stops at the end of the first, and the driver then requires
 * the chunk's bytes to end there: a second frame, a skippable frame or any other trailing byte fails), decoding
 * to exactly `size` bytes (the chunk's shape times its item size). The decoded bytes are counted as they come:
 * decoding stops at the first byte past `size`, so a frame that would inflate to gigabytes costs one block.
 * Frame checksums are checked (libzstd does). Failures are FormatErrors, also kept in `failure`.
 *
 * `onData`, when given, sees each decoded piece; the piece is only valid during the call.
 */
export class ChunkDecoder {
  /** The first failure, once there is one: every later push or end throws it again. */
  failure: FormatError | undefined;
  private context: binding.DCtx | undefined = takeContext();
  private readonly scratch: Uint8Array;
  private decoded = 0;
  private consumed = 0;
  private ended = false;

  constructor(
    readonly size: number,
    private readonly path: string,
    private readonly onData?: (piece: Uint8Array) => void,
    /** Decode straight into this buffer of `size` bytes instead of handing pieces to `onData`. */
    private readonly into?: Uint8Array,
  ) {
    this.scratch = new Uint8Array(into === undefined ? Math.min(OUT_PIECE, size + 1) : 1);
  }

  /** Decodes the next piece of the chunk's bytes. */
  push(piece: Uint8Array): void {
    if (this.failure !== undefined) throw this.failure;
    let src = piece;
    if (this.ended) {
      if (src.length > 0) this.trailing();
      return;
    }
    const context = this.context as binding.DCtx;
    for (;;) {
      const left = this.size - this.decoded;
      // Room for one byte past the shape at most: a longer frame fails on that byte.
      const dst =
        this.into !== undefined && left > 0
          ? this.into.subarray(this.decoded)
          : this.scratch.subarray(0, Math.min(this.scratch.length, left + 1));
      let result: binding.StreamResult;
      try {
        result = context.decompressStream(dst, src);
      } catch (e) {
        this.fail(`corrupt zstd frame (${(e as Error).message})`);
      }
      const [remaining, produced, consumed] = result;
      src = src.subarray(consumed);
      this.consumed += consumed;
      if (produced > 0) {
        if (produced > left)
          this.fail(`the zstd frame decodes to more than the ${this.size} bytes of the chunk's shape (stopped at byte ${this.size + 1})`);
        this.onData?.(dst.subarray(0, produced));
        this.decoded += produced;
      }
      if (remaining === 0) {
        // The frame ended, every byte of it handed out.
        this.ended = true;
        this.release();
        if (this.decoded !== this.size) this.fail(`the zstd frame decodes to ${this.decoded} bytes, the chunk's shape holds ${this.size}`);
        if (src.length > 0) this.trailing();
        return;
      }
      // More input needed; a full output buffer may have more to flush first.
      if (src.length === 0 && produced < dst.length) return;
    }
  }

  /** The chunk's bytes have all been pushed: fails unless its frame ended with exactly `size` bytes decoded. */
  end(): void {
    if (this.failure !== undefined) throw this.failure;
    if (!this.ended)
      this.fail(
        this.consumed === 0
          ? "empty chunk: no zstd frame"
          : `truncated zstd frame: the chunk ends after ${this.consumed} bytes, ${this.decoded} of its ${this.size} bytes decoded`,
      );
  }

  /** Gives the decoding context back (a decoder left before its end, too); idempotent. */
  release(): void {
    const c = this.context;
    this.context = undefined;
    if (c !== undefined) giveBack(c);
  }

  private trailing(): never {
    this.fail(
      `bytes follow the zstd frame, which ends at byte ${this.consumed} (TensorStore reads one frame, then expects the chunk to end)`,
    );
  }

  private fail(detail: string): never {
    this.release();
    this.failure = new FormatError(detail, { path: this.path });
    throw this.failure;
  }
}

/** Output buffer of the streaming encoder: one block's worth, what ZSTD_compressStream2 flushes at a time. */
const ENCODED_PIECE = 128 << 10;

/** Encoding contexts kept for reuse, as decoding ones are (idleContexts). */
const idleEncoders: binding.CCtx[] = [];

/**
 * One zstd frame of exactly `size` bytes, encoded piece by piece (ZSTD_compressStream2) and never held whole.
 * The size is pledged up front, so the frame header declares it as compress() writes it (same descriptor and
 * window at the same level); past the first few MiB the blocks may differ from compress()'s by a few bytes, as
 * compress() sees its whole input at once, but they decode to the same bytes. Input beyond `size`, or an end
 * short of it, fails in libzstd (the pledge). Encoded pieces are pushed to `out`, each a buffer of its own.
 */
export class FrameEncoder {
  private context: binding.CCtx | undefined = idleEncoders.pop() ?? new binding.CCtx();
  private buffer = new Uint8Array(ENCODED_PIECE);
  private filled = 0;

  constructor(
    readonly size: number,
    private readonly out: Uint8Array[],
    level = 1,
  ) {
    const c = this.context as binding.CCtx;
    c.setParameter(binding.CParameter.compressionLevel, level);
    c.setPledgedSrcSize(size);
  }

  /** Encodes the next piece of the frame's content. */
  push(piece: Uint8Array): void {
    this.run(piece, binding.EndDirective.continue);
  }

  /** Ends the frame (its content must have come to exactly `size` bytes) and hands out what is left of it. */
  end(): void {
    this.run(new Uint8Array(0), binding.EndDirective.end);
    if (this.filled > 0) this.out.push(this.buffer.subarray(0, this.filled));
    this.filled = 0;
    this.release();
  }

  /** Gives the encoding context back (an encoder left before its end, too); idempotent. */
  release(): void {
    const c = this.context;
    this.context = undefined;
    if (c === undefined) return;
    // Abandons a frame left half-encoded and the level and pledge: the next encoder sets its own.
    c.reset(binding.ResetDirective.sessionAndParameters);
    if (idleEncoders.length < IDLE_CONTEXTS) idleEncoders.push(c);
  }

  private run(src: Uint8Array, op: binding.EndDirective): void {
    const c = this.context;
    if (c === undefined) throw new Error("FrameEncoder: used after its end");
    let rest = src;
    for (;;) {
      const [remaining, produced, consumed] = c.compressStream2(this.buffer.subarray(this.filled), rest, op);
      this.filled += produced;
      rest = rest.subarray(consumed);
      if (this.filled === this.buffer.length) {
        this.out.push(this.buffer);
        this.buffer = new Uint8Array(ENCODED_PIECE);
        this.filled = 0;
      }
      if (op === binding.EndDirective.end ? remaining === 0 : rest.length === 0) return;
    }
  }
}

/** A whole chunk decoded as TensorStore reads it (ChunkDecoder): exactly one frame of exactly `size` bytes. */
export function decodeChunkFrame(data: Uint8Array, size: number, path: string): Uint8Array {
  // Not zero-filled first: the decoder writes every byte or fails, and a failed chunk's buffer is dropped.
  const out = new Uint8Array(Buffer.allocUnsafeSlow(size).buffer, 0, size);
  const decoder = new ChunkDecoder(size, path, undefined, out);
  try {
    decoder.push(data);
    decoder.end();
  } finally {
    decoder.release();
  }
  return out;
}

/**
 * A chunk's compressed pieces decoded as they stream in, as TensorStore reads them (ChunkDecoder: exactly one
 * frame of exactly `size` bytes), each decoded piece handed to `onData` (valid only during the call). Yields
 * once after each compressed piece is decoded and once after the frame's end is checked: the caller passes on
 * what `onData` made before the next piece is read, so no more than one compressed piece's output is held. The
 * decoder is released however the stream ends.
 */
export async function* decodeChunkStream(
  compressed: AsyncIterable<Uint8Array>,
  size: number,
  path: string,
  onData: (piece: Uint8Array) => void,
): AsyncGenerator<void> {
  const decoder = new ChunkDecoder(size, path, onData);
  try {
    for await (const piece of compressed) {
      decoder.push(piece);
      yield;
    }
    decoder.end();
    yield;
  } finally {
    decoder.release();
  }
}
