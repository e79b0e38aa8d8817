#!/usr/bin/env python3
"""The conversion route AXLearn users take today, as a baseline for bench/convert.mjs.

Usage:
    .venv/bin/python bench/python_route.py ORBAX_STEP_DIR DEST_ROOT [--dtype bfloat16]

Single process, CPU only. Restores the step's `state` item with the real orbax-checkpoint as numpy
arrays (PyTreeCheckpointer + RestoreArgs(restore_type=np.ndarray) for every leaf, from the item's own
metadata), then writes every array with TensorStore as a zarr v2 array under
DEST_ROOT/step_XXXXXXXX/gda/<slash/path> with the source's chunk shape and zstd level 1, and finally
copies index/index to DEST_ROOT/step_XXXXXXXX/index (the commit marker, written last).
With --dtype bfloat16 (bench/cast.mjs), every float32/float64 array is cast with
`jnp.asarray(x).astype(jnp.bfloat16)` before it is written as a bfloat16 zarr array, and the index names
bfloat16 for those arrays (what `orbax2reg convert --dtype bfloat16` writes).
Prints one JSON line with the phase timings.
"""

import json
import os
import shutil
import sys
import time

from orbax_restore import path_of, restore_state  # first: it puts JAX on the CPU before jax is imported

import jax
import jax.numpy as jnp
import numpy as np
import tensorstore as ts


def main(argv) -> int:
    cast = None
    if "--dtype" in argv:
        i = argv.index("--dtype")
        cast = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    step_dir, dest_root = (os.path.abspath(a) for a in argv)
    t0 = time.monotonic()
    metadata, restored = restore_state(step_dir)
    t1 = time.monotonic()

    out = os.path.join(dest_root, os.path.basename(step_dir))
    chunks = {
        path_of(kp): tuple(m.storage.chunk_shape)
        for kp, m in jax.tree_util.tree_flatten_with_path(metadata)[0]
    }
    written = 0
    cast_s = 0.0
    cast_paths = set()
    for kp, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
        path = path_of(kp)
        value = np.asarray(value)
        if cast is not None and value.dtype in (np.float32, np.float64):
            c0 = time.monotonic()
            value = np.asarray(jnp.asarray(value).astype(jnp.dtype(cast)))
            cast_s += time.monotonic() - c0
            cast_paths.add(path)
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": os.path.join(out, "gda", path)},
            "metadata": {
                "shape": list(value.shape),
                "chunks": list(chunks[path] or value.shape),
                "dtype": value.dtype.name if value.dtype.name == "bfloat16" else value.dtype.str,
                "compressor": {"id": "zstd", "level": 1},
            },
        }
        ts.open(spec, create=True).result().write(value).result()
        written += 1
    t2 = time.monotonic()
    if cast is None:
        shutil.copyfile(os.path.join(step_dir, "index", "index"), os.path.join(out, "index"))
    else:
        with open(os.path.join(step_dir, "index", "index")) as f:
            index = json.load(f)
        index = [[p, {**v, "dtype": cast} if p in cast_paths else v] for p, v in index]
        with open(os.path.join(out, "index"), "w") as f:
            f.write(json.dumps(index))
    t3 = time.monotonic()
    times = {"restore_s": round(t1 - t0, 2), "write_s": round(t2 - t1 - cast_s, 2), "cast_s": round(cast_s, 2)}
    print(json.dumps({"arrays": written, **times, "seconds": round(t3 - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
