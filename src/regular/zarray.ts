import type { ZarrArrayMeta } from "../zarr/metadata.js";

/**
 * The `.zarray` TensorStore writes for AXLearn's regular checkpointer: compact JSON, keys sorted, zstd
 * level 1, `fill_value` null, C order, "." separator, no trailing newline.
 */
export function zarrayText(meta: Pick<ZarrArrayMeta, "shape" | "chunkShape" | "dtype">): string {
  return JSON.stringify({
    chunks: meta.chunkShape,
    compressor: { id: "zstd", level: 1 },
    dimension_separator: ".",
    dtype: meta.dtype.zarr2,
    fill_value: null,
    filters: null,
    order: "C",
    shape: meta.shape,
    zarr_format: 2,
  });
}

/** The zarr v2 chunk key AXLearn's reader expects: indices joined by "."; "0" for rank 0. */
export function regularChunkKey(index: readonly number[]): string {
  return index.length === 0 ? "0" : index.join(".");
}
