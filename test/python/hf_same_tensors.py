#!/usr/bin/env python3
"""Compares the tensors of two Hugging Face checkpoint folders with the `safetensors` library, whatever their
sharding: the same names, and for each the same dtype, shape and bytes.

Usage:
    .venv-hf/bin/python test/python/hf_same_tensors.py DIR_A DIR_B

Prints one JSON line: tensors, equal, differences (at most 20). Exit 0 either way (the caller reads them).
"""

import json
import os
import sys

sys.dont_write_bytecode = True


def tensors(folder):
    """name -> (file, dtype, shape) of every tensor the folder's index (or single model.safetensors) holds."""
    from safetensors import safe_open

    index = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    out = {}
    for file in files:
        with safe_open(os.path.join(folder, file), framework="pt") as f:
            for name in f.keys():
                s = f.get_slice(name)
                out[name] = (os.path.join(folder, file), s.get_dtype(), list(s.get_shape()))
    return out


def raw(file, name):
    """The tensor's bytes as stored (torch reads every safetensors dtype)."""
    import torch
    from safetensors import safe_open

    with safe_open(file, framework="pt") as f:
        t = f.get_tensor(name).contiguous()
    return t.view(-1).view(dtype=torch.uint8).numpy().tobytes()


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    a, b = tensors(argv[1]), tensors(argv[2])
    diffs = [f"{n}: only in {argv[1] if n in a else argv[2]}" for n in sorted(set(a) ^ set(b))]
    equal = 0
    for name in sorted(set(a) & set(b)):
        (fa, da, sa), (fb, db, sb) = a[name], b[name]
        if (da, sa) != (db, sb):
            diffs.append(f"{name}: {da}{sa} against {db}{sb}")
        elif raw(fa, name) != raw(fb, name):
            diffs.append(f"{name}: {da}{sa}, different bytes")
        else:
            equal += 1
    print(json.dumps({"tensors": len(set(a) | set(b)), "equal": equal, "differences": diffs[:20]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
