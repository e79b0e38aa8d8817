import { createHash } from "node:crypto";
import { NotFoundError } from "../errors.js";
import type { Entry } from "../ocdbt/database.js";
import { type ChunkKeyEncoding, chunkGrid, chunkKey, parseZarrMetadata, product, type ZarrArrayMeta } from "../zarr/metadata.js";
import { readArraySlabs, unravel } from "../zarr/read-array.js";
import type { Leaf } from "./pytree-metadata.js";
import type { OrbaxStep } from "./step.js";

/** One array leaf as stored: its zarr metadata and where each present chunk is. */
export interface StoredArray {
  readonly leaf: Leaf;
  readonly meta: ZarrArrayMeta;
  readonly metadataEntry: Entry;
  /** Present chunks by key relative to the array (`0.0`, `c/1/0`), in key order. */
  readonly chunks: ReadonlyMap<string, Entry>;
  /** Chunks the grid has; fewer may be present (zarr v3 fill-value chunks). */
  readonly gridChunks: number;
  readonly storedBytes: number;
  readonly inlineChunks: number;
}

/**
 * The array leaves of a step, in `_METADATA` order, each with its metadata and chunk locations. An array's keys
 * are streamed, and only its grid's chunks are kept: a database padded with keys that no array's grid has
 * (`prng_key/1000000`, `weight/junk`) costs time to list, never memory.
 */
export async function* listArrays(step: OrbaxStep): AsyncIterable<StoredArray> {
  const preferred = step.metadata?.useZarr3 ? "zarr.json" : ".zarray";
  const other = preferred === ".zarray" ? "zarr.json" : ".zarray";
  for (const leaf of step.leaves) {
    if (!leaf.isArray) continue;
    const metaEntry = (await step.source.get(`${leaf.name}/${preferred}`)) ?? (await step.source.get(`${leaf.name}/${other}`));
    if (metaEntry === undefined) {
      throw new NotFoundError(`array ${leaf.path} has no ${preferred}`, { path: step.source.describe(`${leaf.name}/${preferred}`) });
    }
    const rel = (e: Entry) => e.key.slice(leaf.name.length + 1);
    const kind = rel(metaEntry) as ".zarray" | "zarr.json";
    const meta = parseZarrMetadata(kind, await step.source.read(metaEntry.value), { path: step.source.describe(metaEntry.key) });
    const pattern = chunkKeyPattern(meta.keyEncoding, meta.shape.length);
    const grid = chunkGrid(meta);
    const chunks = new Map<string, Entry>();
    let storedBytes = 0;
    let inlineChunks = 0;
    for await (const e of step.source.list(`${leaf.name}/`)) {
      if (!pattern.test(rel(e)) || !inGrid(rel(e), grid)) continue;
      chunks.set(rel(e), e);
      storedBytes += e.value.kind === "inline" ? e.value.bytes.length : e.value.length;
      if (e.value.kind === "inline") inlineChunks++;
    }
    yield { leaf, meta, metadataEntry: metaEntry, chunks, gridChunks: product(grid), storedBytes, inlineChunks };
  }
}

/** Whether a chunk key (matching chunkKeyPattern) names a chunk of `grid`, in the canonical form chunkKey writes. */
function inGrid(key: string, grid: readonly number[]): boolean {
  if (grid.length === 0) return true; // rank 0: the pattern admits only its one chunk
  const indices = key.match(/\d+/g) ?? [];
  return indices.length === grid.length && indices.every((x, d) => String(Number(x)) === x && Number(x) < (grid[d] as number));
}

/** Names of the chunk keys of an array of `rank` under key encoding `enc` (e.g. `0.1`, `c/0/1`, rank 0: `0`, `c`). */
export function chunkKeyPattern(enc: ChunkKeyEncoding, rank: number): RegExp {
  const sep = enc.separator === "." ? "\\." : "/";
  if (enc.prefix === "c") return rank === 0 ? /^c$/ : new RegExp(`^c${sep}\\d+(${sep}\\d+){${rank - 1}}$`);
  return rank === 0 ? /^0$/ : new RegExp(`^\\d+(${sep}\\d+){${rank - 1}}$`);
}

/** Yields the array's decoded elements (little-endian, C order) slab by slab. */
export function readArray(step: OrbaxStep, array: StoredArray): AsyncIterable<Uint8Array> {
  const keyOf = (index: readonly number[]) => chunkKey(array.meta, index);
  if (array.meta.fill === null && array.chunks.size < array.gridChunks) {
    // Checked before anything is allocated: the declared shape of a damaged array may be enormous.
    const grid = chunkGrid(array.meta);
    let missing = "";
    for (let i = 0; i < array.gridChunks && missing === ""; i++) {
      const k = keyOf(array.meta.shape.length === 0 ? [] : unravel(i, grid));
      if (!array.chunks.has(k)) missing = k;
    }
    throw new NotFoundError(
      `${array.gridChunks - array.chunks.size} of ${array.gridChunks} chunks are missing and the array has no fill value`,
      {
        path: step.source.describe(`${array.leaf.name}/${missing}`),
      },
    );
  }
  return readArraySlabs(
    array.meta,
    async (index) => {
      const e = array.chunks.get(keyOf(index));
      return e === undefined ? undefined : step.source.read(e.value);
    },
    (index) => step.source.describe(`${array.leaf.name}/${keyOf(index)}`),
  );
}

/** sha256 (hex) of the array's raw little-endian C-order bytes, as numpy's `arr.tobytes()` gives them. */
export async function arraySha256(step: OrbaxStep, array: StoredArray): Promise<string> {
  const hash = createHash("sha256");
  for await (const slab of readArray(step, array)) hash.update(slab);
  return hash.digest("hex");
}
