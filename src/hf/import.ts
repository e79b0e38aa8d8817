import { createHash } from "node:crypto";
import { WEIGHT_PARAMS } from "../codecs/zstd.js";
import { CompressPool, compressBound } from "../codecs/zstd-pool.js";
import { assertNoOverlap } from "../convert/convert.js";
import { ConflictError, MetadataError, UsageError } from "../errors.js";
import { arrayEntry, indexText } from "../regular/index-file.js";
import { regularChunkKey, zarrayText } from "../regular/zarray.js";
import { INPUT, openStore, parseLocation } from "../store/open.js";
import { describe, joinKey } from "../store/store.js";
import { Budget } from "../util/budget.js";
import { bf16Bits } from "../zarr/cast.js";
import { DTYPES, type DType } from "../zarr/dtype.js";
import { type HfCheckpoint, type HfTensor, openHfCheckpoint } from "./checkpoint.js";
import { type Dims, EMBEDDING, LAYER_ROWS, LM_HEAD, type MappingRow, OUTPUT_NORM, rotaryPermutation, STACKED_PREFIX } from "./llama.js";
import type { StoredDtype } from "./safetensors.js";

/**
 * `orbax2reg import-hf`: a Hugging Face LlamaForCausalLM checkpoint as an AXLearn regular checkpoint of the
 * fuji model with its dimensions (the export's mapping, llama.ts, read the other way). Everything is checked
 * before anything is written (checkLlamaConfig, checkTensors: what fuji cannot represent is refused, naming it); then every output
 * chunk is made from one ranged read of the source rows it needs and written as it is made: each source byte is
 * read once, and memory holds the chunks in flight (--memory), whatever the model's size.
 *
 * The step (`step_%08d`) holds what AXLearn's TensorStoreStateStorage writes for the model's leaves only
 * (gda/<leaf>/.zarray and its zstd chunks) and `index` LAST, its commit marker: no prng_key, no learner state, which
 * is what a fine-tuning trainer's ModelStateScopeConverter restores (it empties learner and prng_key before the
 * builder reads the step; the trainer initializes them: docs/cli.md, "import-hf"); the import's record
 * (.orbax2reg/import-hf.json) says which source and settings made it, so that a rerun keeps the chunks already
 * written (each written atomically) and a different import in the way is refused unless --force.
 */
export type ImportDtype = "float32" | "bfloat16";

/**
 * The import's record in the step's work directory (as convert's plan is): which source and settings made the step.
 * AXLearn's reader opens only gda/<leaf> and index, so it ignores it.
 */
export const RECORD_KEY = ".orbax2reg/import-hf.json";

/**
 * Largest output chunk, in bytes: a stacked array's chunk is one layer's tensor, or a range of its rows when the
 * layer's tensor is larger (Llama-7B's gate_proj is 11008 x 4096: 43 chunks a layer in float32, 22 in bfloat16).
 * Small enough that a chunk is read, made, compressed and written while it is still in the CPU's cache: with 16 MiB
 * chunks the kernel's copy of each frame into the page cache read it back from memory (the 2 GB benchmark's system
 * time 1.6-2.4 s -> 1.1-1.3 s at 4 MiB, bench/README.md). In bytes, not elements: a bfloat16 import cut at 1 Mi
 * elements made twice the files of 2 MiB, and creating them (ext4's inode allocation) took 10 % of its CPU.
 */
export const MAX_CHUNK_BYTES = 4 * 2 ** 20;

/** Default --memory: the chunks in flight, each two buffers of 4 MiB and a little (bufferBytes): 4 at once, with room. */
export const DEFAULT_IMPORT_MEMORY = 256 * 2 ** 20;

/**
 * Chunks made at once from a local source: enough to overlap one's read with another's conversion and write, and
 * few enough that a chunk is still in the CPU's cache from its read to its write (16 at once cost a local import of
 * the 2 GB benchmark 25 % more CPU). From gs:// every read waits a request's latency first, and 4 chunks in flight
 * left the CPUs idle: 16 took the benchmark's source behind 30 ms a request from 9.6 s to 6.7 s. --memory bounds
 * them either way. (Timing the reads to choose did not work: queued behind the writes on libuv's threads, a local
 * read waits as long as a remote one.)
 */
const IN_FLIGHT = { local: 4, gcs: 16 } as const;

export interface ImportOptions {
  readonly step?: number;
  readonly dtype?: ImportDtype;
  readonly memoryBytes?: number;
  readonly force?: boolean;
  /** The largest chunk in elements (default MAX_CHUNK_BYTES of the dtype): not a flag, tests cut arrays finer with it. */
  readonly maxChunkElements?: number;
  /** Threads compressing chunks (default zstd-pool.ts's poolSize(); 0: on the main thread). Not a flag. */
  readonly threads?: number;
  readonly onPlan?: (plan: ImportSummaryPlan) => void;
  readonly onChunk?: (array: string, bytes: number) => void;
}

export interface ImportSummaryPlan {
  readonly bytes: number;
  /** Each array's path and chunk count. */
  readonly chunksPerArray: ReadonlyMap<string, number>;
}

export interface ImportResult {
  readonly source: string;
  readonly destination: string;
  readonly stepDir: string;
  readonly step: number;
  readonly dims: Dims;
  readonly dtype: ImportDtype;
  readonly arrays: number;
  readonly chunks: number;
  readonly chunksWritten: number;
  readonly bytes: number;
  readonly alreadyImported: boolean;
  readonly resumed: boolean;
  /** config.json's rope_theta and rms_norm_eps, for the fuji config that restores it. */
  readonly ropeTheta: number;
  readonly rmsNormEps: number;
  readonly maxPositionEmbeddings: number | undefined;
}

// ---- What fuji can represent -------------------------------------------------------------------------------

/** A refusal of config.json's `key` (`path`: where config.json is, for the message). */
const refusal =
  (path: string) =>
  (key: string, why: string): never => {
    throw new MetadataError(why, { path, key });
  };

/**
 * The fuji dims of a Llama config.json, or a MetadataError naming the first setting fuji.model_config cannot
 * represent: biases, rope_scaling, a head_dim other than hidden/heads (fuji's per-head dim), an activation
 * other than SiLU (fuji's SwiGLU), an odd head_dim (no rotary pairs).
 */
export function checkLlamaConfig(c: Record<string, unknown>, path = "config.json"): Dims {
  const refuseConfig = refusal(path);
  if (c.model_type !== "llama") refuseConfig("model_type", `${JSON.stringify(c.model_type)} is not "llama"`);
  const int = (key: string, fallback?: number): number => {
    const v = c[key] ?? fallback;
    if (typeof v !== "number" || !Number.isSafeInteger(v) || v < 1)
      return refuseConfig(key, `${JSON.stringify(v)} is not a positive integer`);
    return v;
  };
  const hidden = int("hidden_size");
  const heads = int("num_attention_heads");
  const kvHeads = int("num_key_value_heads", heads);
  const layers = int("num_hidden_layers");
  const ffn = int("intermediate_size");
  const vocab = int("vocab_size");
  if (hidden % heads !== 0) refuseConfig("num_attention_heads", `${heads} does not divide hidden_size ${hidden}`);
  const headDim = hidden / heads;
  if (c.head_dim !== undefined && c.head_dim !== null && c.head_dim !== headDim)
    refuseConfig(
      "head_dim",
      `${JSON.stringify(c.head_dim)} differs from hidden_size / num_attention_heads = ${headDim}, fuji's per-head dim`,
    );
  if (headDim % 2 !== 0) refuseConfig("head_dim", `${headDim} is odd: no rotary pairs`);
  if (heads % kvHeads !== 0) refuseConfig("num_key_value_heads", `${kvHeads} does not divide num_attention_heads ${heads}`);
  if (c.attention_bias === true) refuseConfig("attention_bias", "true: fuji's attention has no biases");
  if (c.mlp_bias === true) refuseConfig("mlp_bias", "true: fuji's feed-forward layers have no biases");
  const act = c.hidden_act ?? "silu";
  if (act !== "silu") refuseConfig("hidden_act", `${JSON.stringify(act)}: fuji's feed-forward is SwiGLU (SiLU)`);
  ropeTheta(c, path);
  const tied = c.tie_word_embeddings === true; // LlamaConfig's default is False
  return { layers, hidden, heads, kvHeads, headDim, ffn, vocab, tied, qkv: kvHeads === heads ? "fused" : "grouped", stacked: true };
}

/**
 * rope_theta, from transformers 5's `rope_parameters` ({rope_type, rope_theta}) or 4's `rope_theta` beside
 * `rope_scaling`; a scaled rope (any rope_type but "default", any rope_scaling) or a partial rotary factor is
 * refused: fuji's rotary embeddings rotate every pair of every head by theta^(-2j/hd), unscaled.
 */
export function ropeTheta(c: Record<string, unknown>, path = "config.json"): number {
  const refuseConfig = refusal(path);
  const p = c.rope_parameters as Record<string, unknown> | null | undefined;
  const scaled = (key: string, kind: unknown) =>
    refuseConfig(
      key,
      `${JSON.stringify(kind)}: fuji's rotary embeddings have no scaling (Llama 3.1's "llama3" lowers every rotation's low frequencies), so the model would compute otherwise`,
    );
  if (c.rope_scaling !== undefined && c.rope_scaling !== null) {
    const r = c.rope_scaling as { rope_type?: unknown; type?: unknown };
    scaled("rope_scaling", r.rope_type ?? r.type ?? r);
  }
  if (p !== undefined && p !== null) {
    if ((p.rope_type ?? "default") !== "default") scaled("rope_parameters.rope_type", p.rope_type);
    if (p.partial_rotary_factor !== undefined && p.partial_rotary_factor !== 1)
      refuseConfig(
        "rope_parameters.partial_rotary_factor",
        `${JSON.stringify(p.partial_rotary_factor)}: fuji rotates every pair of a head`,
      );
  }
  const theta = p?.rope_theta ?? c.rope_theta ?? 10000; // LlamaConfig's default
  if (typeof theta !== "number" || !(theta > 0)) return refuseConfig("rope_theta", `${JSON.stringify(theta)} is not a positive number`);
  return theta;
}

/** The tensors a Llama of `d` has, with their shapes (HF's [out, in]). */
export function expectedTensors(d: Dims): Map<string, readonly number[]> {
  const out = new Map<string, readonly number[]>();
  out.set(EMBEDDING.hf[0] as string, [d.vocab, d.hidden]);
  for (let i = 0; i < d.layers; i++)
    for (const row of LAYER_ROWS) for (const [j, name] of row.hf.entries()) out.set(`model.layers.${i}.${name}`, hfShape(row, j, d));
  out.set(OUTPUT_NORM.hf[0] as string, [d.hidden]);
  if (!d.tied) out.set(LM_HEAD.hf[0] as string, [d.vocab, d.hidden]);
  return out;
}

/** The HF shape of a row's `j`th tensor: the leaf's per-layer shape as the export lays it out. */
function hfShape(row: MappingRow, j: number, d: Dims): readonly number[] {
  if (row.layout === "qkv") return [(j === 0 ? d.heads : d.kvHeads) * d.headDim, d.hidden];
  if (row.layout === "transpose") return [...(row.shape?.(d) ?? [])].reverse();
  if (row.shape !== undefined) return row.shape(d);
  return [d.hidden, d.heads * d.headDim]; // o_proj
}

/**
 * Checks the tensors against the config: a bias refused first (naming it), then any tensor missing or extra,
 * then shapes. Older conversions saved rotary_emb.inv_freq buffers: derived from rope_theta, they are skipped.
 */
export function checkTensors(tensors: ReadonlyMap<string, HfTensor>, d: Dims, where: (file: string) => string = (f) => f): void {
  const want = expectedTensors(d);
  const names = [...tensors.keys()].filter((n) => !n.endsWith(".rotary_emb.inv_freq"));
  const bias = names.find((n) => n.endsWith(".bias"));
  if (bias !== undefined)
    throw new MetadataError(`tensor ${bias}: fuji's layers have no biases`, { path: where(tensors.get(bias)?.file ?? "") });
  const extra = names.filter((n) => !want.has(n));
  if (extra.length > 0) {
    const hint = extra[0] === LM_HEAD.hf[0] ? " (config.json says tie_word_embeddings: the head is the embedding)" : "";
    throw new MetadataError(`${extra.length} tensor(s) a fuji Llama of config.json's dims does not have, first ${extra[0]}${hint}`, {
      path: where(tensors.get(extra[0] as string)?.file ?? ""),
    });
  }
  const missing = [...want.keys()].filter((n) => !tensors.has(n));
  if (missing.length > 0) {
    const hint = missing[0] === LM_HEAD.hf[0] ? " (tie_word_embeddings is false)" : "";
    throw new MetadataError(`${missing.length} tensor(s) missing, first ${missing[0]}${hint}`, { path: where("") });
  }
  for (const [name, shape] of want) {
    const t = tensors.get(name) as HfTensor;
    if (t.shape.length !== shape.length || t.shape.some((s, k) => s !== shape[k]))
      throw new MetadataError(`tensor ${name} has shape [${t.shape.join(", ")}], config.json's dims make it [${shape.join(", ")}]`, {
        path: where(t.file),
      });
  }
}

// ---- The output: arrays, their chunks, and how each chunk is made -------------------------------------------

/** Rows [row0, row1) of a source tensor (its axis 0; a 1-D tensor's elements). */
interface Segment {
  readonly tensor: HfTensor;
  readonly row0: number;
  readonly row1: number;
}

export interface ChunkJob {
  readonly array: OutArray;
  readonly index: readonly number[];
  readonly reads: readonly Segment[];
  /**
   * Fills the chunk (C order of the chunk shape, edge padding left zero) from the segments' elements: their float32
   * bits, or their bfloat16 bits as they are when a bfloat16 source is imported as bfloat16 (the same moves).
   */
  readonly fill: (segs: readonly Elements[], out: Elements) => void;
  /** The one segment is the whole chunk as it is (a full range of rows of an unchanged tensor): no fill needed. */
  readonly whole?: true;
}

/** Elements as their bits: float32's, or bfloat16's (BF16 imported as bfloat16). A chunk's segments and chunk are all one. */
export type Elements = Uint32Array | Uint16Array;

export interface OutArray {
  readonly path: string;
  readonly shape: readonly number[];
  readonly chunkShape: readonly number[];
}

const product = (s: readonly number[]) => s.reduce((a, b) => a * b, 1);
const rowElements = (t: HfTensor) => product(t.shape.slice(1));

/** Rows per chunk along an axis of `extent` rows of `perRow` elements: as few chunks as keep each under the cap. */
export function rowsPerChunk(extent: number, perRow: number, cap: number): number {
  const n = Math.max(1, Math.ceil((extent * perRow) / cap));
  return Math.ceil(extent / n);
}

/** One array's chunks for one layer (lead = [layer] when stacked) or for the whole array (lead = []). */
type Layout = (
  lead: readonly number[],
  inner: readonly number[],
  ts: readonly HfTensor[],
  d: Dims,
  cap: number,
) => {
  chunk: number[];
  jobs: Omit<ChunkJob, "array">[];
};

/** Same elements, same order (embedding, norms, head; o_proj's [D, H*hd] as [D, H, hd]): ranges of rows. */
const same: Layout = (lead, inner, [t], _d, cap) => {
  const per = product(inner.slice(1));
  const rpc = rowsPerChunk(inner[0] as number, per, cap);
  const jobs: Omit<ChunkJob, "array">[] = [];
  for (let r0 = 0, c = 0; r0 < (inner[0] as number); r0 += rpc, c++) {
    const r1 = Math.min(inner[0] as number, r0 + rpc);
    jobs.push({
      index: [...lead, c, ...inner.slice(1).map(() => 0)],
      reads: [{ tensor: t as HfTensor, row0: r0, row1: r1 }],
      fill: ([s], out) => out.set(s as Elements),
      ...(r1 - r0 === rpc ? { whole: true as const } : {}),
    });
  }
  return { chunk: [...lead.map(() => 1), rpc, ...inner.slice(1)], jobs };
};

/**
 * `out[i * stride + j] = src[j * a + i]` for j < n, i < a, in 64 x 64 tiles, four source rows at a time: a
 * row-by-row transpose writes a whole column of the output per source row (a cache miss each). Each tile reads
 * four rows forward and writes four adjacent elements of each output row, with running indices: 16 MiB of a
 * feed-forward weight (a = 2048, n = 1835) in 8.8 ms of CPU against 11.3 for 32 x 32 tiles of single elements.
 */
export function transposeInto(src: Elements, a: number, n: number, out: Elements, stride: number): void {
  const T = 64;
  for (let j0 = 0; j0 < n; j0 += T) {
    const j1 = Math.min(n, j0 + T);
    for (let i0 = 0; i0 < a; i0 += T) {
      const i1 = Math.min(a, i0 + T);
      let j = j0;
      for (; j + 4 <= j1; j += 4)
        for (let i = i0, s = j * a + i0, o = i0 * stride + j; i < i1; i++, s++, o += stride) {
          out[o] = src[s] as number;
          out[o + 1] = src[s + a] as number;
          out[o + 2] = src[s + 2 * a] as number;
          out[o + 3] = src[s + 3 * a] as number;
        }
      for (; j < j1; j++) for (let i = i0, s = j * a + i0, o = i0 * stride + j; i < i1; i++, s++, o += stride) out[o] = src[s] as number;
    }
  }
}

/** fuji [a, b] from HF [b, a]: chunks along b, each from HF rows (contiguous) [b0, b1). */
const transpose: Layout = (lead, inner, [t], _d, cap) => {
  const [a, b] = inner as [number, number];
  const rpc = rowsPerChunk(b, a, cap);
  const jobs: Omit<ChunkJob, "array">[] = [];
  for (let b0 = 0, c = 0; b0 < b; b0 += rpc, c++) {
    const n = Math.min(b, b0 + rpc) - b0;
    jobs.push({
      index: [...lead, 0, c],
      reads: [{ tensor: t as HfTensor, row0: b0, row1: b0 + n }],
      fill: ([s], out) => transposeInto(s as Elements, a, n, out, rpc),
    });
  }
  return { chunk: [...lead.map(() => 1), a, rpc], jobs };
};

/**
 * Heads [n0, n1) of a [D, heads, hd] block from q/k/v segments, each head's rows un-permuted: AXLearn's row x of a
 * head is HF's perm[x] (rotaryPermutation), v's rows as they are. `rpc` heads per chunk.
 */
function fillHeads(parts: readonly { first: number; rotary: boolean }[], d: Dims, rpc: number, n0: number, perm: Int32Array) {
  const D = d.hidden;
  const hd = d.headDim;
  const S = rpc * hd;
  const T = 128;
  const same = Int32Array.from({ length: hd }, (_, x) => x);
  // Each head is a transpose of its hd rows (permuted) into a column block of the chunk: done in tiles of T of
  // the hidden axis, four rows at a time, as transposeInto does (2-3x faster than a whole output column per row).
  return (segs: readonly Elements[], out: Elements) =>
    segs.forEach((src, s) => {
      const part = parts[s] as { first: number; rotary: boolean };
      const rows = part.rotary ? perm : same;
      const heads = src.length / (hd * D);
      for (let h = 0; h < heads; h++) {
        const base = (part.first + h - n0) * hd;
        const row0 = h * hd;
        for (let i0 = 0; i0 < D; i0 += T) {
          const i1 = Math.min(D, i0 + T);
          let x = 0;
          for (; x + 4 <= hd; x += 4) {
            const s0 = (row0 + (rows[x] as number)) * D;
            const s1 = (row0 + (rows[x + 1] as number)) * D;
            const s2 = (row0 + (rows[x + 2] as number)) * D;
            const s3 = (row0 + (rows[x + 3] as number)) * D;
            for (let i = i0, o = i0 * S + base + x; i < i1; i++, o += S) {
              out[o] = src[s0 + i] as number;
              out[o + 1] = src[s1 + i] as number;
              out[o + 2] = src[s2 + i] as number;
              out[o + 3] = src[s3 + i] as number;
            }
          }
          for (; x < hd; x++) {
            const s0 = (row0 + (rows[x] as number)) * D;
            for (let i = i0, o = i0 * S + base + x; i < i1; i++, o += S) out[o] = src[s0 + i] as number;
          }
        }
      }
    });
}

/** FusedQKVLinear's [3, D, H, hd]: chunks [1, D, heads, hd], q and k rotary-permuted back. */
const fusedQkv: Layout = (lead, _inner, ts, d, cap) => {
  const perm = rotaryPermutation(d.headDim);
  const rpc = rowsPerChunk(d.heads, d.hidden * d.headDim, cap);
  const jobs: Omit<ChunkJob, "array">[] = [];
  for (let p = 0; p < 3; p++)
    for (let h0 = 0, c = 0; h0 < d.heads; h0 += rpc, c++) {
      const h1 = Math.min(d.heads, h0 + rpc);
      jobs.push({
        index: [...lead, p, 0, c, 0],
        reads: [{ tensor: ts[p] as HfTensor, row0: h0 * d.headDim, row1: h1 * d.headDim }],
        fill: fillHeads([{ first: h0, rotary: p < 2 }], d, rpc, h0, perm),
      });
    }
  return { chunk: [...lead.map(() => 1), 1, d.hidden, rpc, d.headDim], jobs };
};

/** FusedGroupedQKVLinear's [D, H + 2K, hd]: chunks along the heads, from whichever of q, k, v they cover. */
const groupedQkv: Layout = (lead, _inner, ts, d, cap) => {
  const perm = rotaryPermutation(d.headDim);
  const total = d.heads + 2 * d.kvHeads;
  const rpc = rowsPerChunk(total, d.hidden * d.headDim, cap);
  const ranges = [
    { first: 0, count: d.heads, rotary: true },
    { first: d.heads, count: d.kvHeads, rotary: true },
    { first: d.heads + d.kvHeads, count: d.kvHeads, rotary: false },
  ];
  const jobs: Omit<ChunkJob, "array">[] = [];
  for (let n0 = 0, c = 0; n0 < total; n0 += rpc, c++) {
    const n1 = Math.min(total, n0 + rpc);
    const reads: Segment[] = [];
    const parts: { first: number; rotary: boolean }[] = [];
    ranges.forEach((r, j) => {
      const a = Math.max(n0, r.first);
      const b = Math.min(n1, r.first + r.count);
      if (a >= b) return;
      reads.push({ tensor: ts[j] as HfTensor, row0: (a - r.first) * d.headDim, row1: (b - r.first) * d.headDim });
      parts.push({ first: a, rotary: r.rotary });
    });
    jobs.push({ index: [...lead, 0, c, 0], reads, fill: fillHeads(parts, d, rpc, n0, perm) });
  }
  return { chunk: [...lead.map(() => 1), d.hidden, rpc, d.headDim], jobs };
};

/** A layer row's per-layer shape in fuji's tree. */
function innerShape(row: MappingRow, d: Dims): number[] {
  if (row.layout === "qkv") return d.qkv === "fused" ? [3, d.hidden, d.heads, d.headDim] : [d.hidden, d.heads + 2 * d.kvHeads, d.headDim];
  if (row.shape !== undefined) return [...row.shape(d)];
  return [d.hidden, d.heads, d.headDim]; // o_proj
}

export interface ImportPlan {
  readonly dims: Dims;
  readonly arrays: readonly OutArray[];
  /** In the order they are made: the embedding, then layer by layer (the order a save_pretrained shard holds). */
  readonly jobs: readonly ChunkJob[];
}

/** The output arrays and their chunks (checkTensors has passed). */
/** `cap`: the largest chunk in elements (MAX_CHUNK_BYTES of the dtype; tests make it small to cut every array in many chunks). */
export function planImport(tensors: ReadonlyMap<string, HfTensor>, d: Dims, cap: number): ImportPlan {
  const get = (name: string) => tensors.get(name) as HfTensor;
  const arrays: OutArray[] = [];
  const jobs: ChunkJob[] = [];
  const whole = (row: MappingRow, inner: number[]) => {
    const { chunk, jobs: js } = same([], inner, [get(row.hf[0] as string)], d, cap);
    const array = { path: row.leaf, shape: inner, chunkShape: chunk };
    arrays.push(array);
    for (const j of js) jobs.push({ ...j, array });
  };
  whole(EMBEDDING, [d.vocab, d.hidden]);
  const layerArrays = LAYER_ROWS.map((row) => {
    const inner = innerShape(row, d);
    const layout: Layout =
      row.layout === "qkv" ? (d.qkv === "fused" ? fusedQkv : groupedQkv) : row.layout === "transpose" ? transpose : same;
    return { row, inner, layout, array: undefined as OutArray | undefined };
  });
  for (let i = 0; i < d.layers; i++)
    for (const l of layerArrays) {
      const { chunk, jobs: js } = l.layout(
        [i],
        l.inner,
        l.row.hf.map((n) => get(`model.layers.${i}.${n}`)),
        d,
        cap,
      );
      if (l.array === undefined) {
        l.array = { path: STACKED_PREFIX + l.row.leaf, shape: [d.layers, ...l.inner], chunkShape: chunk };
        arrays.push(l.array);
      }
      for (const j of js) jobs.push({ ...j, array: l.array });
    }
  whole(OUTPUT_NORM, [d.hidden]);
  if (!d.tied) whole(LM_HEAD, [d.vocab, d.hidden]);
  return { dims: d, arrays, jobs };
}

// ---- Element conversion -----------------------------------------------------------------------------------

let f16Table: Uint32Array | undefined;

/** float32 bits of every float16 (exact: every float16 is a float32). */
function f16ToF32Bits(): Uint32Array {
  if (f16Table !== undefined) return f16Table;
  const t = new Uint32Array(65536);
  for (let h = 0; h < 65536; h++) {
    const sign = (h & 0x8000) << 16;
    const e = (h >> 10) & 0x1f;
    let m = h & 0x3ff;
    if (e === 0 && m === 0) t[h] = sign >>> 0;
    else if (e === 0) {
      // Subnormal: normalize, one exponent step per shift.
      let e2 = 113;
      while ((m & 0x400) === 0) {
        m <<= 1;
        e2--;
      }
      t[h] = (sign | (e2 << 23) | ((m & 0x3ff) << 13)) >>> 0;
    } else if (e === 31) t[h] = (sign | 0x7f800000 | (m << 13)) >>> 0;
    else t[h] = (sign | ((e + 112) << 23) | (m << 13)) >>> 0;
  }
  f16Table = t;
  return t;
}

/**
 * A segment's raw little-endian elements as float32 bits (exact for every source dtype): a view of `raw` itself when
 * float32, else written into `into` (at least as many elements; a new array without it).
 */
export function toF32Bits(raw: Uint8Array, dtype: StoredDtype, into?: Uint32Array): Uint32Array {
  // A copy when not aligned (new Uint8Array copies; a Buffer's slice would not).
  const aligned = raw.byteOffset % 4 === 0 ? raw : new Uint8Array(raw);
  if (dtype === "F32") return new Uint32Array(aligned.buffer, aligned.byteOffset, aligned.length >>> 2);
  const h = new Uint16Array(aligned.buffer, aligned.byteOffset, aligned.length >>> 1);
  const out = into === undefined ? new Uint32Array(h.length) : into.subarray(0, h.length);
  if (dtype === "BF16") for (let i = 0; i < h.length; i++) out[i] = (h[i] as number) << 16;
  else {
    const t = f16ToF32Bits();
    for (let i = 0; i < h.length; i++) out[i] = t[h[i] as number] as number;
  }
  return out;
}

/**
 * float32 bits as the output dtype's bytes: the same bytes when float32, else bfloat16 rounded to nearest even as
 * jnp.astype (zarr/cast.ts), written into `into` (at least half as many bytes; a new array without it).
 */
export function fromF32Bits(bits: Uint32Array, dtype: ImportDtype, into?: Uint8Array): Uint8Array {
  if (dtype === "float32") return new Uint8Array(bits.buffer, bits.byteOffset, bits.byteLength);
  const out = into === undefined ? new Uint16Array(bits.length) : new Uint16Array(into.buffer, into.byteOffset, bits.length);
  for (let i = 0; i < bits.length; i++) out[i] = bf16Bits(bits[i] as number);
  return new Uint8Array(out.buffer, out.byteOffset, out.byteLength);
}

// ---- The import ------------------------------------------------------------------------------------------

const DTYPE_OF: Record<ImportDtype, DType> = {
  float32: DTYPES.find((t) => t.name === "float32") as DType,
  bfloat16: DTYPES.find((t) => t.name === "bfloat16") as DType,
};

/** A job's segments start 8-aligned in its read buffer, so that each views as its elements without a copy. */
const align8 = (n: number) => Math.ceil(n / 8) * 8;

/**
 * The size of the buffers every chunk is made in (BufferPool): the most any job needs at one step, its source bytes
 * as read, their float32 bits, the chunk's bits, or its compressed frame (zstd's bound for the chunk's bytes).
 */
export function bufferBytes(jobs: readonly ChunkJob[], dtype: ImportDtype): number {
  let most = 0;
  for (const j of jobs) {
    const raw = j.reads.reduce((a, s) => a + align8(readBytes(s).length), 0);
    const src = j.reads.reduce((a, s) => a + (s.row1 - s.row0) * rowElements(s.tensor), 0);
    const n = product(j.array.chunkShape);
    most = Math.max(most, raw, 4 * src, 4 * n, compressBound(n * DTYPE_OF[dtype].itemSize));
  }
  return most;
}

/**
 * Buffers a chunk in flight holds at once: the source bytes and their float32 bits, then the bits and the chunk,
 * then the chunk and its bfloat16 cast, then the chunk's bytes (itself or its cast) and its frame: each buffer is
 * given back once the next step has made what it holds into another.
 */
const BUFFERS_PER_JOB = 2;

/**
 * The buffers chunks are made in, all of one size, reused from chunk to chunk: a fresh one for every read, chunk
 * and frame (the 2 GB benchmark source: 1.9 GB of them) cost the kernel a page fault for every 4 KiB of them, and
 * the garbage collector its passes, more than the transposes. Shared, so that a compression worker reads the chunk
 * and writes its frame in place (CompressPool.compressInto). It holds no more than the jobs in flight held at
 * once (BUFFERS_PER_JOB each, counted in --memory).
 */
class BufferPool {
  private readonly idle: SharedArrayBuffer[] = [];
  constructor(readonly size: number) {}

  take(): SharedArrayBuffer {
    return this.idle.pop() ?? new SharedArrayBuffer(this.size);
  }

  /** A buffer the caller is done with (a failed job's are not given back: its worker may still write them). */
  give(b: SharedArrayBuffer): void {
    this.idle.push(b);
  }
}

/** The step directory AXLearn's build_step_dir names: step_%08d. */
export function stepDirName(step: number): string {
  if (!Number.isSafeInteger(step) || step < 0 || step >= 1e8)
    throw new UsageError(`--step ${step} is not in [0, 10^8) (AXLearn's 8-digit step directories)`);
  return `step_${String(step).padStart(8, "0")}`;
}

/** The index's entries in jax's flatten order: dict keys sorted at every level. */
function indexEntries(arrays: readonly OutArray[], dtype: ImportDtype) {
  const key = (p: string) => p.split("/");
  const cmp = (a: string[], b: string[]) => {
    for (let i = 0; i < Math.min(a.length, b.length); i++) if (a[i] !== b[i]) return (a[i] as string) < (b[i] as string) ? -1 : 1;
    return a.length - b.length;
  };
  return [...arrays].sort((a, b) => cmp(key(a.path), key(b.path))).map((a) => arrayEntry(a.path, dtype, a.shape));
}

function recordOf(src: HfCheckpoint, plan: ImportPlan, dtype: ImportDtype, step: number): string {
  const h = createHash("sha256");
  h.update(src.configText);
  for (const t of [...src.tensors.values()].sort((a, b) => (a.name < b.name ? -1 : 1)))
    h.update(`\n${t.name} ${t.file} ${t.dtype} ${t.shape.join("x")} ${t.offset} ${t.bytes}`);
  return `${JSON.stringify(
    {
      tool: "orbax2reg import-hf",
      step,
      dtype,
      source: { files: src.files, fingerprint: h.digest("hex") },
      arrays: plan.arrays.map((a) => ({ path: a.path, shape: a.shape, chunks: a.chunkShape })),
    },
    null,
    1,
  )}\n`;
}

/** Bytes of the stored tensors a job reads. */
function readBytes(s: Segment): { offset: number; length: number } {
  const per = rowElements(s.tensor) * (s.tensor.dtype === "F32" ? 4 : 2);
  return { offset: s.tensor.offset + s.row0 * per, length: (s.row1 - s.row0) * per };
}

export async function importHf(sourceLocation: string, destRoot: string, options: ImportOptions = {}): Promise<ImportResult> {
  const dtype = options.dtype ?? "float32";
  const step = options.step ?? 0;
  const stepDir = stepDirName(step);
  const memory = options.memoryBytes ?? DEFAULT_IMPORT_MEMORY;
  const source = await openStore(sourceLocation, INPUT);
  const hf = await openHfCheckpoint(source);
  const dims = checkLlamaConfig(hf.config, describe(source, "config.json"));
  checkTensors(hf.tensors, dims, (f) => describe(source, f));
  const plan = planImport(hf.tensors, dims, options.maxChunkElements ?? MAX_CHUNK_BYTES / DTYPE_OF[dtype].itemSize);
  const buffers = new BufferPool(bufferBytes(plan.jobs, dtype));
  const largest = BUFFERS_PER_JOB * buffers.size;
  if (memory < largest)
    throw new UsageError(
      `--memory ${(memory / 2 ** 20).toFixed(1)} MiB is below the ${Math.ceil(largest / 2 ** 20)} MiB the largest chunk needs in flight`,
    );
  const dest = await openStore(destRoot);
  await assertNoOverlap(sourceLocation, `${destRoot.replace(/\/+$/, "")}/${stepDir}`);
  const wanted = recordOf(hf, plan, dtype, step);
  const recordKey = joinKey(stepDir, RECORD_KEY);
  const indexKey = joinKey(stepDir, "index");
  const previous = (await dest.stat(recordKey)) === undefined ? undefined : new TextDecoder().decode(await dest.read(recordKey));
  const committed = (await dest.stat(indexKey)) !== undefined;
  const same = previous === wanted;
  const present = new Set<string>();
  for await (const o of dest.list(`${stepDir}/`)) present.add(o.key.slice(stepDir.length + 1));
  const elsewhere = [...present].filter((k) => !k.startsWith(".orbax2reg/"));
  if (!same && !options.force && (committed || (previous === undefined && elsewhere.length > 0)))
    throw new ConflictError(
      `holds ${committed ? "a committed checkpoint" : "files"} this import did not write (${previous === undefined ? `no ${RECORD_KEY}` : `${RECORD_KEY} differs`}); --force replaces it`,
      { path: describe(dest, stepDir) },
    );
  const bytes = plan.jobs.reduce((a, j) => a + product(j.array.chunkShape) * DTYPE_OF[dtype].itemSize, 0);
  const chunksPerArray = new Map<string, number>();
  for (const j of plan.jobs) chunksPerArray.set(j.array.path, (chunksPerArray.get(j.array.path) ?? 0) + 1);
  options.onPlan?.({ bytes, chunksPerArray });
  const keyOf = (j: ChunkJob) => joinKey("gda", j.array.path, regularChunkKey(j.index));
  const result = (written: number, already: boolean): ImportResult => ({
    source: source.url,
    destination: dest.url,
    stepDir: describe(dest, stepDir),
    step,
    dims,
    dtype,
    arrays: plan.arrays.length,
    chunks: plan.jobs.length,
    chunksWritten: written,
    bytes,
    alreadyImported: already,
    resumed: same && !already && elsewhere.length > 0,
    ropeTheta: ropeTheta(hf.config),
    rmsNormEps: typeof hf.config.rms_norm_eps === "number" ? hf.config.rms_norm_eps : 1e-6,
    maxPositionEmbeddings: typeof hf.config.max_position_embeddings === "number" ? hf.config.max_position_embeddings : undefined,
  });
  const text = new TextEncoder();
  const index = indexText(step, indexEntries(plan.arrays, dtype));
  if (same && committed && plan.jobs.every((j) => present.has(keyOf(j)))) {
    const current = new TextDecoder().decode(await dest.read(indexKey));
    if (current === index) {
      for (const j of plan.jobs) options.onChunk?.(j.array.path, product(j.array.chunkShape) * DTYPE_OF[dtype].itemSize);
      return result(0, true);
    }
  }
  // Uncommit first; clear what another import (or checkpoint, with --force) left; then put this one on record.
  if (committed) await dest.delete(indexKey);
  if (!same) {
    for (const k of present) await dest.delete(joinKey(stepDir, k));
    await dest.removeEmptyDirectories?.(stepDir);
    present.clear();
    await dest.write(recordKey, text.encode(wanted));
  }
  await dest.removeAbandoned?.(stepDir);
  for (const a of plan.arrays)
    await dest.write(
      joinKey(stepDir, "gda", a.path, ".zarray"),
      text.encode(zarrayText({ shape: [...a.shape], chunkShape: [...a.chunkShape], dtype: DTYPE_OF[dtype] })),
    );

  // Chunks compressed on worker threads while this one reads, fills and writes the next (codecs/zstd-pool.ts).
  const pool = new CompressPool(options.threads, WEIGHT_PARAMS);
  let written = 0;
  try {
    await makeChunks();
  } finally {
    await pool.close();
  }
  // Every chunk and its name durable before the index that commits them; then the index.
  await dest.makeDurable?.(stepDir);
  await dest.write(indexKey, text.encode(index));
  await dest.makeDurable?.(indexKey);
  await dest.flushed?.();
  return result(written, false);

  /**
   * Job `j`'s chunk, made in pooled buffers: its source rows read into one (when the store reads into a buffer; else
   * copied there), as float32 bits (views of it, or converted into a second), filled into the chunk (unless the one
   * segment is the chunk as it is), cast, compressed into a frame on a worker thread and written. A failed job's
   * buffers are left to the garbage collector.
   */
  async function makeChunk(j: ChunkJob): Promise<void> {
    const n = product(j.array.chunkShape);
    const raw = buffers.take();
    let at = 0;
    const read = await Promise.all(
      j.reads.map((s) => {
        const { offset, length } = readBytes(s);
        const into = new Uint8Array(raw, at, length);
        at += align8(length);
        if (source.readRangeInto !== undefined) return source.readRangeInto(s.tensor.file, offset, length, into);
        return source.readRange(s.tensor.file, offset, length).then((bytes) => {
          into.set(bytes);
          return into;
        });
      }),
    );
    // A bfloat16 source imported as bfloat16 is moved as it is, every bit kept (NaN payloads too, as jax's no-op
    // astype and AXLearn's save keep them), without a widening to float32 and a rounding back.
    const narrow = dtype === "bfloat16" && j.reads.every((s) => s.tensor.dtype === "BF16");
    let bitsBuffer = raw;
    let segs: Elements[];
    if (narrow) segs = read.map((r) => new Uint16Array(r.buffer, r.byteOffset, r.length >>> 1));
    else if (j.reads.every((s) => s.tensor.dtype === "F32")) segs = read.map((r) => toF32Bits(r, "F32"));
    else {
      bitsBuffer = buffers.take();
      let e = 0;
      segs = read.map((r, k) => {
        const bits = toF32Bits(r, (j.reads[k] as Segment).tensor.dtype, new Uint32Array(bitsBuffer, 4 * e));
        e += bits.length;
        return bits;
      });
      buffers.give(raw);
    }
    let chunkBuffer = bitsBuffer;
    let chunk = segs[0] as Elements;
    if (j.whole !== true) {
      chunkBuffer = buffers.take();
      chunk = narrow ? new Uint16Array(chunkBuffer, 0, n) : new Uint32Array(chunkBuffer, 0, n);
      // A reused buffer holds the last chunk's bits: the edge padding the segments do not cover is zeroed.
      if (segs.reduce((a, s) => a + s.length, 0) < n) chunk.fill(0);
      j.fill(segs, chunk);
      buffers.give(bitsBuffer);
    }
    let data: Uint8Array;
    if (narrow) data = new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength);
    else if (dtype === "float32") data = fromF32Bits(chunk as Uint32Array, "float32");
    else {
      const castBuffer = buffers.take();
      data = fromF32Bits(chunk as Uint32Array, dtype, new Uint8Array(castBuffer));
      buffers.give(chunkBuffer);
    }
    const frameBuffer = buffers.take();
    const frame = await pool.compressInto(data, new Uint8Array(frameBuffer));
    buffers.give(data.buffer as SharedArrayBuffer);
    // Nothing checks a chunk against a CRC-32C (a resumed import keeps every chunk already under its name).
    await dest.write(joinKey(stepDir, keyOf(j)), frame, { checksum: false });
    buffers.give(frameBuffer);
  }

  async function makeChunks(): Promise<void> {
    const budget = new Budget(memory);
    const slots = new Budget(IN_FLIGHT[parseLocation(sourceLocation).kind]);
    const running = new Set<Promise<void>>();
    let failure: { e: unknown } | undefined;
    for (const j of plan.jobs) {
      const size = product(j.array.chunkShape) * DTYPE_OF[dtype].itemSize;
      if (present.has(keyOf(j))) {
        options.onChunk?.(j.array.path, size);
        continue;
      }
      const releaseSlot = await slots.acquire();
      const release = await budget.acquire(largest);
      if (failure !== undefined) {
        release();
        releaseSlot();
        break;
      }
      const task: Promise<void> = makeChunk(j)
        .then(() => {
          written++;
          options.onChunk?.(j.array.path, size);
        })
        .catch((e) => {
          failure ??= { e };
        })
        .finally(() => {
          release();
          releaseSlot();
          running.delete(task);
        });
      running.add(task);
    }
    while (running.size > 0) await Promise.all([...running]);
    if (failure !== undefined) throw failure.e;
  }
}
