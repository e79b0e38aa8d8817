import { DTYPES, type DType } from "./dtype.js";

/** The element types an export can be cast to (`--dtype`). */
export const CAST_DTYPES = ["bfloat16"] as const;
export type CastDtype = (typeof CAST_DTYPES)[number];

const BFLOAT16 = DTYPES.find((d) => d.name === "bfloat16") as DType;

/**
 * The dtype a leaf of `dtype` is written as under `--dtype to`: floating-point leaves of 32 or 64 bits become
 * `to`; integers, booleans and 16-bit (or narrower) floats pass through (undefined: not cast).
 */
export function castTarget(dtype: DType, to: CastDtype | undefined): DType | undefined {
  if (to === undefined) return undefined;
  return dtype.name === "float32" || dtype.name === "float64" ? BFLOAT16 : undefined;
}

/**
 * Decoded little-endian float32 or float64 elements as bfloat16, exactly as `jnp.asarray(x).astype(jnp.bfloat16)`
 * gives them on CPU (XLA's convert; test/zarr/cast.test.ts checks it against the real jax):
 * - float32: round to nearest, ties to even, on the top 16 bits; subnormals round like any other value;
 *   infinities and -0.0 stay what they are; a NaN becomes the quiet NaN 0x7fc0 with its sign.
 * - float64: first to float32 (round to nearest even) with float32 subnormal results flushed to zero of the same
 *   sign (XLA converts f64 to bf16 through f32 and flushes there), then as above. A NaN becomes 0x7fc0 with its sign.
 */
export function castToBfloat16(elements: Uint8Array, from: DType): Uint8Array {
  if (from.name === "float32") return f32ToBf16(u32View(elements));
  if (from.name === "float64") return f64ToBf16(elements);
  throw new TypeError(`castToBfloat16: ${from.name} is not float32 or float64`);
}

/** An Int32Array over the bytes (copied when they are not 4-byte aligned). */
function u32View(b: Uint8Array): Int32Array {
  if (b.byteOffset % 4 === 0) return new Int32Array(b.buffer, b.byteOffset, b.length >>> 2);
  return new Int32Array(b.slice().buffer, 0, b.length >>> 2);
}

function f32ToBf16(src: Int32Array): Uint8Array {
  const out = new Uint16Array(src.length);
  for (let i = 0; i < src.length; i++) out[i] = bf16Bits(src[i] as number);
  return new Uint8Array(out.buffer);
}

/**
 * bfloat16 bits of float32 bits `u` (as a signed 32-bit integer): round to nearest even; NaN -> quiet NaN of
 * the same sign. Worked on the two 16-bit halves so that every value stays a small integer (V8 keeps those
 * unboxed; `u + 0x7fff` on the whole word would leave the int32 range and run ~2x slower).
 */
export function bf16Bits(u: number): number {
  const hi = u >>> 16;
  if ((u & 0x7fffffff) > 0x7f800000) return (hi & 0x8000) | 0x7fc0;
  // Carrying out of 0xffff into bit 16 rounds up; -inf (0xff80) + 1 cannot happen (its low half is 0).
  return (hi + (((u & 0xffff) + 0x7fff + (hi & 1)) >>> 16)) & 0xffff;
}

function f64ToBf16(elements: Uint8Array): Uint8Array {
  const n = elements.length >>> 3;
  const view = new DataView(elements.buffer, elements.byteOffset, elements.length);
  const f32 = new Float32Array(1);
  const bits = new Uint32Array(f32.buffer);
  const out = new Uint16Array(n);
  for (let i = 0; i < n; i++) {
    const hi = view.getUint32(i * 8 + 4, true);
    const lo = view.getUint32(i * 8, true);
    const sign = (hi >>> 16) & 0x8000;
    if ((hi & 0x7ff00000) === 0x7ff00000 && ((hi & 0xfffff) !== 0 || lo !== 0)) {
      out[i] = sign | 0x7fc0;
      continue;
    }
    f32[0] = view.getFloat64(i * 8, true); // round to nearest even, as a C cast does
    const u = bits[0] as number;
    // A float32 subnormal result (exponent 0, mantissa not 0) is flushed to a zero of its sign.
    out[i] = (u & 0x7f800000) === 0 ? sign : bf16Bits(u);
  }
  return new Uint8Array(out.buffer);
}
