import { describe, expect, test } from "vitest";
import { LAYER_ROWS, planExport, rotaryPermutation } from "../../src/hf/llama.js";
import { fujiArrays, memoryArray } from "./fuji-tree.js";

const DIMS = { layers: 2, dim: 16, heads: 2, headDim: 8, ffn: 24, vocab: 32 };
const sources = (arrays = fujiArrays(DIMS)) => arrays.map((a) => memoryArray(a, a.shape));

describe("the fuji -> LlamaForCausalLM mapping", () => {
  test("linear1_0 (SiLU's input in fuji's ('nn.silu', 'linear')) is gate_proj, linear1_1 up_proj, linear2 down_proj", () => {
    const row = (leaf: string) => LAYER_ROWS.find((r) => r.leaf === leaf)?.hf;
    expect(row("feed_forward/linear1_0/weight")).toEqual(["mlp.gate_proj.weight"]);
    expect(row("feed_forward/linear1_1/weight")).toEqual(["mlp.up_proj.weight"]);
    expect(row("feed_forward/linear2/weight")).toEqual(["mlp.down_proj.weight"]);
    expect(row("self_attention/norm/scale")).toEqual(["input_layernorm.weight"]);
    expect(row("feed_forward/norm/scale")).toEqual(["post_attention_layernorm.weight"]);
  });

  test("a stacked fused-QKV tree gives Llama's names and shapes, layer by layer, the embedding first", () => {
    const plan = planExport(sources());
    expect(plan.tensors.map((t) => t.name).slice(0, 11)).toEqual([
      "model.embed_tokens.weight",
      "model.layers.0.self_attn.q_proj.weight",
      "model.layers.0.self_attn.k_proj.weight",
      "model.layers.0.self_attn.v_proj.weight",
      "model.layers.0.self_attn.o_proj.weight",
      "model.layers.0.mlp.gate_proj.weight",
      "model.layers.0.mlp.up_proj.weight",
      "model.layers.0.mlp.down_proj.weight",
      "model.layers.0.input_layernorm.weight",
      "model.layers.0.post_attention_layernorm.weight",
      "model.layers.1.self_attn.q_proj.weight",
    ]);
    expect(plan.tensors.at(-1)?.name).toBe("model.norm.weight");
    const shape = (n: string) => plan.tensors.find((t) => t.name === n)?.shape;
    expect(shape("model.layers.1.self_attn.q_proj.weight")).toEqual([16, 16]);
    expect(shape("model.layers.1.self_attn.o_proj.weight")).toEqual([16, 16]);
    expect(shape("model.layers.1.mlp.gate_proj.weight")).toEqual([24, 16]);
    expect(shape("model.layers.1.mlp.down_proj.weight")).toEqual([16, 24]);
    expect(plan.dims).toEqual({
      layers: 2,
      hidden: 16,
      heads: 2,
      kvHeads: 2,
      headDim: 8,
      ffn: 24,
      vocab: 32,
      tied: true,
      qkv: "fused",
      stacked: true,
    });
  });

  test("a grouped-QKV tree [D, H + 2K, hd] gives K kv heads and k/v of K * hd rows", () => {
    const plan = planExport(sources(fujiArrays({ ...DIMS, heads: 4, kvHeads: 1 })));
    expect(plan.dims).toMatchObject({ heads: 4, kvHeads: 1, qkv: "grouped" });
    expect(plan.tensors.find((t) => t.name === "model.layers.0.self_attn.k_proj.weight")?.shape).toEqual([8, 16]);
    expect(plan.tensors.find((t) => t.name === "model.layers.0.self_attn.q_proj.weight")?.shape).toEqual([32, 16]);
  });

  test("an lm_head makes the embeddings untied and comes last as lm_head.weight", () => {
    const plan = planExport(sources(fujiArrays({ ...DIMS, lmHead: true })));
    expect(plan.dims.tied).toBe(false);
    expect(plan.tensors.at(-1)?.name).toBe("lm_head.weight");
  });

  test("per-layer leaves (transformer/layer{i}/...) map as the stacked ones do", () => {
    const stacked = fujiArrays(DIMS);
    const unstacked = stacked.flatMap((a) => {
      if (!a.path.includes("/repeat/layer/")) return [a];
      const per = a.data.length / DIMS.layers;
      return [0, 1].map((i) => ({
        path: a.path.replace("/repeat/layer/", `/layer${i}/`),
        shape: a.shape.slice(1),
        data: a.data.slice(i * per, (i + 1) * per),
      }));
    });
    const a = planExport(sources(stacked));
    const b = planExport(sources(unstacked));
    expect(b.tensors.map((t) => [t.name, t.shape])).toEqual(a.tensors.map((t) => [t.name, t.shape]));
    expect(b.dims.stacked).toBe(false);
  });

  test("leaves outside model/ are skipped and listed", () => {
    const extra = { path: "learner/optimizer/1/0/mu/decoder/emb/token_emb/weight", shape: [32, 16], data: new Float32Array(512) };
    const plan = planExport(sources([...fujiArrays(DIMS), extra]), ["prng_key"]);
    expect(plan.skipped).toEqual([extra.path, "prng_key"]);
  });

  test("refuses an unknown leaf under model/, naming it", () => {
    const bias = { path: "model/decoder/transformer/repeat/layer/feed_forward/linear2/bias", shape: [2, 16], data: new Float32Array(32) };
    expect(() => planExport(sources([...fujiArrays(DIMS), bias]))).toThrow(/linear2\/bias: unknown leaf/);
  });

  test("refuses a missing leaf, naming it", () => {
    const arrays = fujiArrays(DIMS).filter((a) => !a.path.endsWith("linear1_1/weight"));
    expect(() => planExport(sources(arrays))).toThrow(/feed_forward\/linear1_1\/weight: missing/);
  });

  test("refuses a shape that does not fit the others, naming the leaf", () => {
    const arrays = fujiArrays(DIMS).map((a) =>
      a.path.endsWith("linear2/weight") ? { ...a, shape: [2, 20, 16], data: new Float32Array(640) } : a,
    );
    expect(() => planExport(sources(arrays))).toThrow(/linear2\/weight: shape \[2, 20, 16\] does not fit \[2, 24, 16\]/);
  });
});

describe("the rotary permutation", () => {
  test("AXLearn rows (a0, a1, a2, a3) of a head of 4 become HF rows (a0, a2, a1, a3)", () => {
    // table[x] is AXLearn row x's HF row: pairs' first elements (0, 2) fill HF's first half.
    expect([...rotaryPermutation(4)]).toEqual([0, 2, 1, 3]);
    expect([...rotaryPermutation(8)]).toEqual([0, 4, 1, 5, 2, 6, 3, 7]);
  });

  // AXLearn, axlearn/common/attention.py apply_rotary_position_embeddings: sin/cos of angles [θ0..θ(d/2-1)] are
  // repeated pairwise (jnp.repeat(sin, 2)) and rotate_half(x) = stack([-x[1::2], x[::2]], -1) reshaped, so pair
  // (2j, 2j+1) turns by θj. The angles: sinusoidal_positional_embeddings' timescale(j) = theta^(2j/d).
  const axlearnRope = (q: number[], pos: number, theta: number) => {
    const d = q.length;
    const out = new Array<number>(d);
    for (let j = 0; j < d / 2; j++) {
      const a = pos / theta ** ((2 * j) / d);
      const [x, y] = [q[2 * j] as number, q[2 * j + 1] as number];
      out[2 * j] = x * Math.cos(a) - y * Math.sin(a);
      out[2 * j + 1] = y * Math.cos(a) + x * Math.sin(a);
    }
    return out;
  };
  // transformers, models/llama/modeling_llama.py: rotate_half(x) = cat(-x2, x1) with x1, x2 the halves, and
  // emb = cat(freqs, freqs) with inv_freq = 1 / base^(arange(0, d, 2) / d), so (j, j + d/2) turns by θj.
  const hfRope = (q: number[], pos: number, theta: number) => {
    const d = q.length;
    const out = new Array<number>(d);
    for (let j = 0; j < d / 2; j++) {
      const a = pos / theta ** ((2 * j) / d);
      const [x, y] = [q[j] as number, q[j + d / 2] as number];
      out[j] = x * Math.cos(a) - y * Math.sin(a);
      out[j + d / 2] = y * Math.cos(a) + x * Math.sin(a);
    }
    return out;
  };
  const permute = (v: number[], table: Int32Array) => {
    const out = new Array<number>(v.length);
    v.forEach((x, i) => {
      out[table[i] as number] = x;
    });
    return out;
  };

  test("HF's rotation of the permuted query is the permuted AXLearn rotation, so attention scores are the same", () => {
    const q = [0.3, -1.2, 0.7, 2.1, -0.4, 0.9, 1.5, -0.8];
    const k = [1.1, 0.2, -0.6, 0.4, 0.8, -1.7, 0.05, 0.6];
    const table = rotaryPermutation(8);
    for (const pos of [0, 1, 5, 37]) {
      const ax = axlearnRope(q, pos, 1e4);
      const hf = hfRope(permute(q, table), pos, 1e4);
      permute(ax, table).forEach((v, i) => expect(hf[i]).toBeCloseTo(v, 12));
      const score = (a: number[], b: number[]) => a.reduce((s, x, i) => s + x * (b[i] as number), 0);
      const axScore = score(axlearnRope(q, pos, 1e4), axlearnRope(k, 3, 1e4));
      expect(score(hfRope(permute(q, table), pos, 1e4), hfRope(permute(k, table), 3, 1e4))).toBeCloseTo(axScore, 12);
    }
  });
});
