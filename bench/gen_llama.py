#!/usr/bin/env python3
"""Writes the import benchmark's sources: Hugging Face Llama checkpoints (config.json, safetensors shards and
model.safetensors.index.json, as `save_pretrained` lays them out), made tensor by tensor from numpy with the
`safetensors` library, so that memory stays at one tensor whatever the model's size (no torch model is built).

Usage:
    .venv-hf/bin/python bench/gen_llama.py SIZE [OUT_DIR]   # SIZE: 2gb | 7b; default bench/.generated/llama-SIZE

SIZES:
    2gb   float32, hidden 2048, 8 layers, ffn 5504, 16 heads with 4 KV heads, vocab 32000, untied: ~1.9 GB, 1 GB
          shards; the same bytes in and out for `import-hf` (float32 out) as for `convert` of bench/gen_fuji.py's
          ~2 GB step;
    7b    bfloat16, Llama-2-7B's widths (hidden 4096, ffn 11008, 32 heads, vocab 32000, untied) and 32 layers:
          ~13.5 GB, 5 GB shards (what Meta's published checkpoints use). --layers N writes fewer layers.
Values: seeded normals times 0.02 (norm weights around 1), a fresh generator per tensor so any tensor can be
regenerated alone. The folder is cached: OUT_DIR/generated.json records VERSION and the size; a rerun with the same
does nothing. Prints one JSON line: the folder, bytes, tensors, shards, seconds.
"""

import json
import os
import sys
import time

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

VERSION = 1
SIZES = {
    "2gb": dict(hidden=2048, layers=8, ffn=5504, heads=16, kv_heads=4, vocab=32000, dtype="float32", shard=1 << 30),
    "7b": dict(hidden=4096, layers=32, ffn=11008, heads=32, kv_heads=32, vocab=32000, dtype="bfloat16", shard=5 * 10**9),
}
NP_DTYPE = {"float32": np.float32, "bfloat16": ml_dtypes.bfloat16}


def tensors(d):
    """(name, shape) in the order `save_pretrained` writes them: embedding, the layers, the final norm, lm_head."""
    h, f, hd = d["hidden"], d["ffn"], d["hidden"] // d["heads"]
    yield "model.embed_tokens.weight", (d["vocab"], h)
    for i in range(d["layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        yield p + "self_attn.q_proj.weight", (d["heads"] * hd, h)
        yield p + "self_attn.k_proj.weight", (d["kv_heads"] * hd, h)
        yield p + "self_attn.v_proj.weight", (d["kv_heads"] * hd, h)
        yield p + "self_attn.o_proj.weight", (h, d["heads"] * hd)
        yield p + "post_attention_layernorm.weight", (h,)
        yield p + "mlp.gate_proj.weight", (f, h)
        yield p + "mlp.up_proj.weight", (f, h)
        yield p + "mlp.down_proj.weight", (h, f)
    yield "model.norm.weight", (h,)
    yield "lm_head.weight", (d["vocab"], h)


def value(name, shape, dtype, seed):
    rng = np.random.default_rng([seed, *name.encode()])
    x = rng.standard_normal(shape, dtype=np.float32)
    x = 1 + 0.1 * x if name.endswith("norm.weight") else 0.02 * x
    return x.astype(NP_DTYPE[dtype])


def config(d):
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": d["hidden"],
        "intermediate_size": d["ffn"],
        "num_hidden_layers": d["layers"],
        "num_attention_heads": d["heads"],
        "num_key_value_heads": d["kv_heads"],
        "head_dim": d["hidden"] // d["heads"],
        "vocab_size": d["vocab"],
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": d["dtype"],
    }


def main(argv):
    args = [a for a in argv[1:] if not a.startswith("--")]
    layers = int(argv[argv.index("--layers") + 1]) if "--layers" in argv else None
    if layers is not None:
        args.remove(str(layers))
    if not args or args[0] not in SIZES:
        sys.stderr.write(__doc__)
        return 2
    size = args[0]
    d = dict(SIZES[size])
    if layers is not None:
        d["layers"] = layers
    out = os.path.abspath(args[1] if len(args) > 1 else os.path.join("bench/.generated", f"llama-{size}"))
    record = os.path.join(out, "generated.json")
    want = {"version": VERSION, "size": size, "dims": d}
    if os.path.exists(record):
        with open(record) as f:
            got = json.load(f)
        if {k: got.get(k) for k in want} == want:
            print(json.dumps(got))
            return 0
    os.makedirs(out, exist_ok=True)
    for f in os.listdir(out):
        if f.endswith(".safetensors") or f in ("generated.json", "model.safetensors.index.json", "config.json"):
            os.remove(os.path.join(out, f))
    t0 = time.monotonic()
    itemsize = np.dtype(NP_DTYPE[d["dtype"]]).itemsize
    # Shards as save_pretrained cuts them: tensors in order, a new shard when the next would pass the size.
    shards, current, size_now = [], [], 0
    for name, shape in tensors(d):
        n = int(np.prod(shape)) * itemsize
        if current and size_now + n > d["shard"]:
            shards.append(current)
            current, size_now = [], 0
        current.append((name, shape))
        size_now += n
    shards.append(current)
    weight_map, total = {}, 0
    for i, shard in enumerate(shards):
        file = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        # One tensor in memory at a time is not what save_file takes (a dict): a shard's tensors are made and
        # written together, at most one shard (<= 5 GB) in memory.
        data = {name: value(name, shape, d["dtype"], VERSION) for name, shape in shard}
        save_file(data, os.path.join(out, file), metadata={"format": "pt"})
        for name, x in data.items():
            weight_map[name] = file
            total += x.nbytes
        del data
    with open(os.path.join(out, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2)
    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config(d), f, indent=2)
    info = {**want, "dir": out, "bytes": total, "tensors": len(weight_map), "shards": len(shards),
            "seconds": round(time.monotonic() - t0, 1)}
    with open(record, "w") as f:
        json.dump(info, f)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
