import { LimitError } from "../errors.js";
import { type Budget, forEachLimited } from "../util/budget.js";
import { ElementAligner } from "../util/elements.js";
import { bf16Bits } from "../zarr/cast.js";
import { chunkGrid } from "../zarr/metadata.js";
import type { OutputTensor } from "./llama.js";
import type { SafetensorsDtype } from "./safetensors.js";
import type { SourceArray } from "./source.js";

/**
 * The streaming engine: an output tensor is filled from the chunks its box covers, each chunk read by one
 * sequential decoder (a ChunkCursor) that stays where it stopped, so that tensors asked for in the order of
 * the source's bytes (an array's layers in order: a stacked array's axis 0 is its slowest) decode every chunk
 * once, whatever the size of the chunk: a (32, 3, 512, 32, 128) qkv chunk spanning every layer is read layer
 * slice by layer slice, and only the output tensor (or a band of it) is ever held.
 */

/** What the elements become: the cast of one run of source elements into the output. */
type Mode = "f32>bf16" | "f32>f32" | "bf16>f32" | "bf16>bf16";

const NO_OUTPUT = new Uint16Array(0);

/** One box ∩ one chunk: its runs along the last dimension, in the chunk's flat (C) order. */
class Walker {
  /** Flat element index (in the chunk) of the first and one past the last element the walker needs. */
  start = 0;
  end = 0;
  private readonly idx: number[];
  private runStart = 0;
  /** Output offset of the current run's leading coordinates: kept as the run advances, not summed per run. */
  private base = 0;
  private done = false;
  private readonly lastOff: Int32Array;
  private readonly runLen: number;
  /** Output offset of the run's first element within its last-dimension coordinates (lastOff's index). */
  private readonly b0: number;

  constructor(
    private readonly chunkShape: readonly number[],
    private readonly chunkStrides: readonly number[],
    /** The box within the chunk: [lo, hi) per dimension, chunk coordinates (its own arrays: rebase moves them). */
    private readonly lo: number[],
    private readonly hi: number[],
    /** Output element offset of each run: base from the leading coordinates (box-relative) times their strides. */
    private readonly boxOffset: number[],
    private readonly outStrides: readonly number[],
    /** Output offset of each last-dimension coordinate (box-relative), permuted where the tensor says. */
    lastOffsets: Int32Array,
    private out: Uint16Array | Uint32Array,
    private readonly outBase: number,
    readonly mode: Mode,
  ) {
    const r = chunkShape.length;
    this.lastOff = lastOffsets;
    this.idx = lo.slice(0, r - 1);
    this.runLen = (hi[r - 1] as number) - (lo[r - 1] as number);
    this.b0 = (lo[r - 1] as number) + (boxOffset[r - 1] as number);
    this.reset();
  }

  /** Back to the box's first run. */
  private reset(): void {
    const r = this.chunkShape.length;
    const { lo, hi, boxOffset, outStrides, chunkStrides } = this;
    for (let d = 0; d < r - 1; d++) this.idx[d] = lo[d] as number;
    this.runStart = this.flat(this.idx) + (lo[r - 1] as number);
    this.start = this.runStart;
    let last = 0;
    for (let d = 0; d < r; d++) last += ((hi[d] as number) - 1) * (chunkStrides[d] as number);
    this.end = last + 1;
    let base = this.outBase;
    for (let d = 0; d < r - 1; d++) base += ((this.idx[d] as number) + (boxOffset[d] as number)) * (outStrides[d] as number);
    this.base = base;
    this.done = false;
  }

  /**
   * The same box `delta` elements further along axis 0 (the next layer of a stacked array, in the same chunk),
   * written into `out`: what a new walker would be, without making one (a finely cut source feeds tens of
   * thousands of chunk-layers, and a walker per chunk and layer lived just long enough to be copied by every
   * young-generation collection of its pass).
   */
  rebase(delta: number, out: Uint16Array | Uint32Array): void {
    this.lo[0] = (this.lo[0] as number) + delta;
    this.hi[0] = (this.hi[0] as number) + delta;
    // chunk coordinate + boxOffset = box-relative coordinate: the box moved by delta, the chunk did not.
    this.boxOffset[0] = (this.boxOffset[0] as number) - delta;
    this.out = out;
    this.reset();
  }

  /** Lets go of its output (a kept pass's walkers must not hold the last layer's tensors until the next rebase). */
  release(): void {
    this.out = NO_OUTPUT;
  }

  private flat(idx: readonly number[]): number {
    let f = 0;
    for (let d = 0; d < idx.length; d++) f += (idx[d] as number) * (this.chunkStrides[d] as number);
    return f;
  }

  /** Copies what it needs of elements [p0, p0 + src.length) of the chunk. */
  consume(src: Uint16Array | Uint32Array, p0: number): void {
    if (this.runLen === 1 && this.chunkShape.length > 1) {
      this.consumeSingles(src, p0);
      return;
    }
    const runLen = this.runLen;
    const p1 = p0 + src.length;
    while (!this.done && this.runStart < p1) {
      const a = Math.max(this.runStart, p0);
      const b = Math.min(this.runStart + runLen, p1);
      if (a < b) copyRun(src, a - p0, b - a, this.out, this.base, this.lastOff, a - this.runStart + this.b0, this.mode);
      if (this.runStart + runLen > p1) return;
      this.advance();
    }
  }

  /**
   * consume for runs of one element (a chunk one element wide on the last axis, as linear2's under a mesh that
   * cuts the model axis in as many pieces as it has elements): the runs along the next axis in one loop, not a
   * copyRun call and an advance each.
   */
  private consumeSingles(src: Uint16Array | Uint32Array, p0: number): void {
    const p1 = p0 + src.length;
    const d = this.chunkShape.length - 2;
    const sStep = this.chunkStrides[d] as number;
    const oStep = this.outStrides[d] as number;
    const hiD = this.hi[d] as number;
    const at = this.lastOff[this.b0] as number;
    const out = this.out;
    const mode = this.mode;
    while (!this.done && this.runStart < p1) {
      let i = this.idx[d] as number;
      let rs = this.runStart;
      let o = this.base + at;
      for (; i < hiD && rs < p1; i++, rs += sStep, o += oStep) {
        if (rs < p0) continue;
        const v = src[rs - p0] as number;
        out[o] = mode === "f32>bf16" ? bf16Bits(v) : mode === "bf16>f32" ? (v << 16) >>> 0 : v;
      }
      this.base = o - at;
      this.runStart = rs;
      this.idx[d] = i;
      if (i < hiD) return;
      // The row along d is done: back to its last run, and on to the next run as advance counts it.
      this.idx[d] = hiD - 1;
      this.runStart -= sStep;
      this.base -= oStep;
      this.advance();
    }
  }

  /** The next run: the leading coordinates counted up like an odometer, runStart and base moved along. */
  private advance(): void {
    const r = this.chunkShape.length;
    let d = r - 2;
    for (; d >= 0; d--) {
      const next = (this.idx[d] as number) + 1;
      if (next < (this.hi[d] as number)) {
        this.idx[d] = next;
        this.runStart += this.chunkStrides[d] as number;
        this.base += this.outStrides[d] as number;
        break;
      }
      // Back to lo: undo this coordinate's steps.
      const steps = (this.idx[d] as number) - (this.lo[d] as number);
      this.idx[d] = this.lo[d] as number;
      this.runStart -= steps * (this.chunkStrides[d] as number);
      this.base -= steps * (this.outStrides[d] as number);
    }
    if (d < 0) this.done = true;
  }
}

function copyRun(
  src: Uint16Array | Uint32Array,
  s0: number,
  n: number,
  out: Uint16Array | Uint32Array,
  base: number,
  off: Int32Array,
  b0: number,
  mode: Mode,
): void {
  switch (mode) {
    case "f32>bf16":
      for (let k = 0; k < n; k++) out[base + (off[b0 + k] as number)] = bf16Bits(src[s0 + k] as number);
      return;
    case "bf16>f32":
      for (let k = 0; k < n; k++) out[base + (off[b0 + k] as number)] = ((src[s0 + k] as number) << 16) >>> 0;
      return;
    default:
      for (let k = 0; k < n; k++) out[base + (off[b0 + k] as number)] = src[s0 + k] as number;
  }
}

/** One chunk's sequential decoder, kept between tensors; reopened (the chunk read again) only when asked to go back. */
export class ChunkCursor {
  /** Elements of the chunk handed out so far (they are in `view` from `viewPos` on, or to come). */
  private pos = 0;
  /**
   * The decoded piece being handed out, as elements (chunk elements [viewPos, viewPos + view.length)): one
   * view per piece, not one per feed (a small chunk is one piece, fed once a layer).
   */
  private view: Uint16Array | Uint32Array | undefined;
  private viewPos = 0;
  /** The decoded pieces cut at element boundaries. */
  private aligned: ElementAligner;
  private it: AsyncIterator<Uint8Array> | undefined;
  /** The open decoder hands out the chunk's float32 elements cast to bfloat16 (SourceArray.castsToBf16). */
  private bf16 = false;
  reopened = 0;
  /**
   * Opened to hand out elements past its start: the elements before them are decoded and dropped (another
   * call, or an earlier run, made the tensors they belong to: a shard starting inside a stacked array).
   */
  startedPast = 0;
  /** Closed to stay within the cap on open decoders (Cursors): its next use decodes the chunk from its start. */
  evicted = false;

  constructor(
    private readonly array: SourceArray,
    private readonly index: readonly number[],
    /** Compressed bytes read at a time (the source's default when not given). */
    private readonly window?: number,
  ) {
    this.aligned = new ElementAligner(array.meta.dtype.itemSize);
  }

  private get itemSize(): number {
    return this.bf16 ? 2 : this.array.meta.dtype.itemSize;
  }

  /** Whether `walkers` take this chunk's float32 elements as bfloat16 (bandWalkers: the source casts them). */
  private wantsBf16(walkers: readonly Walker[]): boolean {
    return this.array.meta.dtype.name === "float32" && (walkers[0] as Walker).mode === "bf16>bf16";
  }

  /** The next element-aligned piece of decoded bytes, or undefined at the chunk's end. */
  private async next(): Promise<Uint8Array | undefined> {
    this.it ??= this.array.chunk(this.index, this.window, this.bf16)[Symbol.asyncIterator]();
    for (;;) {
      const r = await this.it.next();
      if (r.done) return undefined;
      const piece = this.aligned.take(r.value);
      if (piece.length > 0) return piece.byteOffset % 4 === 0 ? piece : piece.slice();
    }
  }

  /** The first element any of `walkers` needs and one past the last. */
  private static span(walkers: readonly Walker[]): [number, number] {
    let start = Number.POSITIVE_INFINITY;
    let end = 0;
    for (const w of walkers) {
      if (w.start < start) start = w.start;
      if (w.end > end) end = w.end;
    }
    return [start, end];
  }

  /**
   * Feeds the walkers at once when every element they need is already decoded (no read, no decode, no
   * promise: a finely cut source's small chunks are decoded whole, then fed once a layer); false otherwise,
   * and nothing done.
   */
  feedDecoded(walkers: readonly Walker[]): boolean {
    if (walkers.length === 0) return true;
    const view = this.view;
    if (view === undefined || this.evicted || this.wantsBf16(walkers) !== this.bf16) return false;
    const [start, end] = ChunkCursor.span(walkers);
    if (start < this.pos || end > this.viewPos + view.length) return false;
    for (const w of walkers) w.consume(view, this.viewPos);
    this.pos = end;
    this.releaseAtEnd();
    return true;
  }

  /** Feeds the walkers every element they need; they need nothing before their `start`. */
  async feed(walkers: readonly Walker[]): Promise<void> {
    if (walkers.length === 0) return;
    const [start, end] = ChunkCursor.span(walkers);
    const bf16 = this.wantsBf16(walkers);
    if (this.it !== undefined && bf16 !== this.bf16) {
      // Open for the other element type (another export dtype over the same cursors): decoded again as asked.
      await this.close();
      this.reopened++;
    }
    if (this.it === undefined && bf16 !== this.bf16) {
      this.bf16 = bf16;
      this.aligned = new ElementAligner(this.itemSize);
    }
    if (start < this.pos) {
      // Going back: the chunk is decoded again from its start (a band of a tensor over the memory budget).
      await this.close();
      this.reopened++;
    } else if (this.evicted && start > 0) this.reopened++;
    else if (this.it === undefined && this.pos === 0 && start > 0) this.startedPast++;
    this.evicted = false;
    while (this.pos < end) {
      let view = this.view;
      if (view === undefined || this.pos >= this.viewPos + view.length) {
        const piece = await this.next();
        if (piece === undefined)
          throw new LimitError(`chunk ended at element ${this.pos}, before element ${end}`, { path: this.array.describeChunk(this.index) });
        view =
          this.itemSize === 4
            ? new Uint32Array(piece.buffer, piece.byteOffset, piece.length / 4)
            : new Uint16Array(piece.buffer, piece.byteOffset, piece.length / 2);
        this.view = view;
        this.viewPos = this.pos;
      }
      const upTo = Math.min(this.viewPos + view.length, end);
      // The walkers take what they need of the piece (nothing past `end`, nothing before `pos`).
      if (upTo > start) for (const w of walkers) w.consume(view, this.viewPos);
      this.pos = upTo;
    }
    this.releaseAtEnd();
  }

  /** The chunk's last element handed out: its decoder and buffers go (pos stays, so going back reopens). */
  private releaseAtEnd(): void {
    if (this.pos !== this.array.meta.chunkShape.reduce((a, b) => a * b, 1)) return;
    const it = this.it;
    this.it = undefined;
    this.view = undefined;
    void Promise.resolve(it?.return?.()).catch(() => undefined);
  }

  /** Whether a decoder is open (its window and buffers held). */
  get live(): boolean {
    return this.it !== undefined;
  }

  async close(): Promise<void> {
    await this.closeNow();
  }

  /** Closes at once (the decoder is live no more when this returns); its release finishes in the background. */
  closeNow(): Promise<unknown> {
    const it = this.it;
    this.it = undefined;
    this.view = undefined;
    this.aligned.reset();
    this.pos = 0;
    return Promise.resolve(it?.return?.()).catch(() => undefined);
  }
}

/**
 * The cursors of one producer, by array and chunk: tensors asked for in order share them. At most `maxOpen`
 * decoders stay open: past that the least recently used are closed, and decode their chunk from its start
 * when next needed (counted in `reopened`). A stacked weight's chunks span every layer, so when the chunks one
 * layer of it covers are more than the cap (a mesh that cuts each weight in more pieces than --memory keeps
 * decoders for), each layer re-reads them from the start: decoding grows with layers squared, memory stays
 * bounded.
 */
export class Cursors {
  private readonly open = new Map<string, ChunkCursor>();
  reopened = 0;
  /** Chunks of closed cursors first decoded from past their start (ChunkCursor.startedPast). */
  prefixRereads = 0;
  /** The most decoders seen open at once (after a chunk's feed, before the cap is kept). */
  peakOpen = 0;

  constructor(
    readonly maxOpen = Number.POSITIVE_INFINITY,
    /** Each decoder's read window (exportWindow); the source's default when not given. */
    readonly window?: number,
  ) {}

  get(array: SourceArray, index: readonly number[]): ChunkCursor {
    const key = `${array.path}|${index.join(",")}`;
    let c = this.open.get(key);
    if (c === undefined) c = new ChunkCursor(array, index, this.window);
    // Most recently used last.
    this.open.delete(key);
    this.open.set(key, c);
    return c;
  }

  /**
   * Closes decoders beyond the cap (never one in `busy`), the most recently used first: layer after layer the
   * chunks are asked for in the same order, so the least recently used is the next one needed, and closing
   * the newest keeps the first ones open for the next layer (cap - 1 chunks a layer not re-read).
   */
  trim(busy: ReadonlySet<ChunkCursor> = new Set(), room = 0): void {
    let live = this.live();
    this.peakOpen = Math.max(this.peakOpen, live);
    // Under the cap: nothing to close, and no copy of the open cursors (this runs after every chunk's feed).
    if (live + room <= this.maxOpen) return;
    for (const c of [...this.open.values()].reverse()) {
      if (live + room <= this.maxOpen) return;
      if (!c.live || busy.has(c)) continue;
      // Synchronous: a producer about to open a decoder sees the others' room taken or freed at once.
      void c.closeNow();
      c.evicted = true;
      live--;
    }
  }

  /** Decoders open now. */
  live(): number {
    let n = 0;
    for (const c of this.open.values()) if (c.live) n++;
    return n;
  }

  /** Closes the decoders of `path`'s chunks: the tensors made next come from another array. */
  async closeArray(path: string): Promise<void> {
    for (const [key, c] of this.open) {
      if (!key.startsWith(`${path}|`)) continue;
      this.reopened += c.reopened;
      this.prefixRereads += c.startedPast;
      await c.close();
      this.open.delete(key);
    }
  }

  async closeAll(): Promise<void> {
    for (const c of this.open.values()) {
      this.reopened += c.reopened;
      this.prefixRereads += c.startedPast;
      await c.close();
    }
    this.open.clear();
  }
}

const BYTES: Record<SafetensorsDtype, number> = { BF16: 2, F32: 4 };

/** Bytes of `t` written as `dtype`. */
export function outputBytes(t: Pick<OutputTensor, "shape">, dtype: SafetensorsDtype): number {
  return t.shape.reduce((a, b) => a * b, 1) * BYTES[dtype];
}

/** The bands of `t` no larger than `maxBand` bytes (whole units of its band dimension; one band when it fits). */
export function bands(t: OutputTensor, dtype: SafetensorsDtype, maxBand: number): [number, number][] {
  const units = t.extent[t.bandDim] as number;
  const total = outputBytes(t, dtype);
  if (total <= maxBand || units <= 1) return [[0, units]];
  const per = Math.max(1, Math.floor(maxBand / (total / units)));
  const out: [number, number][] = [];
  for (let a = 0; a < units; a += per) out.push([a, Math.min(units, a + per)]);
  return out;
}

/** One band of one tensor: units [u0, u1) of its band dimension. */
export interface BandRequest {
  readonly t: OutputTensor;
  readonly u0: number;
  readonly u1: number;
}

/** The bytes of band [u0, u1) of `t` as `dtype` (producePass of one band). */
export async function produceBand(t: OutputTensor, dtype: SafetensorsDtype, u0: number, u1: number, cursors: Cursors): Promise<Uint8Array> {
  return (await producePass([{ t, u0, u1 }], dtype, cursors))[0] as Uint8Array;
}

/** The chunks of one pass, each with the walkers of every band that needs it, and each band's output. */
interface Pass {
  readonly requests: readonly BandRequest[];
  readonly dtype: SafetensorsDtype;
  /** Each band's elements (its output, made anew each time: a kept pass holds no output). */
  readonly lengths: readonly number[];
  /** Each request's walkers (what a rebase moves). */
  readonly byRequest: readonly Walker[][];
  readonly chunks: readonly PassChunk[];
}

interface PassChunk {
  readonly array: SourceArray;
  readonly index: number[];
  readonly walkers: Walker[];
  /** Its cursor, kept by a reused pass (PassReuse) instead of looked up again each layer. */
  cursor?: ChunkCursor;
}

/** A pass and its outputs, which the walkers write. */
interface MadePass {
  readonly pass: Pass;
  readonly outs: (Uint16Array | Uint32Array)[];
}

function buildPass(requests: readonly BandRequest[], dtype: SafetensorsDtype): MadePass {
  const perChunk = new Map<string, PassChunk>();
  const byRequest: Walker[][] = [];
  const outs = requests.map(({ t, u0, u1 }) => {
    const { out, walkers } = bandWalkers(t, dtype, u0, u1);
    for (const w of walkers) {
      const key = `${t.array.path}|${w.index.join(",")}`;
      let entry = perChunk.get(key);
      if (entry === undefined) {
        entry = { array: t.array, index: w.index, walkers: [] };
        perChunk.set(key, entry);
      }
      entry.walkers.push(w.walker);
    }
    byRequest.push(walkers.map((w) => w.walker));
    return out;
  });
  return { pass: { requests, dtype, lengths: outs.map((o) => o.length), byRequest, chunks: [...perChunk.values()] }, outs };
}

/**
 * How far `next` is from `prev` along axis 0 when it is the same band of the same box moved along it within the
 * same chunks (the next layer of a stacked array whose chunks span its layers): then prev's walkers, re-based,
 * are next's. Undefined otherwise.
 */
function layerShift(prev: BandRequest, next: BandRequest): number | undefined {
  const a = prev.t;
  const b = next.t;
  const r = a.origin.length;
  if (a.array !== b.array || r < 2 || prev.u0 !== next.u0 || prev.u1 !== next.u1 || a.bandDim !== b.bandDim) return undefined;
  for (let d = 0; d < r; d++) {
    if (a.extent[d] !== b.extent[d] || a.outStrides[d] !== b.outStrides[d]) return undefined;
    if (d > 0 && a.origin[d] !== b.origin[d]) return undefined;
  }
  if (a.perm !== b.perm && (a.perm === undefined || b.perm === undefined || a.perm.some((x, i) => x !== b.perm?.[i]))) return undefined;
  const c = a.array.meta.chunkShape[0] as number;
  const e = a.extent[0] as number;
  const chunk = (o: number) => Math.floor(o / c);
  const o0 = a.origin[0] as number;
  const o1 = b.origin[0] as number;
  // Each box within one chunk along axis 0, the same one: the walkers' chunks are the same.
  if (chunk(o0) !== chunk(o0 + e - 1) || chunk(o1) !== chunk(o1 + e - 1) || chunk(o0) !== chunk(o1)) return undefined;
  return o1 - o0;
}

/**
 * A producer's passes kept from one to the next: when a pass is the previous one a layer on (layerShift), its
 * walkers are re-based and its chunks' cursors kept, instead of a walker, a map entry and two keys made per chunk,
 * layer and band. For uncapped cursors only (the spill's), which close no chunk before closeAll: a capped set
 * may close and forget a cursor between passes.
 */
export class PassReuse {
  /** The latest passes, newest last: a layer's passes (fused QKV's q, k and v: three) come round again the next layer. */
  private readonly recent: Pass[] = [];
  /** Passes made by re-basing an earlier one's walkers. */
  rebased = 0;

  pass(requests: readonly BandRequest[], dtype: SafetensorsDtype): MadePass {
    for (let k = this.recent.length - 1; k >= 0; k--) {
      const last = this.recent[k] as Pass;
      const delta = last.dtype === dtype ? shiftOfPass(last.requests, requests) : undefined;
      if (delta === undefined) continue;
      const outs = last.lengths.map((n) => (dtype === "BF16" ? new Uint16Array(n) : new Uint32Array(n)));
      for (const [i, walkers] of last.byRequest.entries()) for (const w of walkers) w.rebase(delta, outs[i] as Uint16Array | Uint32Array);
      const pass = { ...last, requests };
      this.recent.splice(k, 1);
      this.recent.push(pass);
      this.rebased++;
      return { pass, outs };
    }
    const made = buildPass(requests, dtype);
    this.recent.push(made.pass);
    if (this.recent.length > RECENT_PASSES) this.recent.shift();
    return made;
  }
}

const RECENT_PASSES = 8;

/** The one shift along axis 0 that makes every request of `prev` the same one of `next` (layerShift), if any. */
function shiftOfPass(prev: readonly BandRequest[], next: readonly BandRequest[]): number | undefined {
  if (prev.length !== next.length) return undefined;
  let delta: number | undefined;
  for (let i = 0; i < next.length; i++) {
    const s = layerShift(prev[i] as BandRequest, next[i] as BandRequest);
    if (s === undefined || (delta !== undefined && s !== delta)) return undefined;
    delta = s;
  }
  return delta;
}

/**
 * The bytes of each requested band as `dtype`, made in one reading: every chunk a band's box covers is fed
 * through its cursor once, with the walkers of every band that needs it (q, k and v of a grouped QKV layer
 * share their chunks' rows), all chunks at once (their reads overlap). With `reuse` (uncapped cursors only), a
 * pass that is the previous one a layer on re-uses its walkers.
 */
export async function producePass(
  requests: readonly BandRequest[],
  dtype: SafetensorsDtype,
  cursors: Cursors,
  reuse?: PassReuse,
): Promise<Uint8Array[]> {
  const capped = Number.isFinite(cursors.maxOpen);
  const { pass, outs } = reuse !== undefined && !capped ? reuse.pass(requests, dtype) : buildPass(requests, dtype);
  const cursorOf = (c: PassChunk) => {
    if (capped || reuse === undefined) return cursors.get(c.array, c.index);
    c.cursor ??= cursors.get(c.array, c.index);
    return c.cursor;
  };
  // At most cursors.maxOpen chunks decoded at once, the cap kept before and after each. When the pass covers
  // more chunks than the cap, a quarter of it reads at once and the rest stay open for the next layer.
  const busy = new Set<ChunkCursor>();
  const atOnce = pass.chunks.length <= cursors.maxOpen ? pass.chunks.length : Math.max(1, Math.floor(cursors.maxOpen / 4));
  // Uncapped cursors (the spill's groups) have nothing to close: the open decoders are counted as they open and
  // end, not by a walk over every cursor after every chunk (a pass of 191 chunks made that 36,000 steps).
  let live = capped ? 0 : cursors.live();
  // Uncapped, chunks whose elements are decoded already are fed here and now (no promise, no closure: a
  // finely cut source's small chunks are decoded whole, then fed once a layer); only the others wait for
  // reads. Capped, every chunk takes its turn, so that the least recently used is the one closed.
  let reading: readonly PassChunk[] = pass.chunks;
  if (!capped) {
    const waiting: PassChunk[] = [];
    for (const c of pass.chunks) {
      const cursor = cursorOf(c);
      const wasLive = cursor.live;
      if (cursor.feedDecoded(c.walkers)) live += Number(cursor.live) - Number(wasLive);
      else waiting.push(c);
    }
    reading = waiting;
  }
  await forEachLimited(reading, atOnce, async (c) => {
    const cursor = cursorOf(c);
    const wasLive = cursor.live;
    // Room for this decoder before it opens: the cap holds while it reads, not only after.
    if (capped && !wasLive) cursors.trim(busy, 1);
    busy.add(cursor);
    try {
      await cursor.feed(c.walkers);
    } finally {
      busy.delete(cursor);
    }
    if (capped) cursors.trim(busy);
    else {
      live += Number(cursor.live) - Number(wasLive);
      cursors.peakOpen = Math.max(cursors.peakOpen, live);
    }
  });
  if (reuse !== undefined && !capped) for (const walkers of pass.byRequest) for (const w of walkers) w.release();
  return outs.map((out) => new Uint8Array(out.buffer));
}

/** The output buffer of band [u0, u1) of `t` and a walker for each chunk its box covers. */
function bandWalkers(t: OutputTensor, dtype: SafetensorsDtype, u0: number, u1: number) {
  const meta = t.array.meta;
  const r = meta.shape.length;
  const origin = t.origin.slice();
  const extent = t.extent.slice();
  origin[t.bandDim] = (origin[t.bandDim] as number) + u0;
  extent[t.bandDim] = u1 - u0;
  const numel = extent.reduce((a, b) => a * b, 1);
  const out = dtype === "BF16" ? new Uint16Array(numel) : new Uint32Array(numel);
  // A float32 array whose chunks the source casts as it decodes them (off this thread) is laid out as bfloat16.
  const source = meta.dtype.name === "bfloat16" || (dtype === "BF16" && t.array.castsToBf16 === true) ? "bf16" : "f32";
  // A literal, not a string built here: the copy loops compare the mode per run (consumeSingles: per element), and
  // a built string is compared character by character where literals compare as one pointer.
  const mode: Mode = source === "bf16" ? (dtype === "BF16" ? "bf16>bf16" : "bf16>f32") : dtype === "BF16" ? "f32>bf16" : "f32>f32";
  // The band's first output element: unit u0 of the band dimension.
  const outBase = -u0 * (t.outStrides[t.bandDim] as number);
  // Box-relative last coordinate -> output offset, over the whole box (a band keeps the last dimension's range
  // unless the band dimension is the last).
  const lastExtent = t.extent[r - 1] as number;
  const lastStride = t.outStrides[r - 1] as number;
  const lastOffsets = new Int32Array(lastExtent);
  for (let b = 0; b < lastExtent; b++) lastOffsets[b] = (t.perm === undefined ? b : (t.perm[b] as number)) * lastStride;
  const chunkShape = meta.chunkShape;
  const chunkStrides = new Array<number>(r);
  for (let d = r - 1, s = 1; d >= 0; d--) {
    chunkStrides[d] = s;
    s *= chunkShape[d] as number;
  }
  const grid = chunkGrid(meta);
  // The chunks the band's box covers, per dimension.
  const ranges = origin.map((o, d) => {
    const c = chunkShape[d] as number;
    return [Math.floor(o / c), Math.min(grid[d] as number, Math.ceil((o + (extent[d] as number)) / c))] as const;
  });
  const walkers: { index: number[]; walker: Walker }[] = [];
  const index = ranges.map(([a]) => a);
  for (;;) {
    // Sized up front: a walker per chunk and pass, and arrays grown by push take several times the room.
    const lo = new Array<number>(r);
    const hi = new Array<number>(r);
    const boxOffset = new Array<number>(r);
    for (let d = 0; d < r; d++) {
      const c0 = (index[d] as number) * (chunkShape[d] as number);
      const a = Math.max(origin[d] as number, c0);
      const b = Math.min((origin[d] as number) + (extent[d] as number), c0 + (chunkShape[d] as number));
      lo[d] = a - c0;
      hi[d] = b - c0;
      // chunk coordinate + boxOffset = box-relative coordinate (the tensor's box, not the band's).
      boxOffset[d] = c0 - (t.origin[d] as number);
    }
    walkers.push({
      index: index.slice(),
      walker: new Walker(chunkShape, chunkStrides, lo, hi, boxOffset, t.outStrides, lastOffsets, out, outBase, mode),
    });
    let d = r - 1;
    for (; d >= 0; d--) {
      index[d] = (index[d] as number) + 1;
      if ((index[d] as number) < (ranges[d]?.[1] as number)) break;
      index[d] = ranges[d]?.[0] as number;
    }
    if (d < 0) break;
  }
  return { out, walkers };
}

/** A piece of the output: band bytes of tensor `t` starting at band-dimension unit `u0`; `last` ends the tensor. */
export interface Produced {
  readonly t: OutputTensor;
  readonly u0: number;
  readonly bytes: Uint8Array;
  readonly last: boolean;
}

/**
 * The tensors' bytes in order, band by band (bands of at most `maxBand` bytes), each band's memory taken from
 * `budget` until the consumer asks for the next. Consecutive tensors of one pass (llama.ts) are made together
 * when they fit in one band together.
 */
export async function* produceInOrder(
  tensors: readonly OutputTensor[],
  dtype: SafetensorsDtype,
  maxBand: number,
  cursors: Cursors,
  budget?: Budget,
): AsyncGenerator<Produced> {
  for (let i = 0; i < tensors.length; ) {
    const first = tensors[i] as OutputTensor;
    let j = i + 1;
    while (first.pass !== undefined && j < tensors.length && tensors[j]?.pass === first.pass) j++;
    const group = tensors.slice(i, j);
    i = j;
    // The previous array's tensors all made (array-major order): its decoders go (a padded edge chunk's stays
    // open short of its end otherwise).
    const previous = tensors[i - group.length - 1];
    if (previous !== undefined && previous.array !== first.array) await cursors.closeArray(previous.array.path);
    const groupBytes = group.reduce((a, t) => a + outputBytes(t, dtype), 0);
    if (group.length > 1 && groupBytes <= maxBand) {
      const release = await budget?.acquire(groupBytes);
      try {
        const outs = await producePass(
          group.map((t) => ({ t, u0: 0, u1: t.extent[t.bandDim] as number })),
          dtype,
          cursors,
        );
        for (const [k, t] of group.entries()) yield { t, u0: 0, bytes: outs[k] as Uint8Array, last: true };
      } finally {
        release?.();
      }
      continue;
    }
    for (const t of group) {
      const all = bands(t, dtype, maxBand);
      for (const [k, [u0, u1]] of all.entries()) {
        const release = await budget?.acquire((outputBytes(t, dtype) * (u1 - u0)) / (t.extent[t.bandDim] as number));
        try {
          yield { t, u0, bytes: await produceBand(t, dtype, u0, u1, cursors), last: k === all.length - 1 };
        } finally {
          release?.();
        }
      }
    }
  }
}
