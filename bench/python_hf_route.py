#!/usr/bin/env python3
"""The Hugging Face export an AXLearn user writes today, as a baseline for bench/export-hf.mjs.

Usage:
    .venv-hf/bin/python bench/python_hf_route.py ORBAX_STEP_DIR DEST [--dtype bfloat16|float32] [--max-shard-size 5GB]

Single process, CPU only, the way the issue describes it (and MaxText's to_huggingface.py does it):
1. restore the step's whole `state` item with the real orbax-checkpoint as numpy arrays (PyTreeCheckpointer +
   RestoreArgs(restore_type=np.ndarray) for every leaf, as bench/python_route.py): the whole tree in host memory,
   as AXLearn's own checkpointer would restore the trainer state;
2. map the fuji decoder (`model/decoder/...`, layers stacked on axis 0) to LlamaForCausalLM's names with numpy
   and torch: transposes, the fused QKV split into q/k/v (FusedQKVLinear [3, D, H, hd] or FusedGroupedQKVLinear
   [D, H + 2K, hd]), q and k rows permuted within each head from AXLearn's interleaved rotary pairs
   (`apply_rotary_position_embeddings` in axlearn/common/attention.py rotates (2i, 2i+1)) to Hugging Face's
   rotate-half layout (i, i + hd/2), as Meta-to-HF conversions do, then `.to(torch.bfloat16)`;
3. split the state dict into shards of at most --max-shard-size with huggingface_hub's
   `split_torch_state_dict_into_shards` (what `save_pretrained` uses), write each with
   `safetensors.torch.save_file(..., metadata={"format": "pt"})`, then `model.safetensors.index.json`, and
   `config.json` / `generation_config.json` through transformers' LlamaConfig and GenerationConfig.

Prints one JSON line with the phase timings. The mapping is written here independently of orbax2reg's, so the
benchmark's tensor-by-tensor comparison of the two outputs is a cross-check of both.
"""

import json
import os
import sys
import time

from orbax_restore import path_of, restore_state  # first: it puts JAX on the CPU before jax is imported

import jax
import numpy as np
import torch
from huggingface_hub import split_torch_state_dict_into_shards
from safetensors.torch import save_file


def rotate_half_rows(w: np.ndarray, heads: int) -> np.ndarray:
    """[heads*hd, D] rows from AXLearn's interleaved pairs to HF's halves: per head, even rows then odd rows."""
    hd = w.shape[0] // heads
    return w.reshape(heads, hd // 2, 2, w.shape[1]).transpose(0, 2, 1, 3).reshape(w.shape)


def main(argv) -> int:
    opts = {"--dtype": "bfloat16", "--max-shard-size": "5GB"}
    for name in list(opts):
        if name in argv:
            i = argv.index(name)
            opts[name] = argv[i + 1]
            argv = argv[:i] + argv[i + 2 :]
    dtype = {"bfloat16": torch.bfloat16, "float32": torch.float32}[opts["--dtype"]]
    step_dir, dest = (os.path.abspath(a) for a in argv)
    os.makedirs(dest, exist_ok=True)

    # 1. Restore the whole state, as numpy.
    t0 = time.monotonic()
    _, restored = restore_state(step_dir)
    flat = {path_of(kp): np.asarray(v) for kp, v in jax.tree_util.tree_flatten_with_path(restored)[0]}
    t1 = time.monotonic()

    # 2. Map to LlamaForCausalLM's names, layouts and dtype.
    dec = "model/decoder"
    layer = f"{dec}/transformer/repeat/layer"
    qkv = flat[f"{layer}/self_attention/attention/i_proj/i_proj/qkv_proj/weight"]
    o = flat[f"{layer}/self_attention/attention/o_proj/weight"]  # [L, D, H, hd]
    n_layers, dim, heads, hd = o.shape
    if qkv.ndim == 5:  # FusedQKVLinear [L, 3, D, H, hd]
        kv_heads = heads
    else:  # FusedGroupedQKVLinear [L, D, H + 2K, hd]
        kv_heads = (qkv.shape[2] - heads) // 2
    out = lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dtype)  # noqa: E731
    sd = {}
    emb = flat[f"{dec}/emb/token_emb/weight"]
    sd["model.embed_tokens.weight"] = out(emb)
    for i in range(n_layers):
        p = f"model.layers.{i}"
        w = qkv[i]
        if qkv.ndim == 5:
            q, k, v = w[0], w[1], w[2]  # each [D, H, hd]
        else:
            q, k, v = w[:, :heads], w[:, heads : heads + kv_heads], w[:, heads + kv_heads :]
        sd[f"{p}.self_attn.q_proj.weight"] = out(rotate_half_rows(q.reshape(dim, -1).T, heads))
        sd[f"{p}.self_attn.k_proj.weight"] = out(rotate_half_rows(k.reshape(dim, -1).T, kv_heads))
        sd[f"{p}.self_attn.v_proj.weight"] = out(v.reshape(dim, -1).T)
        sd[f"{p}.self_attn.o_proj.weight"] = out(o[i].reshape(dim, -1))
        sd[f"{p}.mlp.gate_proj.weight"] = out(flat[f"{layer}/feed_forward/linear1_0/weight"][i].T)
        sd[f"{p}.mlp.up_proj.weight"] = out(flat[f"{layer}/feed_forward/linear1_1/weight"][i].T)
        sd[f"{p}.mlp.down_proj.weight"] = out(flat[f"{layer}/feed_forward/linear2/weight"][i].T)
        sd[f"{p}.input_layernorm.weight"] = out(flat[f"{layer}/self_attention/norm/scale"][i])
        sd[f"{p}.post_attention_layernorm.weight"] = out(flat[f"{layer}/feed_forward/norm/scale"][i])
    sd["model.norm.weight"] = out(flat[f"{dec}/output_norm/scale"])
    tied = f"{dec}/lm_head/weight" not in flat
    if not tied:
        sd["lm_head.weight"] = out(flat[f"{dec}/lm_head/weight"])
    ffn = flat[f"{layer}/feed_forward/linear1_0/weight"].shape[2]
    t2 = time.monotonic()

    # 3. Shards, index, configs.
    split = split_torch_state_dict_into_shards(sd, max_shard_size=opts["--max-shard-size"])
    for filename, names in split.filename_to_tensors.items():
        save_file({n: sd[n] for n in names}, os.path.join(dest, filename), metadata={"format": "pt"})
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in sd.values())}, "weight_map": split.tensor_to_filename}
    with open(os.path.join(dest, "model.safetensors.index.json"), "w") as f:
        json.dump(index, f, indent=2, sort_keys=True)
        f.write("\n")
    t3 = time.monotonic()
    from transformers import GenerationConfig, LlamaConfig  # noqa: PLC0415 (timed apart: a user imports it too)

    # fuji's values per version (v1/v2 fused QKV, v3 grouped; v1's vocabulary is 32000): rope theta and sequence length.
    version = "v3" if qkv.ndim == 4 else "v1" if emb.shape[0] == 32000 else "v2"
    config = LlamaConfig(
        vocab_size=emb.shape[0],
        hidden_size=dim,
        intermediate_size=ffn,
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=hd,
        rms_norm_eps=1e-5,
        rope_theta=5e5 if version == "v3" else 1e4,
        max_position_embeddings={"v1": 2048, "v2": 4096, "v3": 8192}[version],
        tie_word_embeddings=tied,
        torch_dtype=opts["--dtype"],
        architectures=["LlamaForCausalLM"],
    )
    config.to_json_file(os.path.join(dest, "config.json"))
    GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id).to_json_file(
        os.path.join(dest, "generation_config.json")
    )
    t4 = time.monotonic()
    times = {
        "restore_s": round(t1 - t0, 2),
        "map_s": round(t2 - t1, 2),
        "save_s": round(t3 - t2, 2),
        "config_s": round(t4 - t3, 2),
        "seconds": round(t4 - t0, 2),
    }
    print(json.dumps({"tensors": len(sd), "shards": len(split.filename_to_tensors), **times}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
