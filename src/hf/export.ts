import { assertNoOverlap } from "../convert/convert.js";
import { ConflictError, UsageError } from "../errors.js";
import { openStore } from "../store/open.js";
import type { Store } from "../store/store.js";
import { Budget } from "../util/budget.js";
import { type BuiltConfig, buildConfig, type ConfigFlags, configText } from "./config.js";
import { foreignFilesError, inspectDestination, removeInterruptedWrites } from "./destination.js";
import { type Dims, type OutputTensor, planExport, STACKED_PREFIX } from "./llama.js";
import { type ExportFile, makeRecord, RECORD_NAME, recordText } from "./record.js";
import { buildHeader, type SafetensorsDtype } from "./safetensors.js";
import { DEFAULT_MAX_SHARD_SIZE, INDEX_NAME, indexText, planShards, shardName } from "./shards.js";
import { type ExportSource, MAX_GCS_READ_WINDOW, openExportSource, READ_WINDOW, readWindow } from "./source.js";
import { planSpill, Spill, type SpillPlan } from "./spill.js";
import { bands, Cursors, outputBytes, produceInOrder } from "./stream.js";
import { chooseTokenizer, type TokenizerChoice } from "./vocabularies.js";

/**
 * `orbax2reg export-hf`: a fuji step as a Hugging Face Llama checkpoint. Refuses a tree that is not a fuji
 * decoder before writing anything; writes a small record of what it exports (RECORD_NAME), the shards (in
 * order, each atomically: a local file renamed into place, a GCS upload completed), the small files besides
 * (prepareExport's `files`: config.json, generation_config.json), and the index LAST: no index, no export.
 *
 * Resuming: a rerun of the same export (the record matches: same source bytes' locations, dtype, shard plan)
 * keeps every shard already there whose size and header are the planned ones, and writes the rest. A
 * different export in the way is replaced when it has no index yet; a committed one only with --force.
 *
 * The destination (destination.ts): files of another checkpoint there (weights, tokenizer or config files no
 * record names) are refused before anything is written, and removed with --force; what interrupted writes
 * left is removed by every run that goes on.
 */
export { RECORD_NAME };

export interface ExportOptions extends Omit<ConfigFlags, "dtype"> {
  readonly dtype?: "bfloat16" | "float32";
  readonly maxShardSize?: number;
  /** Bytes of output tensors held at once (all workers together). */
  readonly memoryBytes: number;
  readonly force?: boolean;
  /** --tokenizer: a file, none, or (undefined) the vocabulary's own. */
  readonly tokenizer?: TokenizerChoice;
  /** With a checkpoint root: this step instead of the latest (openExportSource). */
  readonly step?: number;
  readonly onPlan?: (plan: ExportSummaryPlan) => void;
  readonly onTensor?: (name: string, bytes: number) => void;
}

export interface ExportSummaryPlan {
  readonly tensors: number;
  readonly bytes: number;
  readonly names: readonly string[];
}

export interface ShardPlan {
  readonly name: string;
  readonly tensors: readonly OutputTensor[];
  readonly header: Uint8Array;
  readonly fileBytes: number;
}

export interface ExportResult {
  readonly source: { kind: ExportSource["kind"]; location: string; step: number | undefined; chosenBy?: string };
  readonly destination: string;
  readonly dims: Dims;
  readonly built: BuiltConfig;
  /** The tokenizer line (what it is, or what is missing and how to add it) and the files written for it. */
  readonly tokenizer: { readonly line: string; readonly files: readonly string[] };
  readonly dtype: "bfloat16" | "float32";
  readonly shards: readonly { name: string; tensors: number; bytes: number; written: boolean }[];
  readonly tensors: number;
  readonly totalSize: number;
  readonly skipped: readonly string[];
  readonly alreadyExported: boolean;
  readonly resumed: boolean;
  /** Chunks decoded more than once (bands of tensors over --memory, or shards starting past a chunk's start). */
  readonly chunkRereads: number;
  /** Chunk decoders open at once at most (the cap, and as seen), about what they hold, and how many the array order wants open. */
  readonly openDecoders: number;
  readonly decodersNeeded: number;
  readonly decoderBytes: number;
  readonly peakOpenDecoders: number;
  /** Arrays made through the spill of chunk groups (spill.ts): more chunks per layer than --memory keeps open. */
  readonly spilledArrays: number;
  /** When chunks were decoded more than once for lack of --memory: the --memory that would decode each once. */
  readonly memoryWithoutRereads?: number;
}

/**
 * What one open chunk decoder holds, measured: zstd's window (512 KiB for TensorStore's level-1 frames) and
 * buffers, a read window ahead and a decoded piece, and the garbage they leave until it is collected; 120
 * decoders opened on the 2 GB fuji step's stacked weights took RSS from 60 to 208 MiB (1.23 MiB each), and on
 * its params cut 256 ways (bench/gen_fuji_cut.py) 190 decoders gave a peak RSS of 497 MiB, 238 gave 589 MiB
 * (1.9 MiB each at the margin), 256 gave 605 MiB: counted at 1.75 MiB, the default --memory keeps the peak
 * under 512 MiB.
 */
export const DECODER_BYTES = 1.75 * 2 ** 20;

/** What one open decoder holds reading `window` at a time: that window and the one fetched ahead. */
export function decoderBytes(window: number): number {
  return DECODER_BYTES + 2 * (window - READ_WINDOW);
}

/**
 * The read window of each of `decoders` open chunk decoders over `location`. Over GCS every read is a round trip
 * of tens of ms: when few decoders are open (a save on few devices cuts a weight in few chunks) their windows
 * grow, up to 4 MiB, while they take at most a quarter of `memoryBytes` (a quarter: a window's bytes are held
 * again while a read joins its pieces, and until the garbage collector frees them); many open decoders (fuji's
 * fsdp=256 meshes) keep the 1 MiB one. A local disk's is always its own. On the 2 GB fuji step from gs:// at 30 ms
 * a request, 8 decoders: 4 MiB windows, 197 requests instead of 691, 5.0-5.4 s instead of 6.9 s, peak RSS 288 MiB
 * instead of 172 (8 MiB windows: no faster, 370 MiB).
 */
export function exportWindow(location: string, decoders: number, memoryBytes: number): number {
  const base = readWindow(location);
  if (base === READ_WINDOW) return base;
  for (let w = MAX_GCS_READ_WINDOW; w > base; w /= 2) if (decoders * decoderBytes(w) <= memoryBytes / 4) return w;
  return base;
}

/** What --memory keeps for the bands of output tensors however many decoders are open. */
export const MIN_BAND_BYTES = 16 * 2 ** 20;

/**
 * How --memory is shared between the open chunk decoders and the bands of output tensors. Both shortfalls cost
 * re-decoding from a chunk's start (a zstd stream cannot go back): a stacked tensor made in k bands decodes
 * every chunk of its layer k-1 extra times, while capping the decoders at a fraction f of those wanted re-decodes
 * only the (1-f) closed ones. So bands first get the largest stacked tensor whole (or as few bands as fit), the
 * decoders the rest, choosing the split that re-decodes least (at least 8 decoders, bands at least 1 MiB).
 * A stacked array this plan cannot make with all its chunks open and its layer's tensors whole does not take
 * these shortfalls: it goes through the spill (spill.ts, planSpill), every chunk decoded once.
 */
export function memoryPlan(
  decoders: number,
  memoryBytes: number,
  largestBytes = 0,
  perDecoder = DECODER_BYTES,
): { maxOpen: number; maxBand: number } {
  const openWith = (band: number) => Math.max(8, Math.min(decoders, Math.floor((memoryBytes - band) / perDecoder)));
  // Extra decodes of one layer's chunks, in whole passes: bands beyond the first, plus the closed decoders' share.
  const cost = (band: number) => Math.ceil(largestBytes / band) - 1 + (1 - openWith(band) / decoders);
  let best = Math.max(MIN_BAND_BYTES, memoryBytes - decoders * perDecoder);
  for (let k = 1; k <= 64 && largestBytes > 0; k++) {
    const band = Math.ceil(largestBytes / k);
    if (band < 1 << 20 || band > memoryBytes - 8 * perDecoder) continue;
    if (cost(band) < cost(best) || (cost(band) === cost(best) && band < best)) best = band;
  }
  const maxOpen = openWith(best);
  return { maxOpen, maxBand: Math.max(1 << 20, memoryBytes - Math.min(decoders, maxOpen) * perDecoder) };
}

/** The largest output tensor of a stacked array (the ones a band re-decodes), in the export's dtype. */
export function largestStacked(tensors: readonly OutputTensor[], dtype: SafetensorsDtype): number {
  let most = 0;
  for (const t of tensors) if (t.array.path.startsWith(STACKED_PREFIX)) most = Math.max(most, outputBytes(t, dtype));
  return most;
}

/**
 * export-hf's default --memory: with what a process needs besides (about 170 MiB: the runtime, zstd, the
 * writer) the peak RSS stays under 512 MiB. 182 decoders fit beside 16 MiB of bands: a source cut finer (fuji.py's
 * fsdp=256 meshes cut a layer weight in 256, the 70B's fsdp=-1 on 1,024 chips in 1,024) goes through the spill
 * in groups of about 190 chunks.
 */
export const DEFAULT_EXPORT_MEMORY = 336 * 2 ** 20;

/** The least --memory export-hf takes: 8 decoders (memoryPlan keeps at least 8) and the smallest bands. */
export const MIN_EXPORT_MEMORY = 8 * DECODER_BYTES + MIN_BAND_BYTES;

/**
 * The chunk decoders open at once: tensors come array by array, and a stacked array's chunks stay open from
 * its first layer to its last (each spans every layer), so the most chunks one layer of one array covers.
 * Other arrays are read through within one tensor (at most as many at once as the cap allows).
 */
export function openDecoders(tensors: readonly OutputTensor[]): number {
  let most = 1;
  for (const t of tensors) {
    if (!t.array.path.startsWith(STACKED_PREFIX)) continue;
    const m = t.array.meta;
    most = Math.max(
      most,
      m.shape.reduce((n, s, d) => (d === 0 ? n : n * Math.ceil(s / (m.chunkShape[d] as number))), 1),
    );
  }
  return most;
}

const text = new TextEncoder();

/** Everything the export will write, decided before anything is written (and before any refusal can come late). */
export async function prepareExport(sourceLocation: string, options: ExportOptions) {
  const source = await openExportSource(sourceLocation, options.step === undefined ? {} : { step: options.step });
  const plan = planExport(source.arrays, source.otherLeaves);
  const dtype = options.dtype ?? "bfloat16";
  // Chosen (and a given file read and checked) before anything is written: its ids go into config.json.
  const tokenizer = await chooseTokenizer(options.tokenizer, plan.dims.vocab);
  const built = buildConfig(plan.dims, { ...options, dtype }, tokenizer.ids);
  const st: SafetensorsDtype = dtype === "bfloat16" ? "BF16" : "F32";
  const sizes = plan.tensors.map((t) => outputBytes(t, st));
  // Tensors of one pass stay in one shard (made together, they are written together).
  const units: number[][] = [];
  plan.tensors.forEach((t, k) => {
    const last = units.at(-1);
    if (last !== undefined && t.pass !== undefined && plan.tensors[last[0] as number]?.pass === t.pass) last.push(k);
    else units.push([k]);
  });
  const groups = planShards(
    units.map((u) => u.reduce((a, k) => a + (sizes[k] as number), 0)),
    options.maxShardSize ?? DEFAULT_MAX_SHARD_SIZE,
  ).map((us) => us.flatMap((u) => units[u] as number[]));
  const shards: ShardPlan[] = groups.map((ids, i) => {
    const tensors = ids.map((k) => plan.tensors[k] as OutputTensor);
    const layout = buildHeader(tensors.map((t) => ({ name: t.name, dtype: st, shape: t.shape })));
    return { name: shardName(i, groups.length), tensors, header: layout.header, fileBytes: layout.fileBytes };
  });
  const totalSize = sizes.reduce((a, b) => a + b, 0);
  const weightMap = new Map<string, string>();
  for (const s of shards) for (const t of s.tensors) weightMap.set(t.name, s.name);
  // The small files besides the shards, in the order written (any added before the record is made below); the
  // record names each with its sha256, so that a rerun knows them for its own and `verify` checks them.
  const files: ExportFile[] = [
    { name: "config.json", bytes: text.encode(configText(built.config)) },
    { name: "generation_config.json", bytes: text.encode(configText(built.generation)) },
    ...(tokenizer.tokenizer?.files(built.config.max_position_embeddings as number) ?? []),
  ];
  const record = makeRecord(
    { source: { kind: source.kind, step: source.step ?? null, fingerprint: source.fingerprint }, dtype, config: built.config },
    shards,
    files,
  );
  return { source, plan, dtype, st, built, tokenizer, shards, totalSize, weightMap, files, record };
}

export async function exportHf(sourceLocation: string, destLocation: string, options: ExportOptions): Promise<ExportResult> {
  if (options.memoryBytes < MIN_EXPORT_MEMORY)
    throw new UsageError(
      `--memory ${(options.memoryBytes / 2 ** 20).toFixed(1)} MiB is below the ${MIN_EXPORT_MEMORY / 2 ** 20} MiB export-hf needs at least (8 chunk decoders of ${DECODER_BYTES / 2 ** 20} MiB and ${MIN_BAND_BYTES / 2 ** 20} MiB of output tensors)`,
    );
  const p = await prepareExport(sourceLocation, options);
  const dest = await openStore(destLocation);
  await assertNoOverlap(p.source.location, dest.url);
  const wanted = recordText(p.record);
  const previous = await readText(dest, RECORD_NAME);
  const committed = (await dest.stat(INDEX_NAME)) !== undefined;
  const same = previous === wanted;
  const at = await inspectDestination(dest, previous);
  if (at.foreign.length > 0 && !options.force) throw foreignFilesError(dest, at.foreign);
  if (committed && !same && !options.force) {
    throw new ConflictError(
      `holds another export (${INDEX_NAME} is there and ${RECORD_NAME} ${previous === undefined ? "is missing" : "differs"}); --force replaces it`,
      {
        path: dest.url,
      },
    );
  }
  // Announced once nothing can refuse the destination: a refusal is then the only line printed.
  options.onPlan?.({ tensors: p.plan.tensors.length, bytes: p.totalSize, names: p.plan.tensors.map((t) => t.name) });
  const summary = (written: Set<string>, already: boolean, rereads: number, peak: number): ExportResult => ({
    source: {
      kind: p.source.kind,
      location: p.source.location,
      step: p.source.step,
      ...(p.source.chosenBy === undefined ? {} : { chosenBy: p.source.chosenBy }),
    },
    destination: dest.url,
    dims: p.plan.dims,
    built: p.built,
    tokenizer: { line: p.tokenizer.line, files: p.tokenizer.tokenizer?.names ?? [] },
    dtype: p.dtype,
    shards: p.shards.map((s) => ({ name: s.name, tensors: s.tensors.length, bytes: s.fileBytes, written: written.has(s.name) })),
    tensors: p.plan.tensors.length,
    totalSize: p.totalSize,
    skipped: p.plan.skipped,
    alreadyExported: already,
    resumed: same && !already,
    chunkRereads: rereads,
    openDecoders: Math.max(Math.min(decoders, memory.maxOpen), ...spillPlan.groupSize.values()),
    decodersNeeded: decoders,
    decoderBytes: Math.max(Math.min(decoders, memory.maxOpen), ...spillPlan.groupSize.values()) * decoderBytes(window),
    peakOpenDecoders: peak,
    spilledArrays: spillPlan.groupSize.size,
    ...(rereads > 0 && spillPlan.memoryWithoutRereads !== undefined ? { memoryWithoutRereads: spillPlan.memoryWithoutRereads } : {}),
  });
  const decoders = openDecoders(p.plan.tensors);
  const window = exportWindow(p.source.location, decoders, options.memoryBytes);
  const memory = memoryPlan(decoders, options.memoryBytes, largestStacked(p.plan.tensors, p.st), decoderBytes(window));
  // Arrays cut in more chunks per layer than the plan keeps open (or with a layer's tensor over its bands) go
  // through the spill of chunk groups, each chunk decoded once; the scratch writer's buffer is counted.
  const scratchBuffer = Math.min(dest.writeBuffer ?? 0, 8 * 2 ** 20);
  const spillPlan = planSpill(p.plan.tensors, p.st, options.memoryBytes, memory, decoderBytes(window), scratchBuffer);
  // Shards already in place: a matching record, the planned size and the planned header.
  const done = new Set<string>();
  if (same) {
    for (const s of p.shards) if (await shardInPlace(dest, s)) done.add(s.name);
    const filesInPlace = p.files.every((f) => at.recorded.includes(f.name));
    if (committed && done.size === p.shards.length && filesInPlace && at.foreign.length === 0) {
      await removeInterruptedWrites(dest);
      for (const s of p.shards) options.onTensor?.(s.name, s.fileBytes);
      return summary(new Set(), true, 0, 0);
    }
  }
  // Uncommit before changing anything; clear what is not this export's (another checkpoint's files, only with
  // --force; another export's, all of them: a shard of its with a planned name and header may hold other
  // bytes), then say what is being written.
  if (committed) await dest.delete(INDEX_NAME);
  await removeInterruptedWrites(dest);
  for (const name of at.foreign) await dest.delete(name);
  if (!same) {
    for (const name of at.recorded) await dest.delete(name);
    await dest.write(RECORD_NAME, text.encode(wanted));
  }
  // --memory is shared: the open chunk decoders first (up to all but 16 MiB of it; past that they are capped
  // and chunks re-read), the output tensors' bands the rest.
  const { maxOpen, maxBand } = memory;
  const budget = new Budget(maxBand);
  // One producer, shards in order, sharing one set of cursors: tensors come array by array, each array's in
  // layer order, so every chunk is decoded once across all shards, with one array's decoders open at a time.
  // Decoding and the layout's copy are this thread's work (CPU-bound: zstd-napi decodes synchronously on this
  // thread), so shards made at once in this process would not decode faster, and a shard starting within an
  // array would decode that array's earlier layers again to reach its own; what runs in parallel is the reading
  // ahead, the decoding and the writing of each shard (a local file's writes and flushes, a GCS upload).
  const cursors = new Cursors(maxOpen, window);
  const spill = new Spill(dest, p.st, window, scratchBuffer);
  const producer: Producer = { dtype: p.st, maxBand, budget, cursors, spill, plan: spillPlan, ...todo(p.shards, done) };
  const written = new Set<string>();
  // Scratch objects an interrupted export left (whether or not this one spills) go before anything is made.
  await Spill.removeAll(dest);
  try {
    for (const s of p.shards) {
      if (done.has(s.name)) {
        for (const t of s.tensors) options.onTensor?.(t.name, outputBytes(t, p.st));
        continue;
      }
      await dest.write(s.name, shardBytes(s, producer, options.onTensor));
      written.add(s.name);
    }
  } finally {
    await cursors.closeAll();
    if (spillPlan.groupSize.size > 0) await Spill.removeAll(dest);
  }
  const rereads = cursors.reopened + spill.reopened;
  for (const f of p.files) await dest.write(f.name, f.bytes);
  await dest.makeDurable?.("");
  await dest.write(INDEX_NAME, text.encode(indexText(p.totalSize, p.weightMap)));
  await dest.makeDurable?.(INDEX_NAME);
  await dest.flushed?.();
  return summary(written, false, rereads, Math.max(cursors.peakOpen, spill.peakOpen));
}

/** What makes the shards' tensors: the streaming engine's cursors, and the spill for the arrays it holds. */
interface Producer {
  readonly dtype: SafetensorsDtype;
  readonly maxBand: number;
  readonly budget: Budget;
  readonly cursors: Cursors;
  readonly spill: Spill;
  readonly plan: SpillPlan;
  /** The tensors still to write, by array (what a spill makes), and how many of each are left. */
  readonly needed: ReadonlyMap<OutputTensor["array"], OutputTensor[]>;
  readonly left: Map<OutputTensor["array"], number>;
}

function todo(shards: readonly ShardPlan[], done: ReadonlySet<string>) {
  const needed = new Map<OutputTensor["array"], OutputTensor[]>();
  for (const s of shards) {
    if (done.has(s.name)) continue;
    for (const t of s.tensors) needed.set(t.array, [...(needed.get(t.array) ?? []), t]);
  }
  return { needed, left: new Map([...needed].map(([a, ts]) => [a, ts.length])) };
}

/**
 * A shard's bytes: its header, then each tensor band by band: streamed (produceInOrder), or, for an array the
 * spill holds, put together from its groups' sub-blocks (spilled when its first tensor comes).
 */
async function* shardBytes(s: ShardPlan, p: Producer, onTensor?: (name: string, bytes: number) => void): AsyncIterable<Uint8Array> {
  yield s.header;
  for (let i = 0; i < s.tensors.length; ) {
    const t = s.tensors[i] as OutputTensor;
    const k = p.plan.groupSize.get(t.array.path);
    if (k === undefined) {
      let j = i + 1;
      while (j < s.tensors.length && !p.plan.groupSize.has((s.tensors[j] as OutputTensor).array.path)) j++;
      for await (const piece of produceInOrder(s.tensors.slice(i, j), p.dtype, p.maxBand, p.cursors, p.budget)) {
        yield piece.bytes;
        if (piece.last) onTensor?.(piece.t.name, outputBytes(piece.t, p.dtype));
      }
      i = j;
      continue;
    }
    if (!p.spill.has(t.array)) {
      // The arrays before it are made (array-major order): their decoders go before the groups' open.
      await p.cursors.closeAll();
      await p.spill.spill(t.array, p.needed.get(t.array) ?? [], k);
    }
    for (const [u0, u1] of bands(t, p.dtype, p.maxBand)) {
      const release = await p.budget.acquire((outputBytes(t, p.dtype) * (u1 - u0)) / (t.extent[t.bandDim] as number));
      try {
        yield await p.spill.band(t, u0, u1);
      } finally {
        release();
      }
    }
    onTensor?.(t.name, outputBytes(t, p.dtype));
    const left = (p.left.get(t.array) ?? 1) - 1;
    p.left.set(t.array, left);
    if (left === 0) await p.spill.done(t.array);
    i++;
  }
}

async function readText(store: Store, key: string): Promise<string | undefined> {
  if ((await store.stat(key)) === undefined) return undefined;
  return new TextDecoder().decode(await store.read(key));
}

async function shardInPlace(dest: Store, s: ShardPlan): Promise<boolean> {
  const info = await dest.stat(s.name);
  if (info === undefined || info.size !== s.fileBytes) return false;
  const head = await dest.readRange(s.name, 0, s.header.length);
  return Buffer.compare(head, s.header) === 0;
}
