import { UsageError } from "../errors.js";
import type { Dims } from "./llama.js";
import type { SpecialIds } from "./tokenizer.js";

/**
 * config.json and generation_config.json of LlamaForCausalLM: what the shapes say, and, for what they cannot
 * say, the flags or the fuji version's values (axlearn/experiments/text/gpt/fuji.py: ROPE_THETA,
 * MAX_SEQUENCE_LENGTH, and model_config's RMSNorm eps=1e-5), each value with its source.
 */
export type FujiVersion = "v1" | "v2" | "v3";

export interface FujiDefaults {
  readonly ropeTheta: number;
  readonly maxPositionEmbeddings: number;
  readonly rmsNormEps: number;
}

const EPS = 1e-5;

/** fuji.py: ROPE_THETA {V1: 1e4, V2: 1e4, V3: 5e5}, MAX_SEQUENCE_LENGTH {V1: 2048, V2: 4096, V3: 8192}. */
export const FUJI: Readonly<Record<FujiVersion, FujiDefaults>> = {
  v1: { ropeTheta: 1e4, maxPositionEmbeddings: 2048, rmsNormEps: EPS },
  v2: { ropeTheta: 1e4, maxPositionEmbeddings: 4096, rmsNormEps: EPS },
  v3: { ropeTheta: 5e5, maxPositionEmbeddings: 8192, rmsNormEps: EPS },
};

export interface ConfigFlags {
  readonly fujiVersion?: FujiVersion;
  readonly ropeTheta?: number;
  readonly rmsNormEps?: number;
  readonly maxPositionEmbeddings?: number;
  readonly dtype: "bfloat16" | "float32";
}

export interface BuiltConfig {
  readonly version: FujiVersion;
  readonly versionSource: string;
  readonly config: Record<string, unknown>;
  /** Where each value of config.json came from. */
  readonly sources: Record<string, string>;
  readonly generation: Record<string, unknown>;
}

/**
 * The fuji version when not given: v3 has vocab 128256 (128 * 1024 in older fuji.py) and grouped KV; v1 and v2
 * share a 32k vocab and the same tree (v2-70B has grouped KV too), so a 32k model is taken as v2.
 */
export function guessVersion(dims: Dims): { version: FujiVersion; source: string } {
  if (dims.vocab === 128256 || dims.vocab === 131072) return { version: "v3", source: `vocabulary ${dims.vocab} is fuji v3's` };
  if (dims.vocab === 32768) return { version: "v2", source: "vocabulary 32768 is v1's and v2's: v2 assumed, --fuji-version v1 for v1" };
  return dims.qkv === "grouped"
    ? { version: "v3", source: `grouped QKV: v3 assumed, vocabulary ${dims.vocab} is no fuji one's` }
    : { version: "v2", source: `fused QKV: v2 assumed, vocabulary ${dims.vocab} is no fuji one's` };
}

/**
 * config.json and generation_config.json for `dims`; `ids` are the special tokens' ids (vocabularies.ts: the
 * tokenizer's, else fuji's for the vocabulary), so that `generate` stops at AXLearn's end of sequence.
 */
export function buildConfig(dims: Dims, flags: ConfigFlags, ids: SpecialIds): BuiltConfig {
  const guessed = guessVersion(dims);
  const version = flags.fujiVersion ?? guessed.version;
  const versionSource = flags.fujiVersion === undefined ? guessed.source : "--fuji-version";
  const d = FUJI[version];
  const from = (flag: string, value: number | undefined, fallback: number, what: string): [number, string] =>
    value === undefined ? [fallback, `fuji ${version}'s (fuji.py ${what})`] : [value, flag];
  const [ropeTheta, ropeSource] = from("--rope-theta", flags.ropeTheta, d.ropeTheta, "ROPE_THETA");
  const [eps, epsSource] = from("--rms-norm-eps", flags.rmsNormEps, d.rmsNormEps, "model_config: RMSNorm eps=1e-5");
  const [maxPos, maxPosSource] = from(
    "--max-position-embeddings",
    flags.maxPositionEmbeddings,
    d.maxPositionEmbeddings,
    "MAX_SEQUENCE_LENGTH",
  );
  if (!(ropeTheta > 0) || !(eps > 0) || !Number.isSafeInteger(maxPos) || maxPos < 1)
    throw new UsageError("--rope-theta and --rms-norm-eps must be positive, --max-position-embeddings a positive integer");
  const shapes = "shapes of the tree";
  // Keys sorted, as transformers' to_json_string (sort_keys=True).
  const config: Record<string, unknown> = {
    architectures: ["LlamaForCausalLM"],
    attention_bias: false,
    attention_dropout: 0.0,
    bos_token_id: ids.bos,
    eos_token_id: ids.eos,
    head_dim: dims.headDim,
    hidden_act: "silu",
    hidden_size: dims.hidden,
    initializer_range: 0.02,
    intermediate_size: dims.ffn,
    max_position_embeddings: maxPos,
    mlp_bias: false,
    model_type: "llama",
    num_attention_heads: dims.heads,
    num_hidden_layers: dims.layers,
    num_key_value_heads: dims.kvHeads,
    pad_token_id: ids.pad,
    pretraining_tp: 1,
    rms_norm_eps: eps,
    rope_scaling: null,
    rope_theta: ropeTheta,
    tie_word_embeddings: dims.tied,
    torch_dtype: flags.dtype,
    use_cache: true,
    vocab_size: dims.vocab,
  };
  const idSource = "the tokenizer (vocabularies.ts: fuji starts each document with EOS, input_lm.py)";
  const sources: Record<string, string> = {
    bos_token_id: idSource,
    eos_token_id: idSource,
    pad_token_id: idSource,
    head_dim: `${shapes} (o_proj [.., hidden, heads, head_dim])`,
    hidden_act: "fuji's SwiGLU (activation_fn nn.silu on linear1_0)",
    hidden_size: `${shapes} (token_emb [vocab, hidden])`,
    intermediate_size: `${shapes} (linear1_0 [.., hidden, ffn])`,
    max_position_embeddings: maxPosSource,
    num_attention_heads: `${shapes} (o_proj)`,
    num_hidden_layers: dims.stacked ? `${shapes} (stacked axis 0)` : `${shapes} (layer{i} leaves)`,
    num_key_value_heads:
      dims.qkv === "grouped"
        ? `${shapes} (FusedGroupedQKVLinear heads = heads + 2 * kv_heads)`
        : `${shapes} (FusedQKVLinear: kv_heads = heads)`,
    rms_norm_eps: epsSource,
    rope_theta: ropeSource,
    tie_word_embeddings: dims.tied ? "no decoder/lm_head (shared with the embedding)" : "decoder/lm_head present",
    torch_dtype: "--dtype",
    vocab_size: `${shapes} (token_emb)`,
  };
  const generation = { _from_model_config: true, bos_token_id: ids.bos, eos_token_id: ids.eos, pad_token_id: ids.pad };
  return { version, versionSource, config, sources, generation };
}

/** JSON as transformers writes config files: indent 2, keys sorted, newline at the end. */
export function configText(value: Record<string, unknown>): string {
  return `${JSON.stringify(sortKeys(value), null, 2)}\n`;
}

function sortKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(sortKeys);
  if (v !== null && typeof v === "object") {
    return Object.fromEntries(
      Object.keys(v)
        .sort()
        .map((k) => [k, sortKeys((v as Record<string, unknown>)[k])]),
    );
  }
  return v;
}
