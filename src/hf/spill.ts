import type { Store } from "../store/store.js";
import { allInOrder } from "../util/budget.js";
import { chunkGrid, product } from "../zarr/metadata.js";
import { type OutputTensor, STACKED_PREFIX } from "./llama.js";
import { DTYPE_BYTES, type SafetensorsDtype } from "./safetensors.js";
import type { SourceArray } from "./source.js";
import { Cursors, outputBytes, PassReuse, producePass } from "./stream.js";

/**
 * The spill of chunk groups: how a stacked weight cut in more chunks than --memory keeps decoders for is
 * exported with every chunk decoded once. Each chunk spans every layer and its zstd stream only goes forwards,
 * while one output tensor (one layer) needs that layer's slice of every chunk. So the chunks are split into
 * groups (tiles of the chunk grid) small enough to be open at once; each group is decoded layer by layer in
 * lock-step, once, giving each layer's sub-block of every tensor (the tensor's elements the group covers, laid
 * out in the tensor's own order), written to a scratch object under the destination; the tensors are then put
 * together band by band from the groups' sub-blocks (a sub-block's rows are contiguous in its object, so a band
 * is one read per group). The scratch objects are removed once their array is written, and any left by an
 * earlier run are removed before and after every export. When one group holds every chunk a layer covers (small
 * chunks decoded whole cost their bytes, not a decoder: chunkCost), the tensors are made straight from it, layer
 * by layer, and nothing is written.
 */

/** Scratch objects' names, at the destination's top: `<prefix><call's tag>.<array number>.<group>` (export.ts spillPrefix). */
export const SPILL_PREFIX = ".orbax2reg-spill.";

/** Chunks a stacked array's one layer covers (its grid without the layer axis). */
export function chunksPerLayer(array: SourceArray): number {
  return chunkGrid(array.meta)
    .slice(1)
    .reduce((a, b) => a * b, 1);
}

/** An element box of a source array. */
export interface Box {
  readonly origin: readonly number[];
  readonly extent: readonly number[];
}

/**
 * The array's chunk grid (every layer along axis 0) in tiles of at most `k` chunks per layer, in grid order: the
 * dimension with most chunks is cut first. `wholeLast` keeps the last axis whole (a rotary permutation moves
 * elements within it), so a tile may then hold more.
 */
export function chunkTiles(array: SourceArray, k: number, wholeLast: boolean): Box[] {
  const { shape, chunkShape } = array.meta;
  const grid = chunkGrid(array.meta);
  const r = shape.length;
  const tile = grid.slice();
  const size = () => tile.slice(1).reduce((a, b) => a * b, 1);
  while (size() > k) {
    let d = -1;
    for (let e = 1; e < r; e++)
      if (!(wholeLast && e === r - 1) && (tile[e] as number) > 1 && (d < 0 || (tile[e] as number) > (tile[d] as number))) d = e;
    if (d < 0) break;
    const others = size() / (tile[d] as number);
    tile[d] = Math.max(1, Math.min((tile[d] as number) - 1, Math.floor(k / others)));
  }
  const boxes: Box[] = [];
  const at = new Array<number>(r).fill(0);
  for (;;) {
    const origin = at.map((t, d) => t * (chunkShape[d] as number));
    const extent = at.map(
      (t, d) => Math.min(shape[d] as number, (t + (tile[d] as number)) * (chunkShape[d] as number)) - (origin[d] as number),
    );
    boxes.push({ origin, extent });
    let d = r - 1;
    for (; d >= 0; d--) {
      at[d] = (at[d] as number) + (tile[d] as number);
      if ((at[d] as number) < (grid[d] as number)) break;
      at[d] = 0;
    }
    if (d < 0) return boxes;
  }
}

/** The box dimensions of `t` that vary (extent > 1), slowest in the output first. */
function outputOrder(t: OutputTensor): number[] {
  return t.extent
    .map((e, d) => [e, d] as const)
    .filter(([e]) => e > 1)
    .map(([, d]) => d)
    .sort((a, b) => (t.outStrides[b] as number) - (t.outStrides[a] as number));
}

/**
 * Whether `t` is its box's elements transposed and reshaped (every output stride the product of the faster
 * dimensions' extents) with its bands along the slowest: then any sub-box of it, laid out in the same order,
 * is a block of its rows and columns, which is what a sub-block is. Every fuji tensor is.
 */
export function splittable(t: OutputTensor): boolean {
  const order = outputOrder(t);
  if (order.length === 0 || order[0] !== t.bandDim) return false;
  let s = 1;
  for (let i = order.length - 1; i >= 0; i--) {
    const d = order[i] as number;
    if (t.outStrides[d] !== s) return false;
    s *= t.extent[d] as number;
  }
  return true;
}

/** The part of `t` inside `box`, as an output tensor of its own laid out in `t`'s order; undefined when empty. */
export function subTensor(t: OutputTensor, box: Box): { t: OutputTensor; rel: number[] } | undefined {
  const origin: number[] = [];
  const extent: number[] = [];
  for (let d = 0; d < t.origin.length; d++) {
    const a = Math.max(t.origin[d] as number, box.origin[d] as number);
    const b = Math.min((t.origin[d] as number) + (t.extent[d] as number), (box.origin[d] as number) + (box.extent[d] as number));
    if (b <= a) return undefined;
    origin.push(a);
    extent.push(b - a);
  }
  const strides = t.outStrides.map(() => 0);
  let s = 1;
  const order = outputOrder(t);
  for (let i = order.length - 1; i >= 0; i--) {
    const d = order[i] as number;
    strides[d] = s;
    s *= extent[d] as number;
  }
  return { t: { ...t, origin, extent, outStrides: strides }, rel: origin.map((o, d) => o - (t.origin[d] as number)) };
}

/**
 * Runs of at least this many elements are copied through a view (a memcpy), shorter ones element by element:
 * for a 191-element run the view and memcpy took a quarter of the loop's time, garbage included.
 */
const LONG_RUN = 16;

/** `bytes` as elements of `item` bytes (copied first if not aligned to them). */
function elements(bytes: Uint8Array, item: number): Uint16Array | Uint32Array {
  const b = bytes.byteOffset % item === 0 ? bytes : bytes.slice();
  return item === 2 ? new Uint16Array(b.buffer, b.byteOffset, b.length / 2) : new Uint32Array(b.buffer, b.byteOffset, b.length / 4);
}

/** Where one group's sub-block of a tensor is: its object, offset, and place in the tensor's box. */
interface Placement {
  readonly key: string;
  readonly offset: number;
  readonly rel: readonly number[];
  readonly extent: readonly number[];
}

/** An array made straight from its chunks: its cursors, each tensor's unit, and the unit tensors made and not yet handed out. */
interface Direct {
  readonly cursors: Cursors;
  readonly reuse: PassReuse;
  readonly unitOf: ReadonlyMap<OutputTensor, readonly OutputTensor[]>;
  readonly made: Map<OutputTensor, Uint8Array>;
}

export interface SpillPlan {
  /** The spilled arrays (by path) and the chunks each of their groups holds. */
  readonly groupSize: ReadonlyMap<string, number>;
  /**
   * When some stacked array can be made neither streamed nor spilled within --memory (then its chunks are
   * decoded again from their start): the --memory that would make every array one way or the other.
   */
  readonly memoryWithoutRereads?: number;
}

/**
 * Which stacked arrays go through the spill: those the streaming engine would re-decode under `streamed` (the
 * memory plan: more chunks per layer than its open decoders, or a layer's tensors over its bands). Each gets
 * groups as large as --memory allows (`groupSize`); one that cannot have even one chunk a group, or whose tensors
 * are not splittable, is streamed as before, re-decoding, and the --memory that avoids it is said.
 */
export function planSpill(
  tensors: readonly OutputTensor[],
  dtype: SafetensorsDtype,
  memoryBytes: number,
  streamed: { readonly maxOpen: number; readonly maxBand: number },
  perDecoder: number,
  reserve: number,
): SpillPlan {
  const byArray = new Map<SourceArray, OutputTensor[]>();
  for (const t of tensors) if (t.array.path.startsWith(STACKED_PREFIX)) byArray.set(t.array, [...(byArray.get(t.array) ?? []), t]);
  const groups = new Map<string, number>();
  let short: number | undefined;
  for (const [array, ts] of byArray) {
    const c = chunksPerLayer(array);
    const unit = largestUnit(ts, dtype);
    if (c <= streamed.maxOpen && unit <= streamed.maxBand) continue;
    const k = groupSize(array, unit, memoryBytes, perDecoder, reserve);
    if (spillable(array, ts) && k >= 1 && (c > 1 || unit <= memoryBytes - perDecoder - reserve)) {
      groups.set(array.path, k);
      continue;
    }
    const need = spillable(array, ts) ? memoryForOneChunk(array, unit, perDecoder, reserve) : c * perDecoder + unit;
    short = Math.max(short ?? 0, need);
  }
  return { groupSize: groups, ...(short === undefined ? {} : { memoryWithoutRereads: short }) };
}

/** Tensors of one pass (a grouped layer's q, k and v) are made together: consecutive tensors with the same pass. */
function units(tensors: readonly OutputTensor[]): OutputTensor[][] {
  const out: OutputTensor[][] = [];
  for (const t of tensors) {
    const last = out.at(-1);
    if (last !== undefined && t.pass !== undefined && last[0]?.pass === t.pass) last.push(t);
    else out.push([t]);
  }
  return out;
}

/** The largest one-layer unit of an array's tensors (what a group's sub-blocks of it take, times k / chunks). */
export function largestUnit(tensors: readonly OutputTensor[], dtype: SafetensorsDtype): number {
  return Math.max(0, ...units(tensors).map((u) => u.reduce((a, t) => a + outputBytes(t, dtype), 0)));
}

/**
 * Chunks of `array` a group may hold so that its open decoders (`perDecoder` each), one unit's sub-blocks and
 * `reserve` (the scratch writer's buffer) fit in `memoryBytes`; 0 when not even one chunk fits.
 */
export function groupSize(array: SourceArray, unitBytes: number, memoryBytes: number, perDecoder: number, reserve: number): number {
  const c = chunksPerLayer(array);
  return Math.max(0, Math.min(c, Math.floor((memoryBytes - reserve) / (chunkCost(array, perDecoder) + unitBytes / c))));
}

/** The --memory a group of one chunk of `array` needs: below it the array's chunks are decoded more than once. */
export function memoryForOneChunk(array: SourceArray, unitBytes: number, perDecoder: number, reserve: number): number {
  return Math.ceil(chunkCost(array, perDecoder) + unitBytes / chunksPerLayer(array) + reserve);
}

/**
 * What one open chunk of `array` holds: a streaming decoder (`perDecoder`), or, for a chunk read and decoded whole
 * (SourceArray.wholeChunks), its decoded bytes and a quarter more for compressed bytes read and not yet decoded (a
 * pass reads all its chunks at once, the store 128 at a time). A source cut in 1,024 157 KB chunks a weight has
 * 1,024 of them open in 202 MB where 1,024 decoders would take 1.8 GB.
 */
export function chunkCost(array: SourceArray, perDecoder: number): number {
  if (array.wholeChunks !== true) return perDecoder;
  return Math.min(perDecoder, 1.25 * product(array.meta.chunkShape) * array.meta.dtype.itemSize);
}

/** Whether the tensors of stacked `array` can be made through the spill (all splittable). */
export function spillable(array: SourceArray, tensors: readonly OutputTensor[]): boolean {
  return array.path.startsWith(STACKED_PREFIX) && tensors.length > 0 && tensors.every(splittable);
}

/**
 * The spilled arrays of one export: `spill` decodes an array's groups into scratch objects (each chunk once),
 * `band` reads a band of one of its tensors back, `done` removes an array's objects once its tensors are
 * written, `removeAll` every scratch object (before an export, and after it whether it failed or not).
 */
export class Spill {
  private readonly placements = new Map<OutputTensor, Placement[]>();
  private readonly keys = new Map<SourceArray, string[]>();
  /** Arrays whose chunks all fit in one group: made straight from their chunks (Direct), no scratch object. */
  private readonly direct = new Map<SourceArray, Direct>();
  private arrays = 0;
  /** Chunks decoded more than once (none: each group's chunks are read forwards once), and the most open at once. */
  reopened = 0;
  /** Chunks whose decoding started past their start (Cursors.prefixRereads). */
  prefixRereads = 0;
  peakOpen = 0;

  constructor(
    private readonly store: Store,
    private readonly dtype: SafetensorsDtype,
    /** Each decoder's read window (exportWindow). */
    private readonly window: number,
    /** What the scratch writer may buffer (a GCS upload's chunk). */
    private readonly bufferBytes: number,
    /** The scratch objects' names begin so (SPILL_PREFIX, then one export call's own tag). */
    private readonly prefix: string = SPILL_PREFIX,
  ) {}

  has(array: SourceArray): boolean {
    return this.keys.has(array);
  }

  /**
   * Decodes `tensors` (all of one stacked array, in the plan's order) group by group, `k` chunks a group, each
   * group's every layer in one pass over its chunks, and writes each group's sub-blocks to its scratch object.
   */
  async spill(array: SourceArray, tensors: readonly OutputTensor[], k: number): Promise<void> {
    const n = this.arrays++;
    const keys: string[] = [];
    this.keys.set(array, keys);
    const tiles = chunkTiles(
      array,
      k,
      tensors.some((t) => t.perm !== undefined),
    );
    if (tiles.length === 1) {
      // One group holds every chunk a layer covers: a layer's tensors are whole in it, so there is nothing to put
      // together and nothing to write; each unit is made when its first tensor is asked for (band).
      const unitOf = new Map<OutputTensor, OutputTensor[]>();
      for (const unit of units(tensors)) for (const t of unit) unitOf.set(t, unit);
      this.direct.set(array, {
        cursors: new Cursors(Number.POSITIVE_INFINITY, this.window),
        reuse: new PassReuse(),
        unitOf,
        made: new Map(),
      });
      return;
    }
    for (const [g, box] of tiles.entries()) {
      const key = `${this.prefix}${n}.${g}`;
      keys.push(key);
      const cursors = new Cursors(Number.POSITIVE_INFINITY, this.window);
      const reuse = new PassReuse();
      const placements = this.placements;
      const dtype = this.dtype;
      let offset = 0;
      async function* subBlocks(): AsyncIterable<Uint8Array> {
        for (const unit of units(tensors)) {
          const subs = unit.map((t) => ({ t, sub: subTensor(t, box) })).filter((s) => s.sub !== undefined);
          if (subs.length === 0) continue;
          const outs = await producePass(
            subs.map((s) => ({ t: s.sub?.t as OutputTensor, u0: 0, u1: s.sub?.t.extent[s.sub.t.bandDim] as number })),
            dtype,
            cursors,
            reuse,
          );
          for (const [i, s] of subs.entries()) {
            const bytes = outs[i] as Uint8Array;
            let list = placements.get(s.t);
            if (list === undefined) {
              list = [];
              placements.set(s.t, list);
            }
            list.push({ key, offset, rel: s.sub?.rel as number[], extent: s.sub?.t.extent as number[] });
            offset += bytes.length;
            yield bytes;
          }
        }
      }
      try {
        await this.store.write(key, subBlocks(), { bufferBytes: this.bufferBytes, scratch: true });
      } finally {
        await cursors.closeAll();
        this.reopened += cursors.reopened;
        this.prefixRereads += cursors.prefixRereads;
        this.peakOpen = Math.max(this.peakOpen, cursors.peakOpen);
      }
    }
  }

  /** Rows [u0, u1) of `t` (units of its band dimension), put together from the groups' sub-blocks. */
  async band(t: OutputTensor, u0: number, u1: number): Promise<Uint8Array> {
    const direct = this.direct.get(t.array);
    if (direct !== undefined) return this.directBand(direct, t, u0, u1);
    const item = DTYPE_BYTES[this.dtype];
    const order = outputOrder(t);
    const b = order[0] as number;
    const rowElems = (t.outStrides[b] as number) || 1;
    const out = new Uint8Array((u1 - u0) * rowElems * item);
    const parts = (this.placements.get(t) ?? []).flatMap((p) => {
      const a = Math.max(u0, p.rel[b] as number);
      const z = Math.min(u1, (p.rel[b] as number) + (p.extent[b] as number));
      return z <= a ? [] : [{ p, a, z, subRow: order.slice(1).reduce((n, d) => n * (p.extent[d] as number), 1) }];
    });
    // Every group's rows read at once (together the band's bytes, which the band's budget counts): one after
    // another, a band waited for as many reads as groups, each a few round trips to the I/O threads.
    const read = await allInOrder(
      parts.map(({ p, a, z, subRow }) =>
        this.store.readRange(p.key, p.offset + (a - (p.rel[b] as number)) * subRow * item, (z - a) * subRow * item),
      ),
    );
    const o = elements(out, item);
    for (const [i, { p, a, z }] of parts.entries()) {
      const bytes = read[i] as Uint8Array;
      if (order.length === 1) {
        out.set(bytes, (a - u0) * item);
        continue;
      }
      // The sub-block's rows are sub-boxes of the tensor's rows: runs along the fastest dimension.
      const inner = order.slice(1);
      const last = inner.at(-1) as number;
      const run = p.extent[last] as number;
      const from = elements(bytes, item);
      const idx = new Array<number>(inner.length - 1).fill(0);
      let src = 0;
      for (let row = a; row < z; row++) {
        idx.fill(0);
        for (;;) {
          let dst = (row - u0) * rowElems + (p.rel[last] as number);
          for (let j = 0; j < idx.length; j++) {
            const d = inner[j] as number;
            dst += ((p.rel[d] as number) + (idx[j] as number)) * (t.outStrides[d] as number);
          }
          if (run >= LONG_RUN) o.set(from.subarray(src, src + run), dst);
          else for (let k = 0; k < run; k++) o[dst + k] = from[src + k] as number;
          src += run;
          let j = idx.length - 1;
          for (; j >= 0; j--) {
            idx[j] = (idx[j] as number) + 1;
            if ((idx[j] as number) < (p.extent[inner[j] as number] as number)) break;
            idx[j] = 0;
          }
          if (j < 0) break;
        }
      }
    }
    return out;
  }

  /**
   * Rows [u0, u1) of `t`, an array made directly: its unit (a grouped layer's q, k and v) made in one pass over
   * the chunks when its first tensor is asked for, layer after layer (the plan's order), so each chunk is read
   * forwards once; the unit's tensors are held until their last rows are handed out. A spilled tensor is
   * splittable (its band dimension the slowest of its dense layout), so rows [u0, u1) are one contiguous run.
   */
  private async directBand(d: Direct, t: OutputTensor, u0: number, u1: number): Promise<Uint8Array> {
    let bytes = d.made.get(t);
    if (bytes === undefined) {
      const unit = d.unitOf.get(t) ?? [t];
      let outs: Uint8Array[];
      try {
        outs = await producePass(
          unit.map((x) => ({ t: x, u0: 0, u1: x.extent[x.bandDim] as number })),
          this.dtype,
          d.cursors,
          d.reuse,
        );
      } catch (e) {
        await d.cursors.closeAll(); // the export ends here: its decoders go now, not at exit
        throw e;
      }
      for (const [i, x] of unit.entries()) d.made.set(x, outs[i] as Uint8Array);
      bytes = outs[unit.indexOf(t)] as Uint8Array;
    }
    const rows = t.extent[t.bandDim] as number;
    const row = bytes.length / rows;
    if (u1 === rows) d.made.delete(t);
    return bytes.subarray(u0 * row, u1 * row);
  }

  /** Removes `array`'s scratch objects (or closes its chunks, made directly): its tensors are written. */
  async done(array: SourceArray): Promise<void> {
    const direct = this.direct.get(array);
    if (direct !== undefined) {
      await direct.cursors.closeAll();
      this.reopened += direct.cursors.reopened;
      this.peakOpen = Math.max(this.peakOpen, direct.cursors.peakOpen);
      this.direct.delete(array);
    }
    for (const key of this.keys.get(array) ?? []) await this.store.delete(key);
    this.keys.set(array, []);
  }

  /** Removes every scratch object under the destination whose name begins with `prefix` (every export call's by default). */
  static async removeAll(store: Store, prefix: string = SPILL_PREFIX): Promise<void> {
    const keys: string[] = [];
    for await (const o of store.list(prefix)) keys.push(o.key);
    for (const key of keys) await store.delete(key);
  }
}
