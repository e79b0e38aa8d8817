#!/usr/bin/env python3
"""Writes the export benchmark's finely cut sources: bench/gen_fuji.py's params (the same values, bit for bit)
as a regular step (TensorStore zarr v2, zstd level 1, the layout AXLearn's regular checkpointer writes: `index`
and gda/<path>/), each sharded weight cut in N chunks on the axis fuji's "fsdp" mesh shards it (chunk = shard,
as a save on N devices cuts it), every chunk spanning all layers; token_emb and the norms one chunk each.

Usage:
    .venv/bin/python bench/gen_fuji_cut.py N [OUT_DIR]   # default bench/.generated/fuji-cut-N

Why not gen_fuji.py on an N-device mesh: jax's CPU client with 256 or 1,024 forced host devices took over 12 GB
before the first array on the benchmark machine (23 GB, shared) and was killed; the chunking, not the writer, is
what the benchmark measures, and export-hf reads a regular step's chunks through the same streaming decoder as an
Orbax step's. Params only: export-hf reads nothing else. Cached by VERSION like the other generators.
"""

import os
import sys
import time

import gen_common as common
import gen_fuji as fuji  # noqa: E402  (its import sets up jax with 8 devices; only its values and specs are used)

import numpy as np  # noqa: E402
import tensorstore as ts  # noqa: E402


def main(argv) -> int:
    n = int(argv[0])
    out = os.path.abspath(argv[1] if len(argv) > 1 else os.path.join(common.HERE, ".generated", f"fuji-cut-{n}"))
    version = f"{fuji.VERSION}:params:regular:cut={n}"
    if common.cached(out, fuji.STEP, version):
        return 0
    tmp = common.fresh_tmp(out)
    step = common.step_dir(tmp, fuji.STEP)
    t0 = time.monotonic()
    index = [["step", fuji.STEP]]
    raw = 0
    for path, (shape, spec) in fuji.param_specs().items():
        host = fuji.values(path, shape, "param")
        chunks = [s // n if d < len(spec) and spec[d] == "fsdp" else s for d, s in enumerate(shape)]
        full = f"model/{path}"
        ts.open(
            {
                "driver": "zarr",
                "kvstore": {"driver": "file", "path": os.path.join(step, "gda", full)},
                "metadata": {"shape": list(shape), "chunks": chunks, "dtype": "<f4", "compressor": {"id": "zstd", "level": 1}},
            },
            create=True,
        ).result().write(host).result()
        index.append([full, {"dtype": "float32", "shape": str(tuple(shape))}])
        raw += host.nbytes
        del host
    import json

    with open(os.path.join(step, "index"), "w") as f:
        f.write(json.dumps(index))
    t1 = time.monotonic()
    info = {
        "version": version,
        "dims": fuji.DIMS,
        "cut": n,
        "step": fuji.STEP,
        "step_dir": os.path.relpath(common.step_dir(out, fuji.STEP), common.ROOT),
        "raw_bytes": raw,
        "stored_bytes": common.dir_size(step),
        "seconds": round(t1 - t0, 1),
    }
    return common.finish(tmp, out, info)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
