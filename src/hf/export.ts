import { assertNoOverlap } from "../convert/convert.js";
import { ConflictError, NotFoundError, UsageError } from "../errors.js";
import { openStore } from "../store/open.js";
import { describe, type Store } from "../store/store.js";
import { Budget } from "../util/budget.js";
import { type BuiltConfig, buildConfig, type ConfigFlags, configText } from "./config.js";
import { foreignFilesError, inspectDestination, removeInterruptedWrites } from "./destination.js";
import { type Dims, type OutputTensor, planExport, STACKED_PREFIX } from "./llama.js";
import { type ExportFile, makeRecord, RECORD_NAME, recordText, sha256 } from "./record.js";
import { buildHeader, type SafetensorsDtype } from "./safetensors.js";
import { DEFAULT_MAX_SHARD_SIZE, INDEX_NAME, indexText, planShards, planTaskRuns, shardName } from "./shards.js";
import { type ExportSource, MAX_GCS_READ_WINDOW, openExportSource, READ_WINDOW, readWindow } from "./source.js";
import { chunkCost, planSpill, SPILL_PREFIX, Spill, type SpillPlan } from "./spill.js";
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
 *
 * Shared among processes (issue 45: the pipeline's tasks, or `export-hf --begin/--task-index/--finalize`):
 * beginExport does the above up to the record and plans runs of shards, exportShards writes one run (any
 * order, at once, in any process), finalizeExport checks every shard and writes the small files and the index.
 * exportHf is the three in one process: one code path, the same bytes.
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

/** One task of a fanned-out export: whole shards (a contiguous run of them, by name) and their bytes. */
export interface ExportTask {
  readonly index: number;
  readonly shards: readonly string[];
  readonly bytes: number;
}

export interface BeganExport {
  readonly tasks: readonly ExportTask[];
  readonly shards: number;
  readonly totalSize: number;
  readonly alreadyExported: boolean;
}

export interface ShardsWritten {
  /** Shards this call wrote, and those it found in place (planned size and header) and kept. */
  readonly written: string[];
  readonly kept: string[];
  /** Bytes of the shards written. */
  readonly bytes: number;
  /**
   * Chunks decoded more than once: for lack of --memory, and the chunks of the array this call's first shard
   * starts inside, whose earlier layers are decoded again to reach it (another task makes those layers).
   */
  readonly chunkRereads: number;
}

/** An export opened at a destination: its plan, the store, the record it writes and the one there. */
type Opened = Awaited<ReturnType<typeof prepareExport>> & {
  readonly dest: Store;
  readonly wanted: string;
  readonly previous: string | undefined;
};

async function openExport(sourceLocation: string, destLocation: string, options: ExportOptions): Promise<Opened> {
  if (options.memoryBytes < MIN_EXPORT_MEMORY)
    throw new UsageError(
      `--memory ${(options.memoryBytes / 2 ** 20).toFixed(1)} MiB is below the ${MIN_EXPORT_MEMORY / 2 ** 20} MiB export-hf needs at least (8 chunk decoders of ${DECODER_BYTES / 2 ** 20} MiB and ${MIN_BAND_BYTES / 2 ** 20} MiB of output tensors)`,
    );
  const p = await prepareExport(sourceLocation, options);
  const dest = await openStore(destLocation);
  await assertNoOverlap(p.source.location, dest.url);
  return { ...p, dest, wanted: recordText(p.record), previous: await readText(dest, RECORD_NAME) };
}

/**
 * The first step of an export shared by many processes (and of export-hf's own): checks the source and the
 * destination (another checkpoint's files refused, another committed export replaced only with --force),
 * uncommits, clears what is not this export's, writes the record, and plans at most `tasks` runs of whole
 * shards (taskRuns: fewer when more would not finish sooner). A rerun of the same export keeps its shards; one
 * already committed is reported as such.
 */
export async function beginExport(
  sourceLocation: string,
  destLocation: string,
  options: ExportOptions & { readonly tasks: number },
): Promise<BeganExport> {
  const b = await begin(await openExport(sourceLocation, destLocation, options), options);
  return { tasks: b.tasks, shards: b.shards, totalSize: b.totalSize, alreadyExported: b.alreadyExported };
}

async function begin(o: Opened, options: ExportOptions & { readonly tasks: number }) {
  const { dest } = o;
  const committed = (await dest.stat(INDEX_NAME)) !== undefined;
  const same = o.previous === o.wanted;
  const at = await inspectDestination(dest, o.previous);
  if (at.foreign.length > 0 && !options.force) throw foreignFilesError(dest, at.foreign);
  if (committed && !same && !options.force) {
    throw new ConflictError(
      `holds another export (${INDEX_NAME} is there and ${RECORD_NAME} ${o.previous === undefined ? "is missing" : "differs"}); --force replaces it`,
      { path: dest.url },
    );
  }
  // Announced once nothing can refuse the destination: a refusal is then the only line printed.
  options.onPlan?.({ tensors: o.plan.tensors.length, bytes: o.totalSize, names: o.plan.tensors.map((t) => t.name) });
  const tasks = taskRuns(o.shards, options.tasks, o.st);
  const began = { tasks, shards: o.shards.length, totalSize: o.totalSize, resumed: same, alreadyExported: false };
  if (same && committed && at.foreign.length === 0 && o.files.every((f) => at.recorded.includes(f.name))) {
    let all = true;
    for (const s of o.shards) if (!(await shardInPlace(dest, s))) all = false;
    if (all) {
      await removeInterruptedWrites(dest);
      return { ...began, resumed: false, alreadyExported: true };
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
    await dest.write(RECORD_NAME, text.encode(o.wanted));
  }
  // Scratch objects an interrupted export left go before any task makes its own.
  await Spill.removeAll(dest);
  return began;
}

/**
 * What decoding a byte again (to reach a task's first layer) costs beside making one: the source's bytes are read
 * and decoded, not cast or copied. Measured on the 2 GB fuji step's 4-task fan-out (bench/export-hf-fanout.mjs):
 * tasks starting inside an array after 58-80 MB of its output took 0.6-1.2 s more CPU than the first task, which
 * made 96 MB in 2.9 s: 0.35-0.6 of a made byte. Over a slow link the bytes read count in full: 0.5 between.
 */
export const REDECODE_WEIGHT = 0.5;

/**
 * Shards in at most `n` contiguous runs balanced by work (planTaskRuns): a run's bytes, and for a run starting
 * inside a stacked array, that array's earlier tensors, which its task decodes again to reach its first
 * (REDECODE_WEIGHT of their output bytes).
 */
function taskRuns(shards: readonly ShardPlan[], n: number, dtype: SafetensorsDtype): ExportTask[] {
  const prefix = shards.map((s, i) => {
    const first = s.tensors[0];
    if (i === 0 || first === undefined || !first.array.path.startsWith(STACKED_PREFIX)) return 0;
    let bytes = 0;
    for (const earlier of shards.slice(0, i)) for (const t of earlier.tensors) if (t.array === first.array) bytes += outputBytes(t, dtype);
    return Math.round(REDECODE_WEIGHT * bytes);
  });
  const starts = planTaskRuns(
    shards.map((s) => s.fileBytes),
    n,
    prefix,
  );
  return starts.map((from, index) => {
    const run = shards.slice(from, starts[index + 1] ?? shards.length);
    return { index, shards: run.map((s) => s.name), bytes: run.reduce((a, s) => a + s.fileBytes, 0) };
  });
}

/**
 * The tasks beginExport plans, from the source alone (nothing read or written at the destination): what a
 * task that is given only its index and the task count writes (the plan depends on the options and the source).
 */
export async function planExportTasks(
  sourceLocation: string,
  options: ExportOptions & { readonly tasks: number },
): Promise<readonly ExportTask[]> {
  const p = await prepareExport(sourceLocation, options);
  return taskRuns(p.shards, options.tasks, p.st);
}

/** How --memory is shared for this export (the whole plan's, whichever shards a call makes). */
function memoryOf(o: Opened, options: ExportOptions) {
  const decoders = openDecoders(o.plan.tensors);
  const window = exportWindow(o.source.location, decoders, options.memoryBytes);
  const memory = memoryPlan(decoders, options.memoryBytes, largestStacked(o.plan.tensors, o.st), decoderBytes(window));
  // Arrays cut in more chunks per layer than the plan keeps open (or with a layer's tensor over its bands) go
  // through the spill of chunk groups, each chunk decoded once; the scratch writer's buffer is counted.
  const scratchBuffer = Math.min(o.dest.writeBuffer ?? 0, 8 * 2 ** 20);
  const spillPlan = planSpill(o.plan.tensors, o.st, options.memoryBytes, memory, decoderBytes(window), scratchBuffer);
  const open = Math.max(Math.min(decoders, memory.maxOpen), ...spillPlan.groupSize.values());
  // What the open chunks hold at most: the capped decoders, or a spilled array's group (a chunk decoded whole
  // costs its bytes, not a decoder: chunkCost).
  const per = decoderBytes(window);
  const arrays = new Map(o.plan.tensors.map((t) => [t.array.path, t.array]));
  const held = Math.max(
    Math.min(decoders, memory.maxOpen) * per,
    ...[...spillPlan.groupSize].map(([path, k]) => {
      const array = arrays.get(path);
      return array === undefined ? k * per : k * chunkCost(array, per);
    }),
  );
  return { decoders, window, memory, scratchBuffer, spillPlan, open, held };
}

/** The refusal of a call made for an export that is not (or no longer) the one begun at the destination. */
function notBegun(o: Opened, what: string): ConflictError {
  return new ConflictError(
    `${RECORD_NAME} ${o.previous === undefined ? "is missing: no export was begun here" : "is another export's: another export began here since"}; ${what} (begin the export first, with the same options)`,
    { path: o.dest.url },
  );
}

/**
 * Writes the given shards of a begun export (names from beginExport's tasks), skipping those in place; writes
 * no index. Refused (ConflictError) unless the record at the destination is this export's. Any number of calls
 * may run at once, in any processes, on disjoint shards: each writes its shards atomically and its scratch
 * objects under its own names. Bounded by options.memoryBytes as export-hf; stopped by `signal` between bands.
 */
export async function exportShards(
  sourceLocation: string,
  destLocation: string,
  options: ExportOptions & { readonly signal?: AbortSignal },
  shards: readonly string[],
): Promise<ShardsWritten> {
  const o = await openExport(sourceLocation, destLocation, options);
  if (o.previous !== o.wanted) throw notBegun(o, "its shards are not written");
  return (await writeShards(o, options, shards)).result;
}

async function writeShards(o: Opened, options: ExportOptions & { readonly signal?: AbortSignal }, names: readonly string[]) {
  const { dest } = o;
  const byName = new Map(o.shards.map((s) => [s.name, s]));
  for (const name of names)
    if (!byName.has(name))
      throw new UsageError(`${name} is not a shard of this export (${o.shards.length} shards planned)`, { path: dest.url });
  const wantedNames = new Set(names);
  const mine = o.shards.filter((s) => wantedNames.has(s.name));
  const m = memoryOf(o, options);
  // Shards already in place: the planned size and the planned header (the record is this export's).
  const done = new Set<string>();
  for (const s of mine) if (await shardInPlace(dest, s)) done.add(s.name);
  // Another task's writes in flight are never touched (removeInterruptedWrites takes a dead writer's only).
  await removeInterruptedWrites(dest);
  // --memory is shared: the open chunk decoders first (up to all but 16 MiB of it; past that they are capped
  // and chunks re-read), the output tensors' bands the rest.
  const { maxOpen, maxBand } = m.memory;
  const budget = new Budget(maxBand);
  // One producer, shards in order, sharing one set of cursors: tensors come array by array, each array's in
  // layer order, so every chunk is decoded once across the call's shards, with one array's decoders open at a
  // time. Decoding and the layout's copy are this thread's work (CPU-bound: zstd-napi decodes synchronously on
  // this thread), so shards made at once in this process would not decode faster, and a shard starting within
  // an array decodes that array's earlier layers again to reach its own (counted: Cursors.prefixRereads); what
  // runs in parallel is the reading ahead, the decoding and the writing of each shard, and other processes.
  const cursors = new Cursors(maxOpen, m.window);
  // Scratch objects under names of this call's shards: calls on other shards at once keep theirs.
  const scratch = spillPrefix(mine.map((s) => s.name));
  const spill = new Spill(dest, o.st, m.window, m.scratchBuffer, scratch);
  const signal = options.signal;
  const producer: Producer = { dtype: o.st, maxBand, budget, cursors, spill, plan: m.spillPlan, signal, ...todo(mine, done) };
  const written: string[] = [];
  let bytes = 0;
  // What an interrupted call on these shards left, before anything is made.
  await Spill.removeAll(dest, scratch);
  try {
    for (const s of mine) {
      if (done.has(s.name)) {
        for (const t of s.tensors) options.onTensor?.(t.name, outputBytes(t, o.st));
        continue;
      }
      signal?.throwIfAborted();
      await dest.write(s.name, shardBytes(s, producer, options.onTensor));
      written.push(s.name);
      bytes += s.fileBytes;
    }
  } finally {
    await cursors.closeAll();
    if (m.spillPlan.groupSize.size > 0) await Spill.removeAll(dest, scratch);
  }
  const reopened = cursors.reopened + spill.reopened;
  const result: ShardsWritten = {
    written,
    kept: mine.filter((s) => done.has(s.name)).map((s) => s.name),
    bytes,
    chunkRereads: reopened + cursors.prefixRereads + spill.prefixRereads,
  };
  return { result, reopened, peak: Math.max(cursors.peakOpen, spill.peakOpen), m };
}

/**
 * The last step: checks that every planned shard is in place (a missing or wrong one is a NotFoundError or
 * ConflictError naming it, not retryable: a task must write it again), writes config.json,
 * generation_config.json and the tokenizer's files, then the index LAST. Refused unless the record at the
 * destination is this export's.
 */
export async function finalizeExport(
  sourceLocation: string,
  destLocation: string,
  options: ExportOptions,
  hooks: FinalizeHooks = {},
): Promise<ExportResult> {
  const o = await openExport(sourceLocation, destLocation, options);
  if (o.previous !== o.wanted) throw notBegun(o, "nothing committed");
  const index = await readText(o.dest, INDEX_NAME);
  const at = index === undefined ? undefined : await inspectDestination(o.dest, o.previous);
  const already =
    index === indexText(o.totalSize, o.weightMap) &&
    at !== undefined &&
    at.foreign.length === 0 &&
    o.files.every((f) => at.recorded.includes(f.name));
  return finalize(o, options, { written: new Set(), rereads: 0, peak: 0, resumed: false, already }, hooks);
}

export interface FinalizeHooks {
  /**
   * Runs once every shard is checked, right before anything is written (the small files, then the index): the
   * pipeline's last look at its stop signal and `cloud cancel`'s marker. Throwing commits nothing.
   */
  readonly beforeCommit?: () => Promise<void>;
}

async function finalize(
  o: Opened,
  options: ExportOptions,
  run: { written: ReadonlySet<string>; rereads: number; peak: number; resumed: boolean; already: boolean },
  hooks: FinalizeHooks = {},
): Promise<ExportResult> {
  const { dest } = o;
  for (const s of o.shards) {
    const info = await dest.stat(s.name);
    if (info === undefined)
      throw new NotFoundError("shard missing: its task has not written it; nothing committed", {
        path: describe(dest, s.name),
      });
    if (!(await shardInPlace(dest, s)))
      throw new ConflictError(
        `shard not the planned one (${info.size} bytes, ${s.fileBytes} planned, or another header): its task must write it again; nothing committed`,
        { path: describe(dest, s.name) },
      );
  }
  if (!run.already) {
    // Between the shard checks and the first write: a cancel that came while the shards were checked still stops it.
    await hooks.beforeCommit?.();
    await removeInterruptedWrites(dest);
    // Every task is done: scratch objects any left go.
    await Spill.removeAll(dest);
    for (const f of o.files) await dest.write(f.name, f.bytes);
    await dest.makeDurable?.("");
    await dest.write(INDEX_NAME, text.encode(indexText(o.totalSize, o.weightMap)));
    await dest.makeDurable?.(INDEX_NAME);
    await dest.flushed?.();
  }
  const m = memoryOf(o, options);
  return {
    source: {
      kind: o.source.kind,
      location: o.source.location,
      step: o.source.step,
      ...(o.source.chosenBy === undefined ? {} : { chosenBy: o.source.chosenBy }),
    },
    destination: dest.url,
    dims: o.plan.dims,
    built: o.built,
    tokenizer: { line: o.tokenizer.line, files: o.tokenizer.tokenizer?.names ?? [] },
    dtype: o.dtype,
    shards: o.shards.map((s) => ({ name: s.name, tensors: s.tensors.length, bytes: s.fileBytes, written: run.written.has(s.name) })),
    tensors: o.plan.tensors.length,
    totalSize: o.totalSize,
    skipped: o.plan.skipped,
    alreadyExported: run.already,
    resumed: run.resumed,
    chunkRereads: run.rereads,
    openDecoders: m.open,
    decodersNeeded: m.decoders,
    decoderBytes: Math.round(m.held),
    peakOpenDecoders: run.peak,
    spilledArrays: m.spillPlan.groupSize.size,
    ...(run.rereads > 0 && m.spillPlan.memoryWithoutRereads !== undefined
      ? { memoryWithoutRereads: m.spillPlan.memoryWithoutRereads }
      : {}),
  };
}

/** export-hf: beginExport, every shard (exportShards) and finalizeExport in this process, the source opened once. */
export async function exportHf(sourceLocation: string, destLocation: string, options: ExportOptions): Promise<ExportResult> {
  const o = await openExport(sourceLocation, destLocation, options);
  const b = await begin(o, { ...options, tasks: 1 });
  if (b.alreadyExported) {
    for (const s of o.shards) options.onTensor?.(s.name, s.fileBytes);
    return finalize(o, options, { written: new Set(), rereads: 0, peak: 0, resumed: false, already: true });
  }
  const w = await writeShards(
    o,
    options,
    o.shards.map((s) => s.name),
  );
  // The memory warning counts the re-reads --memory forced; a resumed run's start inside an array is not one.
  return finalize(o, options, {
    written: new Set(w.result.written),
    rereads: w.reopened,
    peak: w.peak,
    resumed: b.resumed,
    already: false,
  });
}

/** The scratch objects' prefix of a call making `shards`: a run's own, so that calls at once never share one. */
function spillPrefix(shards: readonly string[]): string {
  return `${SPILL_PREFIX}${sha256(text.encode(shards.join("\n"))).slice(0, 12)}.`;
}

/** What makes the shards' tensors: the streaming engine's cursors, and the spill for the arrays it holds. */
interface Producer {
  readonly dtype: SafetensorsDtype;
  readonly maxBand: number;
  readonly budget: Budget;
  readonly cursors: Cursors;
  readonly spill: Spill;
  readonly plan: SpillPlan;
  readonly signal: AbortSignal | undefined;
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
        p.signal?.throwIfAborted();
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
        p.signal?.throwIfAborted();
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
