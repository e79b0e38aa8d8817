import { FormatError } from "../errors.js";

/**
 * A cursor over a decoded OCDBT body. Every read is bounds-checked and a failure names the file and the
 * byte offset, counted from the start of the body it was given (plus `baseOffset`, for nested bodies).
 */
export class ByteReader {
  private pos = 0;
  private readonly view: DataView;

  /**
   * `baseOffset`: where `bytes` start in the file. For a decompressed body pass `compressedAt` (where
   * the compressed payload starts in the file) instead: positions inside it are not file offsets, so
   * errors report the payload's file offset and name the position in the decompressed body.
   */
  constructor(
    readonly bytes: Uint8Array,
    readonly path: string,
    private readonly baseOffset = 0,
    private readonly compressedAt?: number,
  ) {
    this.view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  }

  get offset(): number {
    return this.pos;
  }

  get remaining(): number {
    return this.bytes.length - this.pos;
  }

  fail(detail: string, at = this.pos): never {
    if (this.compressedAt !== undefined) {
      throw new FormatError(`${detail} (at byte ${at} of the decompressed body)`, { path: this.path, offset: this.compressedAt });
    }
    throw new FormatError(detail, { path: this.path, offset: this.baseOffset + at });
  }

  private need(n: number, what: string): void {
    if (n > this.remaining) this.fail(`truncated: ${what} needs ${n} bytes, ${this.remaining} left`);
  }

  u8(what: string): number {
    this.need(1, what);
    return this.bytes[this.pos++] as number;
  }

  u32le(what: string): number {
    this.need(4, what);
    const v = this.view.getUint32(this.pos, true);
    this.pos += 4;
    return v;
  }

  i32le(what: string): number {
    this.need(4, what);
    const v = this.view.getInt32(this.pos, true);
    this.pos += 4;
    return v;
  }

  u64le(what: string): bigint {
    this.need(8, what);
    const v = this.view.getBigUint64(this.pos, true);
    this.pos += 8;
    return v;
  }

  /**
   * Unsigned LEB128 as riegeli reads it: non-shortest encodings are accepted, but at most
   * ceil(bits/7) bytes and no bits beyond `bits`.
   */
  varintBig(what: string, bits: 32 | 64 = 64): bigint {
    const maxBytes = bits === 32 ? 5 : 10;
    const start = this.pos;
    let result = 0n;
    for (let i = 0; i < maxBytes; i++) {
      if (this.pos >= this.bytes.length) this.fail(`truncated varint (${what})`, start);
      const b = this.bytes[this.pos++] as number;
      result |= BigInt(b & 0x7f) << BigInt(7 * i);
      if ((b & 0x80) === 0) {
        if (result >> BigInt(bits) !== 0n) this.fail(`varint out of range for ${bits} bits (${what})`, start);
        return result;
      }
    }
    return this.fail(`varint longer than ${maxBytes} bytes (${what})`, start);
  }

  /** A varint that must fit a JS number exactly (offsets, lengths, counts); larger values are format errors. */
  varint(what: string, bits: 32 | 64 = 64): number {
    const start = this.pos;
    // Fast path without BigInt: up to 7 bytes (49 bits) is exact in a double.
    let result = 0;
    let scale = 1;
    for (let i = 0; i < (bits === 32 ? 5 : 7) && this.pos < this.bytes.length; i++) {
      const b = this.bytes[this.pos++] as number;
      result += (b & 0x7f) * scale;
      if ((b & 0x80) === 0) {
        if (bits === 32 && result > 0xffffffff) this.fail(`varint out of range for 32 bits (${what})`, start);
        return result;
      }
      scale *= 128;
    }
    this.pos = start;
    const v = this.varintBig(what, bits);
    if (v > BigInt(Number.MAX_SAFE_INTEGER)) this.fail(`${what} ${v} exceeds 2^53`, start);
    return Number(v);
  }

  /** A 16-bit length (keys, paths): a 32-bit varint that must be <= 65535. */
  varint16(what: string): number {
    const start = this.pos;
    const v = this.varint(what, 32);
    if (v > 0xffff) this.fail(`${what} ${v} exceeds 65535`, start);
    return v;
  }

  /**
   * A count of entries in a column-oriented array. Each entry takes at least `minBytesPerEntry` bytes of
   * what is left, so a corrupted count cannot make us allocate more than the input can justify.
   */
  count(what: string, max: number, minBytesPerEntry = 1): number {
    const start = this.pos;
    const n = this.varint(what);
    if (n > max) this.fail(`${what} ${n} exceeds the limit ${max}`, start);
    if (n * minBytesPerEntry > this.remaining) this.fail(`${what} ${n} is larger than the remaining bytes allow`, start);
    return n;
  }

  take(n: number, what: string): Uint8Array {
    this.need(n, what);
    const out = this.bytes.subarray(this.pos, this.pos + n);
    this.pos += n;
    return out;
  }

  expectEnd(what: string): void {
    if (this.remaining !== 0) this.fail(`${this.remaining} unexpected trailing bytes after ${what}`);
  }
}
