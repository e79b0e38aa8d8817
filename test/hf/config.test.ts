import { expect, test } from "vitest";
import { buildConfig, configText } from "../../src/hf/config.js";
import type { Dims } from "../../src/hf/llama.js";

const v2: Dims = {
  layers: 32,
  hidden: 4096,
  heads: 32,
  kvHeads: 32,
  headDim: 128,
  ffn: 11008,
  vocab: 32768,
  tied: true,
  qkv: "fused",
  stacked: true,
};
const ids = { bos: 1, eos: 1, pad: 0 };
const v3: Dims = { ...v2, kvHeads: 8, ffn: 14336, vocab: 128256, tied: false, qkv: "grouped" };

test("fuji-7B-v2's shapes give Llama-2-7B's config, fuji v2's rope_theta 1e4 and 4096 positions", () => {
  const { config, version, sources } = buildConfig(v2, { dtype: "bfloat16" }, ids);
  expect(version).toBe("v2");
  expect(config).toMatchObject({
    architectures: ["LlamaForCausalLM"],
    model_type: "llama",
    hidden_size: 4096,
    intermediate_size: 11008,
    num_attention_heads: 32,
    num_key_value_heads: 32,
    num_hidden_layers: 32,
    head_dim: 128,
    vocab_size: 32768,
    tie_word_embeddings: true,
    rope_theta: 1e4,
    rms_norm_eps: 1e-5,
    max_position_embeddings: 4096,
    hidden_act: "silu",
    torch_dtype: "bfloat16",
  });
  expect(sources.rope_theta).toMatch(/fuji v2.s \(fuji.py ROPE_THETA\)/);
});

test("a 128256 vocabulary is fuji v3: rope_theta 5e5, 8192 positions", () => {
  const built = buildConfig(v3, { dtype: "float32" }, { bos: 128001, eos: 128001, pad: 128004 });
  expect(built.version).toBe("v3");
  expect(built.config).toMatchObject({
    rope_theta: 5e5,
    max_position_embeddings: 8192,
    num_key_value_heads: 8,
    tie_word_embeddings: false,
    torch_dtype: "float32",
  });
});

test("config.json and generation_config.json carry the special ids they are given", () => {
  const built = buildConfig(v2, { dtype: "bfloat16" }, { bos: 1, eos: 1, pad: 0 });
  expect(built.config).toMatchObject({ bos_token_id: 1, eos_token_id: 1, pad_token_id: 0 });
  expect(built.generation).toMatchObject({ bos_token_id: 1, eos_token_id: 1, pad_token_id: 0 });
});

test("flags win over the fuji version's defaults, and say so", () => {
  const built = buildConfig(v2, { dtype: "bfloat16", fujiVersion: "v1", ropeTheta: 5e5, rmsNormEps: 1e-6 }, ids);
  expect(built.config).toMatchObject({ rope_theta: 5e5, rms_norm_eps: 1e-6, max_position_embeddings: 2048 });
  expect(built.sources).toMatchObject({ rope_theta: "--rope-theta", rms_norm_eps: "--rms-norm-eps" });
  expect(built.versionSource).toBe("--fuji-version");
});

test("config files are written with sorted keys, two-space indent and a newline", () => {
  expect(configText({ b: 1, a: { d: 2, c: 3 } })).toBe('{\n  "a": {\n    "c": 3,\n    "d": 2\n  },\n  "b": 1\n}\n');
});
