#!/usr/bin/env python3
"""Checks a Hugging Face export with the real consumers: the `safetensors` library and `transformers`' Llama.

Usage:
    .venv-hf/bin/python test/python/hf_check.py EXPORT_DIR FIXTURE_DIR DTYPE

EXPORT_DIR: what `orbax2reg export-hf` wrote (config.json, model-*.safetensors, model.safetensors.index.json).
FIXTURE_DIR: one variant of test/fixtures-gen/axlearn_fuji.py's output: expected.json (tokens, architecture, greedy
tokens), logits_f32.npy and logits_bf16.npy (AXLearn's own forward pass, float32 and bfloat16).
DTYPE: float32 or bfloat16, the --dtype the export was made with.

Checks, each adding to "problems" when it fails:
- files: every shard opened with `safetensors.safe_open(framework="pt")`; the index's weight_map names exactly the
  tensors the shards hold, each in the shard it names; its metadata.total_size is the sum of their bytes; each
  shard's metadata says format "pt" (what transformers writes); every tensor has the export's dtype and the shape
  LlamaForCausalLM has for the fixture's architecture;
- config: `LlamaConfig` read from config.json gives the fixture's layers, sizes, heads, kv heads, head dim,
  vocabulary, tied embeddings, rope theta and RMSNorm eps; generation_config.json, where written, reads with
  `GenerationConfig.from_pretrained`;
- load: `LlamaForCausalLM.from_pretrained(EXPORT_DIR, dtype=float32)` with no missing, unexpected or mismatched
  weights;
- logits: the model's float32 logits for the fixture's tokens against AXLearn's float32 logits. For a float32
  export the largest absolute difference must be within F32_TOLERANCE (below); a bfloat16 export rounds every
  weight, so its float32 logits are only reported;
- greedy: the model loaded with dtype=bfloat16 (and computing in bfloat16, as AXLearn's bfloat16 forward does)
  must pick AXLearn's greedy next token at every position.
Prints one JSON object: the figures, the problems (empty when all hold) and the same problems by check
("by_check": files, config, load, logits, greedy). Exit 0 either way (the caller
reads the problems); exit 2 for bad arguments.
"""

import json
import os
import sys

os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # CPU only, whatever the machine has
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local directory: never ask the Hub
sys.dont_write_bytecode = True

# Float32 rounding: AXLearn (XLA) and torch sum the same products in different orders, compute the rotary sin/cos
# from differently arranged float32 expressions and fuse differently, so equal weights give logits that differ by
# some units in the last place of every intermediate, amplified by the layers. Relative to the logits' size that is
# ~1e-6 here (measured: see the JSON's f32_max_abs_diff); 1e-4 of the largest logit is 100x above that and still
# 1000x below what a wrong layout does (a swapped gate/up, an unpermuted rotary half or a misplaced norm moves
# logits by 1e-1 and more).
F32_RELATIVE_TOLERANCE = 1e-4

CHECKS = ("files", "config", "load", "logits", "greedy")


def problem(out, check, message):
    out["problems"].append(message)
    out["by_check"][check].append(message)


SAFETENSORS_DTYPE = {"float32": "F32", "bfloat16": "BF16"}
BYTES = {"F32": 4, "BF16": 2}


def expected_shapes(e):
    """LlamaForCausalLM's tensor names and shapes for the fixture's architecture (modeling_llama.py)."""
    d, v, f = e["hidden_dim"], e["vocab_size"], e["intermediate_size"]
    h, k, hd = e["num_heads"], e["num_kv_heads"], e["head_dim"]
    shapes = {"model.embed_tokens.weight": [v, d], "model.norm.weight": [d]}
    if not e["shared_lm_head"]:
        shapes["lm_head.weight"] = [v, d]
    for i in range(e["num_layers"]):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": [d],
                p + "post_attention_layernorm.weight": [d],
                p + "self_attn.q_proj.weight": [h * hd, d],
                p + "self_attn.k_proj.weight": [k * hd, d],
                p + "self_attn.v_proj.weight": [k * hd, d],
                p + "self_attn.o_proj.weight": [d, h * hd],
                p + "mlp.gate_proj.weight": [f, d],
                p + "mlp.up_proj.weight": [f, d],
                p + "mlp.down_proj.weight": [d, f],
            }
        )
    return shapes


def check_files(export, e, out):
    from safetensors import safe_open

    with open(os.path.join(export, "model.safetensors.index.json")) as f:
        index = json.load(f)
    weight_map = index["weight_map"]
    shards = sorted(set(weight_map.values()))
    out["shards"] = len(shards)
    held, dtypes, total = {}, set(), 0
    for shard in shards:
        with safe_open(os.path.join(export, shard), framework="pt") as f:
            meta = f.metadata() or {}
            if meta.get("format") != "pt":
                problem(out, "files", f"{shard}: metadata format {meta.get('format')!r}, not 'pt'")
            for name in f.keys():
                s = f.get_slice(name)
                dtype, shape = s.get_dtype(), list(s.get_shape())
                if name in held:
                    problem(out, "files", f"{name}: in {held[name][0]} and {shard}")
                held[name] = (shard, dtype, shape)
                dtypes.add(dtype)
                n = 1
                for x in shape:
                    n *= x
                total += n * BYTES.get(dtype, 0)
    out["tensors"] = len(held)
    out["dtypes"] = sorted(dtypes)
    for name, shard in weight_map.items():
        if name not in held:
            problem(out, "files", f"{name}: the index names {shard}, which does not hold it")
        elif held[name][0] != shard:
            problem(out, "files", f"{name}: the index names {shard}, but {held[name][0]} holds it")
    for name in held:
        if name not in weight_map:
            problem(out, "files", f"{name}: in {held[name][0]} but not in the index")
    declared = index.get("metadata", {}).get("total_size")
    if declared != total:
        problem(out, "files", f"index metadata.total_size {declared}, the tensors' bytes {total}")
    want_dtype = SAFETENSORS_DTYPE[out["dtype"]]
    want = expected_shapes(e)
    for name, shape in want.items():
        if name not in held:
            problem(out, "files", f"{name}: missing")
            continue
        if held[name][2] != shape:
            problem(out, "files", f"{name}: shape {held[name][2]}, LlamaForCausalLM's {shape}")
        if held[name][1] != want_dtype:
            problem(out, "files", f"{name}: dtype {held[name][1]}, the export's {want_dtype}")
    for name in held:
        if name not in want:
            problem(out, "files", f"{name}: not a tensor of LlamaForCausalLM for this architecture")


def rope_theta(config):
    params = getattr(config, "rope_parameters", None) or {}
    return params.get("rope_theta", getattr(config, "rope_theta", None))


def check_config(export, e, out):
    from transformers import LlamaConfig

    c = LlamaConfig.from_pretrained(export)
    got = {
        "num_hidden_layers": c.num_hidden_layers,
        "hidden_size": c.hidden_size,
        "intermediate_size": c.intermediate_size,
        "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads,
        "head_dim": getattr(c, "head_dim", c.hidden_size // c.num_attention_heads),
        "vocab_size": c.vocab_size,
        "tie_word_embeddings": c.tie_word_embeddings,
        "rope_theta": rope_theta(c),
        "rms_norm_eps": c.rms_norm_eps,
        "hidden_act": c.hidden_act,
        "attention_bias": c.attention_bias,
        "mlp_bias": c.mlp_bias,
    }
    want = {
        "num_hidden_layers": e["num_layers"],
        "hidden_size": e["hidden_dim"],
        "intermediate_size": e["intermediate_size"],
        "num_attention_heads": e["num_heads"],
        "num_key_value_heads": e["num_kv_heads"],
        "head_dim": e["head_dim"],
        "vocab_size": e["vocab_size"],
        "tie_word_embeddings": e["shared_lm_head"],
        "rope_theta": e["rope_theta"],
        "rms_norm_eps": e["rms_norm_eps"],
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
    }
    out["config"] = got
    for k, v in want.items():
        if got[k] != v:
            problem(out, "config", f"config.json {k}: {got[k]!r}, the model's {v!r}")


def check_generation_config(export, out):
    from transformers import GenerationConfig

    if os.path.exists(os.path.join(export, "generation_config.json")):
        try:
            out["generation_config"] = GenerationConfig.from_pretrained(export).to_diff_dict()
        except Exception as e:  # noqa: BLE001 - reported as a problem
            problem(out, "config", f"generation_config.json: {type(e).__name__}: {e}")


def load(export, dtype, out, label):
    import torch
    from transformers import LlamaForCausalLM

    model, info = LlamaForCausalLM.from_pretrained(export, dtype=dtype, output_loading_info=True)
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        if info.get(kind):
            problem(out, "load", f"from_pretrained({label}) {kind}: {sorted(map(str, info[kind]))[:10]}")
    model.eval()
    if model.dtype != dtype:
        problem(out, "load", f"from_pretrained({label}) gave a {model.dtype} model")
    torch.set_grad_enabled(False)
    return model


def logits_of(model, tokens):
    import torch

    ids = torch.tensor(tokens, dtype=torch.long)
    return model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits.float().numpy()


def main(argv):
    if len(argv) != 4 or argv[3] not in SAFETENSORS_DTYPE:
        sys.stderr.write(__doc__)
        return 2
    export, fixture, dtype = argv[1], argv[2], argv[3]
    import numpy as np
    import torch
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # "Loading weights" bars on stderr
    torch.manual_seed(0)
    with open(os.path.join(fixture, "expected.json")) as f:
        e = json.load(f)
    with open(os.path.join(export, "config.json")) as f:
        raw = json.load(f)
    out = {"variant": e["variant"], "dtype": dtype, "problems": [], "by_check": {k: [] for k in CHECKS}}
    # transformers 5 writes "dtype", 4.x "torch_dtype"; either names the weights' dtype.
    declared = raw.get("dtype", raw.get("torch_dtype"))
    if declared != dtype:
        problem(out, "config", f"config.json dtype {declared!r}, the export's {dtype!r}")
    check_files(export, e, out)
    check_config(export, e, out)
    check_generation_config(export, out)

    ax_f32 = np.load(os.path.join(fixture, "logits_f32.npy"))
    ax_bf16 = np.load(os.path.join(fixture, "logits_bf16.npy"))
    tokens = e["tokens"]

    f32 = logits_of(load(export, torch.float32, out, "dtype=float32"), tokens)
    scale = float(np.abs(ax_f32).max())
    diff = float(np.abs(f32 - ax_f32).max())
    out["f32_max_abs_diff"] = diff
    out["f32_max_rel_diff"] = diff / scale
    out["logits_max_abs"] = scale
    out["greedy_f32_equal"] = bool((f32.argmax(-1) == np.array(e["greedy_f32"])).all())
    if out["dtype"] == "float32":
        tolerance = F32_RELATIVE_TOLERANCE * scale
        out["f32_tolerance"] = tolerance
        if not diff <= tolerance:
            problem(
                out,
                "logits",
                f"float32 logits differ from AXLearn's by up to {diff:.3g} (tolerance {tolerance:.3g})"
            )
        if not out["greedy_f32_equal"]:
            problem(out, "logits", "float32 greedy tokens differ from AXLearn's")

    bf16 = logits_of(load(export, torch.bfloat16, out, "dtype=bfloat16"), tokens)
    greedy = bf16.argmax(-1)
    out["bf16_max_abs_diff_vs_axlearn_bf16"] = float(np.abs(bf16 - ax_bf16).max())
    out["bf16_max_abs_diff_vs_axlearn_f32"] = float(np.abs(bf16 - ax_f32).max())
    want = np.array(e["greedy_bf16"])
    out["greedy_bf16_positions"] = int(want.size)
    out["greedy_bf16_equal"] = int((greedy == want).sum())
    if out["greedy_bf16_equal"] != want.size:
        where = [list(map(int, p)) for p in np.argwhere(greedy != want)[:5]]
        problem(
            out,
            "greedy",
            f"bfloat16 greedy tokens differ from AXLearn's at {want.size - out['greedy_bf16_equal']} of {want.size} "
            f"positions (first [sequence, position]: {where})"
        )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
