import { MetadataError } from "../errors.js";
import type { SourceArray } from "./source.js";

/**
 * AXLearn's fuji decoder (axlearn/experiments/text/gpt/fuji.py: model_config) as Hugging Face's
 * LlamaForCausalLM: which leaf becomes which tensor, in which layout. Checked against AXLearn's source
 * (axlearn/common/attention.py at the vendored revision; docs/cli.md, "export-hf", cites the lines):
 * - FusedQKVLinear's weight is [3, D, H, hd] (einsum "btd,pdnh->pbtnh", p = q/k/v);
 *   FusedGroupedQKVLinear's is one MultiheadInputLinear [D, H + 2K, hd] ("btd,dnh->btnh") split on the heads
 *   axis at [H, H + K]: query heads, then key heads, then value heads.
 * - o_proj is a MultiheadOutputLinear [D, H, hd] ("btnh,dnh->btd").
 * - The feed-forward layer multiplies activation[i](linear1_i(x)) for fuji's ("nn.silu", "linear"):
 *   linear1_0 is SiLU's input, Llama's gate_proj; linear1_1 is up_proj.
 * - Rotary embeddings rotate interleaved pairs (2j, 2j+1) by angle j (apply_rotary_position_embeddings);
 *   Llama's rotate_half rotates (j, j + hd/2) by angle j with the same frequencies (theta^(-2j/hd)), so the
 *   rows of q_proj and k_proj are permuted within each head (rotaryPermutation), as Meta-to-HF converters do.
 * Every HF weight is [out, in] (torch.nn.Linear), so AXLearn's [in, out] weights are transposed.
 */

/** The stacked layers of a RepeatedTransformerLayer (axis 0 = layer), and StackedTransformerLayer's own. */
export const STACKED_PREFIX = "model/decoder/transformer/repeat/layer/";
const UNSTACKED = /^model\/decoder\/transformer\/layer(\d+)\/(.+)$/;

export type Layout =
  /** Same elements, same order (reshaped at most). */
  | "same"
  /** [in, out] -> [out, in]. */
  | "transpose"
  /** One of q/k/v of a fused QKV weight, transposed to [heads*hd, D], q and k rows rotary-permuted. */
  | "qkv";

/** One row of the table: an AXLearn leaf (under a layer, or of the decoder) and what it becomes. */
export interface MappingRow {
  readonly leaf: string;
  readonly hf: readonly string[];
  readonly layout: Layout;
}

/** Per layer, in the order transformers' LlamaDecoderLayer lists its weights (state_dict order). */
export const LAYER_ROWS: readonly MappingRow[] = [
  {
    leaf: "self_attention/attention/i_proj/i_proj/qkv_proj/weight",
    hf: ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    layout: "qkv",
  },
  { leaf: "self_attention/attention/o_proj/weight", hf: ["self_attn.o_proj.weight"], layout: "same" },
  { leaf: "feed_forward/linear1_0/weight", hf: ["mlp.gate_proj.weight"], layout: "transpose" },
  { leaf: "feed_forward/linear1_1/weight", hf: ["mlp.up_proj.weight"], layout: "transpose" },
  { leaf: "feed_forward/linear2/weight", hf: ["mlp.down_proj.weight"], layout: "transpose" },
  { leaf: "self_attention/norm/scale", hf: ["input_layernorm.weight"], layout: "same" },
  { leaf: "feed_forward/norm/scale", hf: ["post_attention_layernorm.weight"], layout: "same" },
];

export const EMBEDDING: MappingRow = { leaf: "model/decoder/emb/token_emb/weight", hf: ["model.embed_tokens.weight"], layout: "same" };
export const OUTPUT_NORM: MappingRow = { leaf: "model/decoder/output_norm/scale", hf: ["model.norm.weight"], layout: "same" };
/** Absent when the head shares the embedding (fuji's shared_lm_head=True): tie_word_embeddings. */
export const LM_HEAD: MappingRow = { leaf: "model/decoder/lm_head/weight", hf: ["lm_head.weight"], layout: "same" };

/**
 * Position of HF row `r` (0 <= r < hd) of a head in AXLearn's order: HF's first half holds the pairs' first
 * elements, its second half their second elements. `table[x]` is the HF row of AXLearn row x: x = 2j + a
 * goes to a * hd/2 + j.
 */
export function rotaryPermutation(hd: number): Int32Array {
  if (hd % 2 !== 0) throw new RangeError(`rotary head dim ${hd} is odd`);
  const table = new Int32Array(hd);
  for (let x = 0; x < hd; x++) table[x] = (x % 2) * (hd / 2) + Math.floor(x / 2);
  return table;
}

/** The shapes the tree says: what config.json is built from. */
export interface Dims {
  readonly layers: number;
  readonly hidden: number;
  readonly heads: number;
  readonly kvHeads: number;
  readonly headDim: number;
  readonly ffn: number;
  readonly vocab: number;
  readonly tied: boolean;
  readonly qkv: "fused" | "grouped";
  readonly stacked: boolean;
}

/**
 * One output tensor: a box of one source array (origin, extent) and, for every dimension of the box, the
 * stride (in elements) of that coordinate in the output; the last dimension's coordinate may be permuted
 * first (`perm`). `bandDim` is the box dimension whose stride is the output's row stride, so that a range of
 * it is a range of output rows (a band, for tensors over the memory budget); `bandUnit` output rows per unit.
 */
export interface OutputTensor {
  readonly name: string;
  readonly shape: readonly number[];
  readonly array: SourceArray;
  readonly origin: readonly number[];
  readonly extent: readonly number[];
  readonly outStrides: readonly number[];
  readonly perm?: Int32Array;
  readonly bandDim: number;
  /** The leaf it comes from, for messages and --json. */
  readonly leaf: string;
  /**
   * Tensors of the same pass are made together from one reading of their chunks: a grouped QKV layer's q, k and
   * v interleave in every row of the source ([D, H + 2K, hd]), so made one after the other each would read the
   * layer's rows again.
   */
  readonly pass?: string;
}

export interface ExportPlan {
  readonly dims: Dims;
  readonly tensors: readonly OutputTensor[];
  /** Leaves outside model/ (optimizer state, prng_key, ...): not part of a Hugging Face model. */
  readonly skipped: readonly string[];
}

const refuse = (leaf: string, why: string): never => {
  throw new MetadataError(`${why}; not a fuji-family decoder`, { path: leaf });
};

const stridesOf = (shape: readonly number[]) => {
  const out = new Array<number>(shape.length);
  let s = 1;
  for (let d = shape.length - 1; d >= 0; d--) {
    out[d] = s;
    s *= shape[d] as number;
  }
  return out;
};

/** A layer's array: the stacked array and its layer index, or the layer's own array. */
interface LayerLeaf {
  readonly array: SourceArray;
  /** Leading index into the stacked axis, absent for an unstacked layer's own array. */
  readonly layer?: number;
}

/**
 * Maps the source's model/ leaves to LlamaForCausalLM's tensors, in transformers' state_dict order, or
 * refuses (MetadataError naming the leaf) a tree that is not a fuji-family decoder: a leaf under model/ it
 * does not know, a leaf missing, or a shape that does not fit the others.
 */
export function planExport(arrays: readonly SourceArray[], otherLeaves: readonly string[] = []): ExportPlan {
  const byPath = new Map(arrays.map((a) => [a.path, a]));
  const skipped = [...arrays.filter((a) => !isModel(a.path)).map((a) => a.path), ...otherLeaves.filter((p) => !isModel(p))];
  for (const p of otherLeaves) if (isModel(p)) refuse(p, "a leaf under model/ that is not an array");
  const layerLeaves = new Set(LAYER_ROWS.map((r) => r.leaf));
  const top = new Set([EMBEDDING.leaf, OUTPUT_NORM.leaf, LM_HEAD.leaf]);
  // Unstacked layers, by index.
  const unstacked = new Map<number, Map<string, SourceArray>>();
  let stackedSeen = false;
  for (const a of arrays) {
    if (!isModel(a.path) || top.has(a.path)) continue;
    if (a.path.startsWith(STACKED_PREFIX)) {
      if (!layerLeaves.has(a.path.slice(STACKED_PREFIX.length))) refuse(a.path, "unknown leaf under model/ (not in the fuji mapping)");
      stackedSeen = true;
      continue;
    }
    const m = UNSTACKED.exec(a.path);
    if (m === null || !layerLeaves.has(m[2] as string)) refuse(a.path, "unknown leaf under model/ (not in the fuji mapping)");
    const i = Number((m as RegExpExecArray)[1]);
    if (!unstacked.has(i)) unstacked.set(i, new Map());
    unstacked.get(i)?.set((m as RegExpExecArray)[2] as string, a);
  }
  if (stackedSeen && unstacked.size > 0) refuse(`${STACKED_PREFIX}...`, "both stacked and per-layer (layer{i}) leaves");
  const need = (path: string) => byPath.get(path) ?? refuse(path, "missing");
  const emb = need(EMBEDDING.leaf);
  const norm = need(OUTPUT_NORM.leaf);
  const head = byPath.get(LM_HEAD.leaf);
  for (const a of arrays)
    if (isModel(a.path) && !["float32", "bfloat16"].includes(a.meta.dtype.name))
      refuse(a.path, `dtype ${a.meta.dtype.name} (float32 or bfloat16 expected)`);
  const shape = (a: SourceArray) => a.meta.shape;
  if (shape(emb).length !== 2) refuse(emb.path, `shape ${fmt(shape(emb))} is not [vocab, hidden]`);
  const [vocab, hidden] = shape(emb) as [number, number];
  const expect = (a: SourceArray, want: readonly number[], what: string) => {
    if (shape(a).length !== want.length || shape(a).some((s, d) => s !== want[d]))
      refuse(a.path, `shape ${fmt(shape(a))} does not fit ${what} ${fmt(want)}`);
  };
  expect(norm, [hidden], "[hidden]");
  if (head !== undefined) expect(head, [vocab, hidden], "[vocab, hidden]");

  // Each layer's leaves, and the number of layers.
  let layers: number;
  let leafOf: (i: number, leaf: string) => LayerLeaf;
  if (stackedSeen || unstacked.size === 0) {
    const stacked = new Map<string, SourceArray>();
    for (const leaf of layerLeaves) stacked.set(leaf, need(STACKED_PREFIX + leaf));
    const first = stacked.get(LAYER_ROWS[5]?.leaf as string) as SourceArray;
    layers = shape(first)[0] ?? refuse(first.path, "no layer axis");
    for (const a of stacked.values())
      if (shape(a)[0] !== layers) refuse(a.path, `stacked axis ${shape(a)[0]} differs from the ${layers} layers of the others`);
    leafOf = (i: number, leaf: string) => ({ array: stacked.get(leaf) as SourceArray, layer: i });
  } else {
    layers = unstacked.size;
    for (let i = 0; i < layers; i++) {
      const own =
        unstacked.get(i) ?? refuse(`model/decoder/transformer/layer${i}`, `missing (found ${unstacked.size} layers, numbered otherwise)`);
      for (const leaf of layerLeaves) if (!own.has(leaf)) refuse(`model/decoder/transformer/layer${i}/${leaf}`, "missing");
    }
    leafOf = (i: number, leaf: string) => ({ array: unstacked.get(i)?.get(leaf) as SourceArray });
  }
  const inner = (l: LayerLeaf) => (l.layer === undefined ? shape(l.array) : shape(l.array).slice(1));
  const l0 = (leaf: string) => leafOf(0, leaf);
  const qkv = l0(LAYER_ROWS[0]?.leaf as string);
  const o = l0(LAYER_ROWS[1]?.leaf as string);
  const oShape = inner(o);
  if (oShape.length !== 3 || oShape[0] !== hidden)
    refuse(
      o.array.path,
      `shape ${fmt(shape(o.array))} does not fit [${o.layer === undefined ? "" : "layers, "}hidden=${hidden}, heads, head_dim]`,
    );
  const [, heads, headDim] = oShape as [number, number, number];
  const qShape = inner(qkv);
  let kind: Dims["qkv"] = "fused";
  let kvHeads = heads;
  if (qShape.length === 4) {
    kind = "fused";
    kvHeads = heads;
    if (qShape[0] !== 3 || qShape[1] !== hidden || qShape[2] !== heads || qShape[3] !== headDim)
      refuse(qkv.array.path, `shape ${fmt(shape(qkv.array))} does not fit FusedQKVLinear [3, ${hidden}, ${heads}, ${headDim}]`);
  } else if (qShape.length === 3) {
    kind = "grouped";
    const n = qShape[1] as number;
    kvHeads = (n - heads) / 2;
    if (qShape[0] !== hidden || qShape[2] !== headDim || !Number.isInteger(kvHeads) || kvHeads < 1 || heads % kvHeads !== 0) {
      refuse(
        qkv.array.path,
        `shape ${fmt(shape(qkv.array))} does not fit FusedGroupedQKVLinear [${hidden}, ${heads} + 2 * kv_heads, ${headDim}] with kv_heads dividing ${heads}`,
      );
    }
  } else {
    refuse(
      qkv.array.path,
      `shape ${fmt(shape(qkv.array))} is neither FusedQKVLinear's [3, D, H, hd] nor FusedGroupedQKVLinear's [D, H + 2K, hd]`,
    );
  }
  if (headDim % 2 !== 0) refuse(qkv.array.path, `head_dim ${headDim} is odd: no rotary pairs`);
  const l1 = inner(l0(LAYER_ROWS[2]?.leaf as string));
  const ffn = l1[1] ?? 0;
  expect1(l0(LAYER_ROWS[2]?.leaf as string), [hidden, ffn]);
  expect1(l0(LAYER_ROWS[3]?.leaf as string), [hidden, ffn]);
  expect1(l0(LAYER_ROWS[4]?.leaf as string), [ffn, hidden]);
  expect1(l0(LAYER_ROWS[5]?.leaf as string), [hidden]);
  expect1(l0(LAYER_ROWS[6]?.leaf as string), [hidden]);
  function expect1(l: LayerLeaf, want: number[]) {
    const got = inner(l);
    if (got.length !== want.length || got.some((s, d) => s !== want[d]))
      refuse(l.array.path, `shape ${fmt(shape(l.array))} does not fit ${fmt(l.layer === undefined ? want : [layers, ...want])}`);
  }
  // Unstacked layers must all have layer 0's shapes.
  if (!stackedSeen && unstacked.size > 0) {
    for (let i = 1; i < layers; i++)
      for (const leaf of layerLeaves) {
        const a = leafOf(i, leaf).array;
        const want = shape(l0(leaf).array);
        if (shape(a).some((s, d) => s !== want[d]) || shape(a).length !== want.length)
          refuse(a.path, `shape ${fmt(shape(a))} differs from layer 0's ${fmt(want)}`);
      }
  }

  const dims: Dims = {
    layers,
    hidden,
    heads,
    kvHeads,
    headDim,
    ffn,
    vocab,
    tied: head === undefined,
    qkv: kind,
    stacked: stackedSeen || unstacked.size === 0,
  };
  const perm = rotaryPermutation(headDim);
  const tensors: OutputTensor[] = [];
  const whole = (name: string, a: SourceArray, outShape: number[]): OutputTensor => ({
    name,
    shape: outShape,
    array: a,
    origin: a.meta.shape.map(() => 0),
    extent: a.meta.shape,
    outStrides: stridesOf(a.meta.shape),
    bandDim: 0,
    leaf: a.path,
  });
  tensors.push(whole(EMBEDDING.hf[0] as string, emb, [vocab, hidden]));
  for (let i = 0; i < layers; i++) {
    const prefix = `model.layers.${i}.`;
    for (const row of LAYER_ROWS) {
      const l = leafOf(i, row.leaf);
      const lead = l.layer === undefined ? [] : [l.layer];
      const lead1 = lead.map(() => 1);
      const lead0 = lead.map(() => 0);
      const src = inner(l);
      const t = (
        name: string,
        outShape: number[],
        origin: number[],
        extent: number[],
        outStrides: number[],
        bandDim: number,
        p?: Int32Array,
      ): OutputTensor => ({
        name: prefix + name,
        shape: outShape,
        array: l.array,
        origin: [...lead, ...origin],
        extent: [...lead1, ...extent],
        outStrides: [...lead0, ...outStrides],
        bandDim: bandDim + lead.length,
        leaf: l.array.path,
        ...(p === undefined ? {} : { perm: p }),
      });
      if (row.layout === "same") {
        tensors.push(
          t(
            row.hf[0] as string,
            row.hf[0]?.includes("o_proj") ? [hidden, heads * headDim] : [...src],
            src.map(() => 0),
            [...src],
            stridesOf(src),
            0,
          ),
        );
      } else if (row.layout === "transpose") {
        const [a, b] = src as [number, number];
        // [a, b] -> [b, a]: coordinate (x, y) lands at y * a + x; rows of the output are the source's columns.
        tensors.push(t(row.hf[0] as string, [b, a], [0, 0], [a, b], [1, a], 1));
      } else {
        // q, k, v: heads h of head_dim x of input d land at (h * hd + perm(x)) * D + d.
        const parts: [string, number, number, boolean][] = [
          [row.hf[0] as string, 0, heads, true],
          [row.hf[1] as string, heads, kvHeads, true],
          [row.hf[2] as string, heads + kvHeads, kvHeads, false],
        ];
        parts.forEach(([name, first, count, rotary], j) => {
          const outShape = [count * headDim, hidden];
          const strides = [1, headDim * hidden, hidden];
          if (kind === "fused")
            tensors.push(t(name, outShape, [j, 0, 0, 0], [1, hidden, heads, headDim], [0, ...strides], 2, rotary ? perm : undefined));
          else
            tensors.push({
              ...t(name, outShape, [0, first, 0], [hidden, count, headDim], strides, 1, rotary ? perm : undefined),
              pass: `${l.array.path}#${i}`,
            });
        });
      }
    }
  }
  tensors.push(whole(OUTPUT_NORM.hf[0] as string, norm, [hidden]));
  if (head !== undefined) tensors.push(whole(LM_HEAD.hf[0] as string, head, [vocab, hidden]));
  return { dims, tensors, skipped };
}

const isModel = (p: string) => p === "model" || p.startsWith("model/");
const fmt = (s: readonly number[]) => `[${s.join(", ")}]`;
