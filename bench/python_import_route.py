#!/usr/bin/env python3
"""The Hugging Face to AXLearn import a team writes today, as a reference for the import's consumer tests and the
baseline of bench/import-hf.mjs.

Usage:
    PYTHONPATH=<a folder holding the safetensors package> \\
    .venv-axlearn/bin/python bench/python_import_route.py HF_DIR DEST_ROOT [--step N] [--dtype float32|bfloat16]

Single process, CPU only, the way a user does it since AXLearn deleted its converter (param_converter.py's
`parameters_from_llama_3`): the whole model in host memory.
1. load every tensor of the safetensors shards (model.safetensors.index.json's, or model.safetensors) with the
   `safetensors` library (`safe_open(..., framework="flax")`: jax arrays, the framework that reads bfloat16);
2. map them to the tree `fuji.model_config(...)` builds (axlearn/experiments/text/gpt/fuji.py, the layers under
   RepeatedTransformerLayer's `transformer/repeat/layer/`, stacked on axis 0), written here from AXLearn's source
   independently of orbax2reg's mapping:
   - q/k rows from Hugging Face's rotate-half layout (pairs (i, i + hd/2)) back to AXLearn's interleaved pairs
     (2i, 2i + 1), the pairs `apply_rotary_position_embeddings` in axlearn/common/attention.py rotates;
   - `FusedQKVLinear` (as many KV heads as heads): qkv_proj weight [3, D, H, hd]; `FusedGroupedQKVLinear`
     (num_kv_heads < heads): [D, H + 2K, hd], query heads then key heads then value heads (its forward splits at
     H and H + K);
   - o_proj [D, H, hd]; SwiGLU `linear1_0` (gate) and `linear1_1` (up) [D, F], `linear2` [F, D]; RMSNorm scales;
     `emb/token_emb/weight` [V, D]; `lm_head/weight` [V, D] unless the embeddings are tied;
   then cast to --dtype (default float32, the dtype fuji's model config keeps parameters in);
3. save `{"model": tree}` with AXLearn's `TensorStoreStateStorage.save_to_dir` into DEST_ROOT/step_<N, 8 digits>/
   with `write_index_file` as its commit callback (what `Checkpointer.save` does; Checkpointer itself skips step 0
   by its default save policy).

Prints one JSON line with the phase timings and the architecture.
"""

import json
import os
import sys
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.dont_write_bytecode = True

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from axlearn.common.checkpointer import TensorStoreStateStorage, build_step_dir, write_index_file  # noqa: E402
from jax.sharding import Mesh  # noqa: E402
from safetensors import safe_open  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def architecture(config):
    """The fuji model_config arguments of a Llama config.json, refusing what fuji cannot represent."""
    heads = config["num_attention_heads"]
    kv = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    rope = config.get("rope_parameters") or {}
    theta = rope.get("rope_theta", config.get("rope_theta", 1e4))
    scaling = config.get("rope_scaling") or ({k: v for k, v in rope.items() if k != "rope_theta"} or None)
    refused = {
        "head_dim": head_dim * heads != config["hidden_size"],
        "hidden_act": config.get("hidden_act", "silu") != "silu",
        "attention_bias": bool(config.get("attention_bias")),
        "mlp_bias": bool(config.get("mlp_bias")),
        "rope_scaling": scaling not in (None, {"rope_type": "default"}),
    }
    if any(refused.values()):
        raise SystemExit(f"config.json: fuji cannot represent {[k for k, v in refused.items() if v]}")
    return dict(
        num_layers=config["num_hidden_layers"],
        hidden_dim=config["hidden_size"],
        num_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=config["vocab_size"],
        ffn_dim=config["intermediate_size"],
        rope_theta=theta,
        shared_lm_head=bool(config.get("tie_word_embeddings", False)),
    )


def load_all(hf_dir):
    """Every tensor of the checkpoint, as jax arrays on the CPU."""
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            shards = sorted(set(json.load(f)["weight_map"].values()))
    else:
        shards = ["model.safetensors"]
    tensors = {}
    for shard in shards:
        with safe_open(os.path.join(hf_dir, shard), framework="flax") as f:
            for name in f.keys():
                tensors[name] = f.get_tensor(name)
    return tensors


def interleave_rows(w, heads):
    """[heads*hd, D] rows from Hugging Face's halves (i, i + hd/2) to AXLearn's pairs (2i, 2i + 1), per head."""
    hd = w.shape[0] // heads
    return w.reshape(heads, 2, hd // 2, w.shape[1]).transpose(0, 2, 1, 3).reshape(w.shape)


def heads_last(w, heads):
    """[heads*hd, D] (torch Linear's out x in) to AXLearn's [D, heads, hd]."""
    return w.reshape(heads, w.shape[0] // heads, w.shape[1]).transpose(2, 0, 1)


def fuji_tree(t, a, dtype):
    h, k, d = a["num_heads"], a["num_kv_heads"], a["hidden_dim"]

    def layer(i):
        p = f"model.layers.{i}."
        q = heads_last(interleave_rows(t[p + "self_attn.q_proj.weight"], h), h)
        kk = heads_last(interleave_rows(t[p + "self_attn.k_proj.weight"], k), k)
        v = heads_last(t[p + "self_attn.v_proj.weight"], k)
        if k == h:
            qkv = jnp.stack([q, kk, v])  # FusedQKVLinear [3, D, H, hd]
        else:
            qkv = jnp.concatenate([q, kk, v], axis=1)  # FusedGroupedQKVLinear [D, H + 2K, hd]
        return {
            "self_attention": {
                "norm": {"scale": t[p + "input_layernorm.weight"]},
                "attention": {
                    "i_proj": {"i_proj": {"qkv_proj": {"weight": qkv}}},
                    "o_proj": {"weight": t[p + "self_attn.o_proj.weight"].reshape(d, h, -1)},
                },
            },
            "feed_forward": {
                "norm": {"scale": t[p + "post_attention_layernorm.weight"]},
                "linear1_0": {"weight": t[p + "mlp.gate_proj.weight"].T},
                "linear1_1": {"weight": t[p + "mlp.up_proj.weight"].T},
                "linear2": {"weight": t[p + "mlp.down_proj.weight"].T},
            },
        }

    layers = [layer(i) for i in range(a["num_layers"])]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs).astype(dtype), *layers)
    decoder = {
        "emb": {"token_emb": {"weight": t["model.embed_tokens.weight"].astype(dtype)}},
        "transformer": {"repeat": {"layer": stacked}},
        "output_norm": {"scale": t["model.norm.weight"].astype(dtype)},
    }
    if not a["shared_lm_head"]:
        decoder["lm_head"] = {"weight": t["lm_head.weight"].astype(dtype)}
    return {"decoder": decoder}


def main(argv):
    opts = {"--step": "0", "--dtype": "float32"}
    for name in list(opts):
        if name in argv:
            i = argv.index(name)
            opts[name] = argv[i + 1]
            argv = argv[:i] + argv[i + 2 :]
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    hf_dir, dest_root = (os.path.abspath(x) for x in argv[1:])
    step, dtype = int(opts["--step"]), jnp.dtype(opts["--dtype"])
    with open(os.path.join(hf_dir, "config.json")) as f:
        arch = architecture(json.load(f))

    t0 = time.monotonic()
    tensors = load_all(hf_dir)
    t1 = time.monotonic()
    model = fuji_tree(tensors, arch, dtype)
    del tensors
    jax.block_until_ready(model)
    t2 = time.monotonic()
    storage = TensorStoreStateStorage.default_config().instantiate()
    ckpt_dir = build_step_dir(dest_root, step=step)
    with Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model")):
        storage.save_to_dir(step=step, state={"model": model}, ckpt_dir=ckpt_dir, on_commit_callback=write_index_file)
        storage.wait_until_finished()
    storage.stop()
    t3 = time.monotonic()
    print(json.dumps({"arch": arch, "step": step, "dtype": str(dtype), "load_s": t1 - t0, "map_s": t2 - t1,
                      "save_s": t3 - t2, "arrays": len(jax.tree.leaves(model))}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
