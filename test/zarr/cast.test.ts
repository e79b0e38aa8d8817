// --dtype bfloat16's cast (src/zarr/cast.ts) against jnp's own: `jnp.asarray(x).astype(jnp.bfloat16)` run by the
// real jax (the project's .venv) on the same bit patterns: every special value, the boundaries of each
// rounding case, float32 subnormals, float64 values that round differently through float32, and random bits.
import { spawnSync } from "node:child_process";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { afterAll, describe, expect, test } from "vitest";
import { castTarget, castToBfloat16 } from "../../src/zarr/cast.js";
import { DTYPES } from "../../src/zarr/dtype.js";
import { removeScratch, scratch } from "../helpers/convert.js";
import { PYTHON } from "../helpers/paths.js";

afterAll(removeScratch);

const dtype = (name: string) => DTYPES.find((d) => d.name === name) as (typeof DTYPES)[number];

/** jnp's cast of raw little-endian elements of `from`: the bfloat16 bits. */
function jnpCast(elements: Uint8Array, from: "float32" | "float64"): Uint16Array {
  const dir = scratch("cast");
  writeFileSync(join(dir, "in"), elements);
  const script = [
    "import os, sys; os.environ['JAX_PLATFORMS'] = 'cpu'",
    "import jax, jax.numpy as jnp, numpy as np",
    "jax.config.update('jax_enable_x64', True)",
    `x = np.fromfile(sys.argv[1], dtype='<${from === "float32" ? "f4" : "f8"}')`,
    "np.asarray(jnp.asarray(x).astype(jnp.bfloat16)).view(np.uint16).astype('<u2').tofile(sys.argv[2])",
  ].join("\n");
  const r = spawnSync(PYTHON, ["-c", script, join(dir, "in"), join(dir, "out")], { encoding: "utf8", timeout: 120_000 });
  if (r.status !== 0) throw new Error(r.stderr);
  const out = readFileSync(join(dir, "out"));
  return new Uint16Array(out.buffer, out.byteOffset, out.length / 2);
}

/** Deterministic pseudo-random 32-bit words (xorshift32). */
function words(n: number, seed: number): Uint32Array {
  const out = new Uint32Array(n);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < n; i++) {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    out[i] = x;
  }
  return out;
}

const f32Bits = (() => {
  const special = [0, 0x80000000, 0x7f800000, 0xff800000, 0x7fc00000, 0xffc00000, 0x7f800001, 0xff800001, 0x7fffffff, 0xffffffff];
  const edges: number[] = [];
  // Around every rounding boundary of a few exponents: ties (0x8000) with even and odd kept bits, just below, above.
  for (const hi of [0x0000, 0x0001, 0x007f, 0x0080, 0x3f80, 0x3f81, 0x7f7f, 0x8001, 0xbf80, 0xff7f]) {
    for (const lo of [0x0000, 0x0001, 0x7fff, 0x8000, 0x8001, 0xffff]) edges.push(((hi << 16) | lo) >>> 0);
  }
  return Uint32Array.from([...special, ...edges, ...words(200_000, 7)]);
})();

function f64Elements(): Float64Array {
  const out: number[] = [0, -0, Infinity, -Infinity, Number.NaN, 1, -1, 3.4028235677973366e38, 3.5e38, 1e-40, -1e-40, 5e-324, -5e-324];
  out.push(1 + 2 ** -8 + 2 ** -30, 1 + 2 ** -8, 2 ** -126, 2 ** -126 - 2 ** -160, 2 ** -126 * (1 - 2 ** -9), 1.1754942e-38);
  const w = words(400_000, 11);
  const bits = new Uint32Array(2);
  const f = new Float64Array(bits.buffer);
  for (let i = 0; i < w.length; i += 2) {
    bits[0] = w[i] as number;
    // Exponents spread over float32's range and beyond, so that most values are finite float32 values.
    bits[1] = (((w[i + 1] as number) & 0x800fffff) | ((0x350 + (((w[i + 1] as number) >>> 20) % 0x160)) << 20)) >>> 0;
    out.push(f[0] as number);
  }
  const nan = new Float64Array(4);
  const nanBits = new Uint32Array(nan.buffer);
  nanBits.set([1, 0x7ff00000, 0, 0xfff80000, 0, 0x7ff40000, 0x1000, 0xfff00000]);
  return Float64Array.from([...out, ...nan]);
}

describe("castToBfloat16 equals jnp.asarray(x).astype(jnp.bfloat16)", () => {
  test("float32: every special value, rounding boundary and 200,000 random bit patterns", () => {
    const bytes = new Uint8Array(f32Bits.buffer);
    const mine = new Uint16Array(castToBfloat16(bytes, dtype("float32")).buffer);
    expect(Buffer.from(mine.buffer).equals(Buffer.from(jnpCast(bytes, "float32").buffer))).toBe(true);
  });

  test("float64: specials, values that round differently through float32, float32 subnormals, NaNs, 200,000 random values", () => {
    const bytes = new Uint8Array(f64Elements().buffer);
    const mine = new Uint16Array(castToBfloat16(bytes, dtype("float64")).buffer);
    const theirs = jnpCast(bytes, "float64");
    const diff = [...mine.keys()].filter((i) => mine[i] !== theirs[i]).slice(0, 5);
    expect(diff).toEqual([]);
  });

  test("elements that do not start on a 4-byte boundary cast the same", () => {
    const bytes = new Uint8Array(f32Bits.buffer, 0, 4096);
    const shifted = new Uint8Array(bytes.length + 1).subarray(1);
    shifted.set(bytes);
    expect(Buffer.from(castToBfloat16(shifted, dtype("float32"))).equals(Buffer.from(castToBfloat16(bytes, dtype("float32"))))).toBe(true);
  });
});

describe("which leaves --dtype bfloat16 casts", () => {
  test("float32 and float64 become bfloat16; integers, bool and 16-bit or narrower floats are not cast", () => {
    const cast = DTYPES.filter((d) => castTarget(d, "bfloat16") !== undefined).map((d) => d.name);
    expect(cast).toEqual(["float32", "float64"]);
    expect(castTarget(dtype("float32"), "bfloat16")?.zarr2).toBe("bfloat16");
    expect(castTarget(dtype("float32"), undefined)).toBeUndefined();
  });
});
