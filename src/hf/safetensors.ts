import { FormatError } from "../errors.js";

/**
 * The safetensors file format (https://github.com/huggingface/safetensors, "Format"): an 8-byte little-endian
 * header length N, N bytes of JSON, then the tensors' bytes back to back. The JSON maps each tensor's name to
 * {"dtype","shape","data_offsets":[begin,end]} (offsets relative to the end of the header) and may carry
 * "__metadata__" (string to string). Written as the Rust writer (safetensors/src/tensor.rs `prepare`) writes
 * it: compact JSON, "__metadata__" first, then the tensors in the order of their data, the header padded with
 * spaces to a multiple of 8 bytes.
 */

/** The dtypes an export writes (safetensors' names). */
export type SafetensorsDtype = "BF16" | "F32";

export const DTYPE_BYTES: Readonly<Record<SafetensorsDtype, number>> = { BF16: 2, F32: 4 };

/** The dtypes an import reads: an export's, and float16 (Meta's own Llama releases are float16 or bfloat16). */
export type StoredDtype = SafetensorsDtype | "F16";

export const STORED_BYTES: Readonly<Record<StoredDtype, number>> = { BF16: 2, F32: 4, F16: 2 };

export interface TensorEntry {
  readonly name: string;
  readonly dtype: SafetensorsDtype;
  readonly shape: readonly number[];
}

export interface HeaderLayout {
  /** The first 8 + N bytes of the file: length, JSON and padding. */
  readonly header: Uint8Array;
  /** Each tensor's [begin, end) in the data section, in the given order. */
  readonly offsets: readonly (readonly [number, number])[];
  /** Bytes of the data section. */
  readonly dataBytes: number;
  /** The whole file's size. */
  readonly fileBytes: number;
}

/** `transformers`' save_pretrained marks PyTorch state dicts with this (modeling_utils.py, safe_serialization). */
export const PT_METADATA = { format: "pt" } as const;

export function tensorBytes(t: Pick<TensorEntry, "dtype" | "shape">): number {
  return t.shape.reduce((a, b) => a * b, 1) * DTYPE_BYTES[t.dtype];
}

/** The header of a file holding `tensors`, their data in this order. */
export function buildHeader(tensors: readonly TensorEntry[], metadata: Readonly<Record<string, string>> = PT_METADATA): HeaderLayout {
  const offsets: [number, number][] = [];
  let at = 0;
  // Insertion order is JSON.stringify's order: __metadata__ first, then the tensors as laid out.
  const json: Record<string, unknown> = { __metadata__: metadata };
  for (const t of tensors) {
    if (t.name === "__metadata__" || Object.hasOwn(json, t.name)) throw new TypeError(`buildHeader: duplicate tensor name ${t.name}`);
    const n = tensorBytes(t);
    offsets.push([at, at + n]);
    json[t.name] = { dtype: t.dtype, shape: [...t.shape], data_offsets: [at, at + n] };
    at += n;
  }
  const text = new TextEncoder().encode(JSON.stringify(json));
  const padded = Math.ceil(text.length / 8) * 8;
  const header = new Uint8Array(8 + padded).fill(0x20, 8 + text.length);
  new DataView(header.buffer).setBigUint64(0, BigInt(padded), true);
  header.set(text, 8);
  return { header, offsets, dataBytes: at, fileBytes: header.length + at };
}

export interface ParsedHeader<D extends StoredDtype = SafetensorsDtype> {
  /** 8 + N: where the data section starts. */
  readonly dataStart: number;
  readonly metadata: Record<string, string> | undefined;
  readonly tensors: readonly (Omit<TensorEntry, "dtype"> & { readonly dtype: D; readonly begin: number; readonly end: number })[];
}

/** Longest header a reader accepts (the Rust reader's own limit is 100 MB). */
export const MAX_HEADER_BYTES = 100_000_000;

/** The header length N from a file's first 8 bytes. */
export function headerLength(first8: Uint8Array, path: string): number {
  if (first8.length < 8) throw new FormatError("safetensors file shorter than its 8-byte header length", { path });
  const n = new DataView(first8.buffer, first8.byteOffset, 8).getBigUint64(0, true);
  if (n > BigInt(MAX_HEADER_BYTES)) throw new FormatError(`safetensors header length ${n} is over ${MAX_HEADER_BYTES}`, { path });
  return Number(n);
}

/**
 * Parses the header (`bytes` holds at least its first 8 + N bytes), tensors in the order of their data. Tensors
 * of another dtype than `accept`'s are refused, naming the tensor and its dtype when `accept` is given.
 */
export function parseHeader(bytes: Uint8Array, path: string): ParsedHeader;
export function parseHeader<D extends StoredDtype>(bytes: Uint8Array, path: string, accept: readonly D[]): ParsedHeader<D>;
export function parseHeader(bytes: Uint8Array, path: string, accept?: readonly StoredDtype[]): ParsedHeader<StoredDtype> {
  const dtypes: readonly string[] = accept ?? ["BF16", "F32"];
  const n = headerLength(bytes, path);
  if (bytes.length < 8 + n) throw new FormatError(`safetensors header of ${n} bytes is cut short`, { path });
  let json: unknown;
  try {
    json = JSON.parse(new TextDecoder().decode(bytes.subarray(8, 8 + n)));
  } catch (e) {
    throw new FormatError(`safetensors header is not JSON (${(e as Error).message})`, { path });
  }
  if (typeof json !== "object" || json === null || Array.isArray(json))
    throw new FormatError("safetensors header is not an object", { path });
  let metadata: Record<string, string> | undefined;
  const tensors: (Omit<TensorEntry, "dtype"> & { dtype: StoredDtype; begin: number; end: number })[] = [];
  for (const [name, v] of Object.entries(json as Record<string, unknown>)) {
    if (name === "__metadata__") {
      metadata = v as Record<string, string>;
      continue;
    }
    const t = v as { dtype?: unknown; shape?: unknown; data_offsets?: unknown };
    const offsets = t.data_offsets as [number, number] | undefined;
    if (accept !== undefined && typeof t.dtype === "string" && !dtypes.includes(t.dtype))
      throw new FormatError(`tensor ${JSON.stringify(name)} has dtype ${t.dtype} (${dtypes.join(", ")} expected)`, { path });
    if (
      typeof t.dtype !== "string" ||
      !dtypes.includes(t.dtype) ||
      !Array.isArray(t.shape) ||
      !Array.isArray(offsets) ||
      offsets.length !== 2 ||
      !t.shape.every((s) => Number.isSafeInteger(s) && s >= 0)
    ) {
      throw new FormatError(`safetensors header entry ${JSON.stringify(name)} is not a BF16/F32 tensor with shape and data_offsets`, {
        path,
      });
    }
    const entry = { name, dtype: t.dtype as StoredDtype, shape: t.shape as number[], begin: offsets[0], end: offsets[1] };
    if (entry.end - entry.begin !== entry.shape.reduce((a, b) => a * b, 1) * STORED_BYTES[entry.dtype])
      throw new FormatError(`tensor ${name}: data_offsets do not match its shape`, { path });
    tensors.push(entry);
  }
  tensors.sort((a, b) => a.begin - b.begin);
  return { dataStart: 8 + n, metadata, tensors };
}
