// zstd-napi: native libzstd (what TensorStore itself uses), ~6x faster than JS for bulk chunk data.
// fzstd: pure-JS streaming decoder, used only for frames without a declared size, where the output has
// to be counted while decoding to keep it bounded.
import { Decompress } from "fzstd";
import * as native from "zstd-napi";
import { FormatError, LimitError } from "../errors.js";

const ZSTD_MAGIC = 0xfd2fb528;
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
