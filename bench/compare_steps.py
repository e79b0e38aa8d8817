#!/usr/bin/env python3
"""Compares two AXLearn regular steps array by array (one pair in memory at a time): the arrays their `index`
files list, read with TensorStore, must have the same dtype, shape and bytes.

Usage:
    .venv-axlearn/bin/python bench/compare_steps.py STEP_A STEP_B

Prints one JSON line: arrays, equal, bytes compared, differences (at most 20).
"""

import json
import os
import sys

import tensorstore as ts


def index(step):
    with open(os.path.join(step, "index")) as f:
        return {path: value for path, value in json.load(f) if isinstance(value, dict)}


def read(step, path):
    spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": os.path.join(step, "gda", path)}}
    return ts.open(spec, open=True).result().read().result()


def main(argv):
    if len(argv) != 3:
        sys.stderr.write(__doc__)
        return 2
    a, b = index(argv[1]), index(argv[2])
    diffs = [f"{p}: only in {argv[1] if p in a else argv[2]}" for p in sorted(set(a) ^ set(b))]
    equal, compared = 0, 0
    for path in sorted(set(a) & set(b)):
        x, y = read(argv[1], path), read(argv[2], path)
        compared += x.nbytes
        if x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes():
            equal += 1
        else:
            diffs.append(f"{path}: {x.dtype}{x.shape} against {y.dtype}{y.shape}")
    print(json.dumps({"arrays": len(set(a) | set(b)), "equal": equal, "bytes": compared, "differences": diffs[:20]}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
