#!/usr/bin/env python3
"""Small random Llama models made and saved by `transformers`, with the logits `transformers` computes for fixed
tokens: what an import into AXLearn (orbax2reg import-hf, or bench/python_import_route.py) must reproduce.

Usage:
    .venv-hf/bin/python test/python/make_llama.py OUT_DIR [VARIANT ...]

For each variant (VARIANTS below; all when none is named) it writes OUT_DIR/<variant>/:
    hf/               `LlamaForCausalLM(config)` (seeded) saved by `save_pretrained(..., max_shard_size=SHARD)` in
                      float32: config.json, model-0000i-of-0000n.safetensors, model.safetensors.index.json
    hf-bf16/          the same model saved in bfloat16 (`model.to(torch.bfloat16).save_pretrained(...)`)
    logits_f32.npy    [BATCH, SEQ, V] the float32 model's logits for the tokens
    logits_bf16.npy   [BATCH, SEQ, V] the bfloat16 model's (hf-bf16, computing in bfloat16), as float32
    expected.json     the variant, tokens, greedy next tokens in float32 and bfloat16, the logits' largest |x|

The models are what an import must handle: `mha-tied` has as many KV heads as heads (fuji's FusedQKVLinear) and
ties lm_head to the embedding; `gqa-untied` has fewer KV heads (FusedGroupedQKVLinear with num_kv_heads) and its own
lm_head. Both keep what a fuji model can represent: SwiGLU (silu), no biases, no rope_scaling, head_dim =
hidden/heads, and rms_norm_eps 1e-5 (fuji's RMSNorm eps). Weights are drawn with initializer_range INIT_STD and
every RMSNorm weight is perturbed away from ones, so a norm mapped to the wrong place moves the logits.

Greedy tokens compared in bfloat16 are only well-posed where the top two logits are further apart than bfloat16
moves them: of CANDIDATES random sequences, the BATCH kept are those whose every position's float32 top-1/top-2 gap
is the largest multiple of that position's largest bfloat16-vs-float32 logit difference (at least MIN_MARGIN; then
the bfloat16 and float32 greedy tokens agree).
"""

import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.dont_write_bytecode = True

SEED = 46
BATCH, SEQ = 2, 16
CANDIDATES = 256
MIN_MARGIN = 2.0
INIT_STD = 0.1
# Below each model's float32 size and above its largest tensor: several shards and an index.
SHARD = "300KB"

VARIANTS = {
    "mha-tied": dict(
        num_hidden_layers=2, hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=4,
        vocab_size=256, rope_theta=1e4, tie_word_embeddings=True,
    ),
    "gqa-untied": dict(
        num_hidden_layers=3, hidden_size=96, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=384, rope_theta=5e5, tie_word_embeddings=False,
    ),
}


def make_config(arch):
    from transformers import LlamaConfig

    return LlamaConfig(
        **{k: v for k, v in arch.items() if k != "rope_theta"},
        rope_parameters={"rope_type": "default", "rope_theta": arch["rope_theta"]},
        max_position_embeddings=64,
        rms_norm_eps=1e-5,
        hidden_act="silu",
        attention_bias=False,
        mlp_bias=False,
        initializer_range=INIT_STD,
        bos_token_id=1,
        eos_token_id=2,
    )


def logits_of(model, tokens):
    import torch

    with torch.no_grad():
        return model(input_ids=tokens, attention_mask=torch.ones_like(tokens), use_cache=False).logits.float().numpy()


def top2_gap(logits):
    import numpy as np

    s = np.sort(logits, axis=-1)
    return s[..., -1] - s[..., -2]


def shard_count(folder):
    with open(os.path.join(folder, "model.safetensors.index.json")) as f:
        return len(set(json.load(f)["weight_map"].values()))


def generate(out, variant, arch):
    import numpy as np
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(SEED)
    model = LlamaForCausalLM(make_config(arch)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.2 * torch.randn_like(p))
    root = os.path.join(out, variant)
    model.save_pretrained(os.path.join(root, "hf"), max_shard_size=SHARD)
    model.to(torch.bfloat16).save_pretrained(os.path.join(root, "hf-bf16"), max_shard_size=SHARD)

    f32_model = LlamaForCausalLM.from_pretrained(os.path.join(root, "hf"), dtype=torch.float32).eval()
    bf16_model = LlamaForCausalLM.from_pretrained(os.path.join(root, "hf-bf16"), dtype=torch.bfloat16).eval()
    gen = torch.Generator().manual_seed(SEED)
    candidates = torch.randint(0, arch["vocab_size"], (CANDIDATES, SEQ), generator=gen)
    f32_all, bf16_all = logits_of(f32_model, candidates), logits_of(bf16_model, candidates)
    margin = top2_gap(f32_all) / np.abs(bf16_all - f32_all).max(-1)
    chosen = np.argsort(-margin.min(-1), kind="stable")[:BATCH]
    tokens, f32, bf16 = candidates.numpy()[chosen], f32_all[chosen], bf16_all[chosen]
    min_margin = float(margin[chosen].min())
    greedy_f32, greedy_bf16 = f32.argmax(-1), bf16.argmax(-1)
    if min_margin < MIN_MARGIN or not (greedy_f32 == greedy_bf16).all():
        raise RuntimeError(f"{variant}: the best {BATCH} of {CANDIDATES} sequences have a margin of {min_margin:.2f}")
    np.save(os.path.join(root, "logits_f32.npy"), f32)
    np.save(os.path.join(root, "logits_bf16.npy"), bf16)
    expected = {
        "variant": variant,
        "seed": SEED,
        "tokens": tokens.tolist(),
        "greedy_f32": greedy_f32.tolist(),
        "greedy_bf16": greedy_bf16.tolist(),
        "min_margin": min_margin,
        "logits_max_abs": float(np.abs(f32).max()),
        "hf_bf16_vs_f32_max_abs": float(np.abs(bf16 - f32).max()),
        "shards": shard_count(os.path.join(root, "hf")),
    }
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(json.dumps({k: v for k, v in expected.items() if k not in ("tokens", "greedy_f32", "greedy_bf16")}))


def main(argv):
    if len(argv) < 2 or any(v not in VARIANTS for v in argv[2:]):
        sys.stderr.write(__doc__)
        return 2
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = os.path.abspath(argv[1])
    for variant in argv[2:] or VARIANTS:
        generate(out, variant, VARIANTS[variant])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
