#!/usr/bin/env python3
"""The conversion route AXLearn users take today, as a baseline for bench/convert.mjs.

Usage:
    .venv/bin/python bench/python_route.py ORBAX_STEP_DIR DEST_ROOT

Single process, CPU only. Restores the step's `state` item with the real orbax-checkpoint as numpy
arrays (PyTreeCheckpointer + RestoreArgs(restore_type=np.ndarray) for every leaf, from the item's own
metadata), then writes every array with TensorStore as a zarr v2 array under
DEST_ROOT/step_XXXXXXXX/gda/<slash/path> with the source's chunk shape and zstd level 1, and finally
copies index/index to DEST_ROOT/step_XXXXXXXX/index (the commit marker, written last).
Prints one JSON line with the phase timings.
"""

import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import json  # noqa: E402
import shutil  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import tensorstore as ts  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from etils import epath  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def main(argv) -> int:
    step_dir, dest_root = (os.path.abspath(a) for a in argv)
    t0 = time.monotonic()
    state = epath.Path(step_dir) / "state"
    metadata = ocp.PyTreeCheckpointHandler().metadata(state).tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(state, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    t1 = time.monotonic()

    out = os.path.join(dest_root, os.path.basename(step_dir))
    chunks = {
        "/".join(key_str(k) for k in kp): tuple(m.storage.chunk_shape)
        for kp, m in jax.tree_util.tree_flatten_with_path(metadata)[0]
    }
    written = 0
    for kp, value in jax.tree_util.tree_flatten_with_path(restored)[0]:
        path = "/".join(key_str(k) for k in kp)
        value = np.asarray(value)
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": os.path.join(out, "gda", path)},
            "metadata": {
                "shape": list(value.shape),
                "chunks": list(chunks[path] or value.shape),
                "dtype": value.dtype.str,
                "compressor": {"id": "zstd", "level": 1},
            },
        }
        ts.open(spec, create=True).result().write(value).result()
        written += 1
    t2 = time.monotonic()
    shutil.copyfile(os.path.join(step_dir, "index", "index"), os.path.join(out, "index"))
    t3 = time.monotonic()
    print(json.dumps({"arrays": written, "restore_s": round(t1 - t0, 2), "write_s": round(t2 - t1, 2), "seconds": round(t3 - t0, 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
