import { UnsupportedError } from "../errors.js";

/** An element type, named as numpy / ml_dtypes name it (what AXLearn's index and `inspect --json` print). */
export interface DType {
  readonly name: string;
  /** Bytes per element as stored (TensorStore stores 4- and 2-bit types one per byte). */
  readonly itemSize: number;
  /** The zarr v2 `.zarray` dtype string TensorStore writes. */
  readonly zarr2: string;
  /** The zarr v3 `data_type` name. */
  readonly zarr3: string;
}

const dtype = (name: string, itemSize: number, zarr2: string, zarr3 = name): DType => ({ name, itemSize, zarr2, zarr3 });

/** Every dtype TensorStore's zarr drivers write (tensorstore/driver/zarr/schema.yml and zarr3 data types). */
export const DTYPES: readonly DType[] = [
  dtype("bool", 1, "|b1"),
  dtype("int8", 1, "|i1"),
  dtype("uint8", 1, "|u1"),
  dtype("int16", 2, "<i2"),
  dtype("uint16", 2, "<u2"),
  dtype("int32", 4, "<i4"),
  dtype("uint32", 4, "<u4"),
  dtype("int64", 8, "<i8"),
  dtype("uint64", 8, "<u8"),
  dtype("float16", 2, "<f2"),
  dtype("float32", 4, "<f4"),
  dtype("float64", 8, "<f8"),
  dtype("complex64", 8, "<c8"),
  dtype("complex128", 16, "<c16"),
  dtype("bfloat16", 2, "bfloat16"),
  dtype("float8_e3m4", 1, "float8_e3m4"),
  dtype("float8_e4m3fn", 1, "float8_e4m3fn"),
  dtype("float8_e4m3fnuz", 1, "float8_e4m3fnuz"),
  dtype("float8_e4m3b11fnuz", 1, "float8_e4m3b11fnuz"),
  dtype("float8_e5m2", 1, "float8_e5m2"),
  dtype("float8_e5m2fnuz", 1, "float8_e5m2fnuz"),
  dtype("float8_e8m0fnu", 1, "float8_e8m0fnu"),
  dtype("float4_e2m1fn", 1, "float4_e2m1fn"),
  dtype("int4", 1, "int4"),
  dtype("int2", 1, "int2"),
];

const byZarr2 = new Map(DTYPES.map((d) => [d.zarr2, d]));
const byZarr3 = new Map(DTYPES.map((d) => [d.zarr3, d]));

// One-byte types may be written with any byte-order mark ("|", "<" or ">"); all mean the same bytes.
for (const d of DTYPES) {
  if (d.itemSize === 1 && /^[|<>][biu]1$/.test(d.zarr2)) {
    byZarr2.set(`<${d.zarr2.slice(1)}`, d);
    byZarr2.set(`>${d.zarr2.slice(1)}`, d);
  }
}

export function dtypeFromZarr2(s: unknown, where: { path: string; key?: string }): DType {
  const d = typeof s === "string" ? byZarr2.get(s) : undefined;
  if (d === undefined) throw new UnsupportedError(`zarr v2 dtype ${JSON.stringify(s)}`, where);
  return d;
}

export function dtypeFromZarr3(s: unknown, where: { path: string; key?: string }): DType {
  const d = typeof s === "string" ? byZarr3.get(s) : undefined;
  if (d === undefined) throw new UnsupportedError(`zarr v3 data_type ${JSON.stringify(s)}`, where);
  return d;
}
