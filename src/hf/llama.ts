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
  /**
   * The shape the leaf must have within a layer, from the model's hidden and feed-forward sizes (the attention
   * weights, which give the heads, are checked on their own: attentionDims).
   */
  readonly shape?: (d: { readonly hidden: number; readonly ffn: number }) => readonly number[];
}

/** The layer arrays, in the order their tensors are made (each array's for every layer before the next). */
export const LAYER_ROWS: readonly MappingRow[] = [
  {
    leaf: "self_attention/attention/i_proj/i_proj/qkv_proj/weight",
    hf: ["self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"],
    layout: "qkv",
  },
  { leaf: "self_attention/attention/o_proj/weight", hf: ["self_attn.o_proj.weight"], layout: "same" },
  { leaf: "feed_forward/linear1_0/weight", hf: ["mlp.gate_proj.weight"], layout: "transpose", shape: (d) => [d.hidden, d.ffn] },
  { leaf: "feed_forward/linear1_1/weight", hf: ["mlp.up_proj.weight"], layout: "transpose", shape: (d) => [d.hidden, d.ffn] },
  { leaf: "feed_forward/linear2/weight", hf: ["mlp.down_proj.weight"], layout: "transpose", shape: (d) => [d.ffn, d.hidden] },
  { leaf: "self_attention/norm/scale", hf: ["input_layernorm.weight"], layout: "same", shape: (d) => [d.hidden] },
  { leaf: "feed_forward/norm/scale", hf: ["post_attention_layernorm.weight"], layout: "same", shape: (d) => [d.hidden] },
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

/** The model's leaves, found by name: the decoder's own and each layer's. */
interface Leaves {
  readonly emb: SourceArray;
  readonly norm: SourceArray;
  readonly head: SourceArray | undefined;
  /** Layer leaf -> its array stacked over the layers (axis 0), when the layers are stacked. */
  readonly stacked: ReadonlyMap<string, SourceArray> | undefined;
  /** Layer index -> layer leaf -> its array, when they are not. */
  readonly unstacked: ReadonlyMap<number, ReadonlyMap<string, SourceArray>>;
}

/**
 * Maps the source's model/ leaves to LlamaForCausalLM's tensors (the embedding, each layer array's tensors
 * for every layer, the final norm, the head), or
 * refuses (MetadataError naming the leaf) a tree that is not a fuji-family decoder: a leaf under model/ it
 * does not know, a leaf missing, or a shape that does not fit the others.
 */
export function planExport(arrays: readonly SourceArray[], otherLeaves: readonly string[] = []): ExportPlan {
  const skipped = [...arrays.filter((a) => !isModel(a.path)).map((a) => a.path), ...otherLeaves.filter((p) => !isModel(p))];
  const leaves = findLeaves(arrays, otherLeaves);
  const dims = checkShapes(arrays, leaves);
  return { dims, tensors: emitTensors(leaves, dims), skipped };
}

/** The model's leaves by the mapping's names; refuses a leaf it does not know or one missing. */
function findLeaves(arrays: readonly SourceArray[], otherLeaves: readonly string[]): Leaves {
  const byPath = new Map(arrays.map((a) => [a.path, a]));
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
  if (stackedSeen || unstacked.size === 0) {
    const stacked = new Map<string, SourceArray>();
    for (const leaf of layerLeaves) stacked.set(leaf, need(STACKED_PREFIX + leaf));
    return { emb, norm, head, stacked, unstacked };
  }
  for (let i = 0; i < unstacked.size; i++) {
    const own =
      unstacked.get(i) ?? refuse(`model/decoder/transformer/layer${i}`, `missing (found ${unstacked.size} layers, numbered otherwise)`);
    for (const leaf of layerLeaves) if (!own.has(leaf)) refuse(`model/decoder/transformer/layer${i}/${leaf}`, "missing");
  }
  return { emb, norm, head, stacked: undefined, unstacked };
}

/** Layer `i`'s array of `leaf`. */
function leafOf(leaves: Leaves, i: number, leaf: string): LayerLeaf {
  if (leaves.stacked !== undefined) return { array: leaves.stacked.get(leaf) as SourceArray, layer: i };
  return { array: leaves.unstacked.get(i)?.get(leaf) as SourceArray };
}

const shapeOf = (a: SourceArray) => a.meta.shape;
/** A layer leaf's shape within the layer (a stacked array's without its layer axis). */
const inner = (l: LayerLeaf) => (l.layer === undefined ? shapeOf(l.array) : shapeOf(l.array).slice(1));
const sameShape = (a: readonly number[], b: readonly number[]) => a.length === b.length && a.every((s, d) => s === b[d]);

/**
 * The model's dims, from the shapes: the embedding gives vocab and hidden, o_proj and the QKV weight the heads
 * (attentionDims), linear1_0 the feed-forward size; every other leaf must then have the shape its row expects.
 * Refuses a dtype other than float32 or bfloat16, or a shape that does not fit.
 */
function checkShapes(arrays: readonly SourceArray[], leaves: Leaves): Dims {
  for (const a of arrays)
    if (isModel(a.path) && !["float32", "bfloat16"].includes(a.meta.dtype.name))
      refuse(a.path, `dtype ${a.meta.dtype.name} (float32 or bfloat16 expected)`);
  const { emb, norm, head } = leaves;
  if (shapeOf(emb).length !== 2) refuse(emb.path, `shape ${fmt(shapeOf(emb))} is not [vocab, hidden]`);
  const [vocab, hidden] = shapeOf(emb) as [number, number];
  const expect = (a: SourceArray, want: readonly number[], what: string) => {
    if (!sameShape(shapeOf(a), want)) refuse(a.path, `shape ${fmt(shapeOf(a))} does not fit ${what} ${fmt(want)}`);
  };
  expect(norm, [hidden], "[hidden]");
  if (head !== undefined) expect(head, [vocab, hidden], "[vocab, hidden]");

  let layers = leaves.unstacked.size;
  if (leaves.stacked !== undefined) {
    const first = leaves.stacked.get(LAYER_ROWS[5]?.leaf as string) as SourceArray;
    layers = shapeOf(first)[0] ?? refuse(first.path, "no layer axis");
    for (const a of leaves.stacked.values())
      if (shapeOf(a)[0] !== layers) refuse(a.path, `stacked axis ${shapeOf(a)[0]} differs from the ${layers} layers of the others`);
  }
  const l0 = (leaf: string) => leafOf(leaves, 0, leaf);
  const attention = attentionDims(l0(LAYER_ROWS[0]?.leaf as string), l0(LAYER_ROWS[1]?.leaf as string), hidden);
  const ffn = inner(l0(LAYER_ROWS[2]?.leaf as string))[1] ?? 0;
  for (const row of LAYER_ROWS) {
    if (row.shape === undefined) continue;
    const l = l0(row.leaf);
    const want = row.shape({ hidden, ffn });
    if (!sameShape(inner(l), want))
      refuse(l.array.path, `shape ${fmt(shapeOf(l.array))} does not fit ${fmt(l.layer === undefined ? want : [layers, ...want])}`);
  }
  // Unstacked layers must all have layer 0's shapes.
  if (leaves.stacked === undefined)
    for (let i = 1; i < layers; i++)
      for (const row of LAYER_ROWS) {
        const a = leafOf(leaves, i, row.leaf).array;
        const want = shapeOf(l0(row.leaf).array);
        if (!sameShape(shapeOf(a), want)) refuse(a.path, `shape ${fmt(shapeOf(a))} differs from layer 0's ${fmt(want)}`);
      }
  const { heads, kvHeads, headDim, qkv } = attention;
  return { layers, hidden, heads, kvHeads, headDim, ffn, vocab, tied: head === undefined, qkv, stacked: leaves.stacked !== undefined };
}

/**
 * Heads, key/value heads and head_dim from o_proj ([hidden, heads, head_dim]) and the QKV weight, whose rank
 * says which it is: FusedQKVLinear's [3, hidden, heads, head_dim] or FusedGroupedQKVLinear's
 * [hidden, heads + 2 * kv_heads, head_dim].
 */
function attentionDims(qkv: LayerLeaf, o: LayerLeaf, hidden: number): Pick<Dims, "heads" | "kvHeads" | "headDim" | "qkv"> {
  const oShape = inner(o);
  if (oShape.length !== 3 || oShape[0] !== hidden)
    refuse(
      o.array.path,
      `shape ${fmt(shapeOf(o.array))} does not fit [${o.layer === undefined ? "" : "layers, "}hidden=${hidden}, heads, head_dim]`,
    );
  const [, heads, headDim] = oShape as [number, number, number];
  const qShape = inner(qkv);
  let kind: Dims["qkv"];
  let kvHeads: number;
  if (qShape.length === 4) {
    kind = "fused";
    kvHeads = heads;
    if (!sameShape(qShape, [3, hidden, heads, headDim]))
      refuse(qkv.array.path, `shape ${fmt(shapeOf(qkv.array))} does not fit FusedQKVLinear [3, ${hidden}, ${heads}, ${headDim}]`);
  } else if (qShape.length === 3) {
    kind = "grouped";
    kvHeads = ((qShape[1] as number) - heads) / 2;
    if (qShape[0] !== hidden || qShape[2] !== headDim || !Number.isInteger(kvHeads) || kvHeads < 1 || heads % kvHeads !== 0) {
      refuse(
        qkv.array.path,
        `shape ${fmt(shapeOf(qkv.array))} does not fit FusedGroupedQKVLinear [${hidden}, ${heads} + 2 * kv_heads, ${headDim}] with kv_heads dividing ${heads}`,
      );
    }
  } else {
    return refuse(
      qkv.array.path,
      `shape ${fmt(shapeOf(qkv.array))} is neither FusedQKVLinear's [3, D, H, hd] nor FusedGroupedQKVLinear's [D, H + 2K, hd]`,
    );
  }
  if (headDim % 2 !== 0) refuse(qkv.array.path, `head_dim ${headDim} is odd: no rotary pairs`);
  return { heads, kvHeads, headDim, qkv: kind };
}

/** A whole array as one tensor, in its own order. */
function whole(name: string, a: SourceArray, outShape: number[]): OutputTensor {
  return {
    name,
    shape: outShape,
    array: a,
    origin: a.meta.shape.map(() => 0),
    extent: a.meta.shape,
    outStrides: stridesOf(a.meta.shape),
    bandDim: 0,
    leaf: a.path,
  };
}

/**
 * The tensors in the order they are made: the embedding, then array-major: every layer's tensors of one
 * stacked array, then the next array's. A stacked array's chunk spans every layer, so its decoder stays open
 * from layer 0 to the last: in this order only one array's chunks are open at once (in layer order all five
 * weights' would be). Shards and the index need no order: transformers opens the files the index names and
 * takes each tensor by its name (utils/hub.py, get_checkpoint_shard_files). Then the final norm and the head.
 */
function emitTensors(leaves: Leaves, dims: Dims): OutputTensor[] {
  const perm = rotaryPermutation(dims.headDim);
  const tensors: OutputTensor[] = [whole(EMBEDDING.hf[0] as string, leaves.emb, [dims.vocab, dims.hidden])];
  for (const row of LAYER_ROWS)
    for (let i = 0; i < dims.layers; i++)
      tensors.push(...LAYOUTS[row.layout](row, new LayerBox(i, leafOf(leaves, i, row.leaf)), dims, perm));
  tensors.push(whole(OUTPUT_NORM.hf[0] as string, leaves.norm, [dims.hidden]));
  if (leaves.head !== undefined) tensors.push(whole(LM_HEAD.hf[0] as string, leaves.head, [dims.vocab, dims.hidden]));
  return tensors;
}

/** Layer `i`'s leaf as tensors: a box within the layer, given without the stacked axis (prepended here when there is one). */
class LayerBox {
  /** The leaf's shape within the layer. */
  readonly src: readonly number[];

  constructor(
    readonly i: number,
    readonly l: LayerLeaf,
  ) {
    this.src = inner(l);
  }

  tensor(
    name: string,
    outShape: number[],
    origin: number[],
    extent: number[],
    outStrides: number[],
    bandDim: number,
    p?: Int32Array,
  ): OutputTensor {
    const lead = this.l.layer === undefined ? [] : [this.l.layer];
    return {
      name: `model.layers.${this.i}.${name}`,
      shape: outShape,
      array: this.l.array,
      origin: [...lead, ...origin],
      extent: [...lead.map(() => 1), ...extent],
      outStrides: [...lead.map(() => 0), ...outStrides],
      bandDim: bandDim + lead.length,
      leaf: this.l.array.path,
      ...(p === undefined ? {} : { perm: p }),
    };
  }
}

/** A row's tensors for one layer, by the row's layout. */
type LayoutTensors = (row: MappingRow, box: LayerBox, dims: Dims, perm: Int32Array) => OutputTensor[];

/** Same elements, same order: o_proj's [hidden, heads, head_dim] read as [hidden, heads * head_dim]. */
const sameTensors: LayoutTensors = (row, box, dims) => {
  const name = row.hf[0] as string;
  const outShape = name.includes("o_proj") ? [dims.hidden, dims.heads * dims.headDim] : [...box.src];
  return [box.tensor(name, outShape, [...box.src.map(() => 0)], [...box.src], stridesOf(box.src), 0)];
};

/** [a, b] -> [b, a]: coordinate (x, y) lands at y * a + x; rows of the output are the source's columns. */
const transposeTensors: LayoutTensors = (row, box) => {
  const [a, b] = box.src as [number, number];
  return [box.tensor(row.hf[0] as string, [b, a], [0, 0], [a, b], [1, a], 1)];
};

/** q, k and v: name, first head, heads, whether its rows are rotary-permuted. */
const qkvParts = (row: MappingRow, dims: Dims): [string, number, number, boolean][] => [
  [row.hf[0] as string, 0, dims.heads, true],
  [row.hf[1] as string, dims.heads, dims.kvHeads, true],
  [row.hf[2] as string, dims.heads + dims.kvHeads, dims.kvHeads, false],
];

/** Head h's row x of input d lands at (h * hd + perm(x)) * D + d: the output's strides over (d, h, x). */
const qkvStrides = (dims: Dims) => [1, dims.headDim * dims.hidden, dims.hidden];

/** FusedQKVLinear's [3, D, H, hd]: q, k and v are its slices 0, 1 and 2. */
const fusedQkvTensors: LayoutTensors = (row, box, dims, perm) =>
  qkvParts(row, dims).map(([name, , count, rotary], j) =>
    box.tensor(
      name,
      [count * dims.headDim, dims.hidden],
      [j, 0, 0, 0],
      [1, dims.hidden, dims.heads, dims.headDim],
      [0, ...qkvStrides(dims)],
      2,
      rotary ? perm : undefined,
    ),
  );

/** FusedGroupedQKVLinear's [D, H + 2K, hd]: q, k and v are ranges of its heads, made in one pass (OutputTensor.pass). */
const groupedQkvTensors: LayoutTensors = (row, box, dims, perm) =>
  qkvParts(row, dims).map(([name, first, count, rotary]) => ({
    ...box.tensor(
      name,
      [count * dims.headDim, dims.hidden],
      [0, first, 0],
      [dims.hidden, count, dims.headDim],
      qkvStrides(dims),
      1,
      rotary ? perm : undefined,
    ),
    pass: `${box.l.array.path}#${box.i}`,
  }));

const LAYOUTS: Record<Layout, LayoutTensors> = {
  same: sameTensors,
  transpose: transposeTensors,
  qkv: (row, box, dims, perm) => (dims.qkv === "fused" ? fusedQkvTensors : groupedQkvTensors)(row, box, dims, perm),
};

const isModel = (p: string) => p === "model" || p.startsWith("model/");
const fmt = (s: readonly number[]) => `[${s.join(", ")}]`;
