#!/usr/bin/env python3
"""Writes the scale benchmark's sources: real Orbax steps of A float32 arrays, each sharded into C chunks.

Usage:
    .venv/bin/python bench/gen_scale.py A C [OUT_DIR]     # default bench/.generated/scale/A_x_C

Each array is (C, 512) float32 sharded on its first axis over C fake CPU devices: C chunks of 2 KiB each,
so a step has A * (C + 1) objects (C chunks and a .zarray per array). Written with the real orbax-checkpoint
as the project's fixture generator writes AXLearn steps (test/fixtures-gen/generate.py: CheckpointManager
with step_%08d names, items index + state, AXLearn's ArrayHandler override), with Orbax's default OCDBT node
size, so the whole step is a single B+tree leaf. Leaves are model/layer_<i>/w: a model whose layers are not
stacked.

Cached: OUT_DIR/generated.json records VERSION; a rerun with the same VERSION and shape does nothing.

    .venv/bin/python bench/gen_scale.py read STEP_DIR

reads every array of a step with TensorStore (zarr driver over the OCDBT kvstore, one shared context so
the tree is read once), and prints the wall time and the number of chunks: the per-chunk reference.
"""

import json
import os
import sys
import time


def ts_read(step_dir: str, out_dir: str = "") -> int:
    import tensorstore as ts

    base = {"driver": "ocdbt", "base": f"file://{os.path.abspath(os.path.join(step_dir, 'state'))}"}
    context = ts.Context()
    t0 = time.monotonic()
    keys = [k.decode() for k in ts.KvStore.open(base, context=context).result().list().result()]
    names = sorted(k[: -len("/.zarray")] for k in keys if k.endswith("/.zarray"))
    chunks = sum(1 for k in keys if not k.endswith("/.zarray") and "/" in k and not k.endswith("/.zattrs"))
    opened = [ts.open({"driver": "zarr", "kvstore": {**base, "path": n + "/"}}, context=context, open=True, read=True) for n in names]
    sources = [f.result() for f in opened]
    reads = [src.read() for src in sources]
    data = [r.result() for r in reads]
    read_seconds = time.monotonic() - t0
    if out_dir:
        # What AXLearn's regular checkpointer writes: zarr v2, the source's chunks, zstd level 1, file kvstore.
        writes = []
        for n, src, x in zip(names, sources, data):
            spec = {
                "driver": "zarr",
                "kvstore": {"driver": "file", "path": os.path.join(out_dir, "gda", n.replace(".", "/"))},
                "metadata": {
                    "dtype": "<f4",
                    "shape": list(x.shape),
                    "chunks": list(src.chunk_layout.read_chunk.shape),
                    "compressor": {"id": "zstd", "level": 1},
                },
                "create": True,
                "delete_existing": True,
            }
            writes.append((ts.open(spec, context=context), x))
        done = [f.result().write(x) for f, x in writes]
        for w in done:
            w.result()
    seconds = time.monotonic() - t0
    print(json.dumps({"seconds": round(read_seconds, 3), "copy_seconds": round(seconds, 3), "arrays": len(names), "chunks": chunks}))
    return 0


if len(sys.argv) > 2 and sys.argv[1] == "read":
    sys.exit(ts_read(sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else ""))

ARRAYS = int(sys.argv[1]) if len(sys.argv) > 1 else 300
CHUNKS = int(sys.argv[2]) if len(sys.argv) > 2 else 64
# The project's generator sets XLA_FLAGS for 8 devices and registers AXLearn's ArrayHandler; jax reads the
# device count when its backend starts (the first jax.devices()), so setting it after the import holds.
import gen_common as common  # noqa: E402

common.fixture_generator()

os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={CHUNKS}"

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

STEP = 100
ROW = 512  # float32: 2 KiB per chunk
VERSION = "scale-v1"


def build_tree(mesh: Mesh) -> dict:
    sharding = NamedSharding(mesh, P("x"))
    rng = np.random.default_rng(ARRAYS * 1000 + CHUNKS)
    layers = {}
    for i in range(ARRAYS):
        host = rng.standard_normal((CHUNKS, ROW), dtype=np.float32) * np.float32(0.02)
        layers[f"layer_{i:05d}"] = {"w": jax.make_array_from_callback(host.shape, sharding, lambda idx, h=host: h[idx])}
    return {"model": layers}


def main(argv) -> int:
    out = os.path.abspath(argv[3] if len(argv) > 3 else os.path.join(common.HERE, ".generated", "scale", f"{ARRAYS}_x_{CHUNKS}"))
    if common.cached(out, STEP, VERSION):
        return 0
    tmp = common.fresh_tmp(out)
    assert len(jax.devices()) == CHUNKS, jax.devices()
    t0 = time.monotonic()
    tree = build_tree(Mesh(np.array(jax.devices()), ("x",)))
    t1 = time.monotonic()
    # Orbax's commit of a 500k-key step outlasts the fixtures' 300 s async timeout on a loaded machine.
    common.save(tmp, STEP, tree, timeout_secs=3600)
    t2 = time.monotonic()
    info = {
        "version": VERSION,
        "arrays": ARRAYS,
        "chunks": CHUNKS,
        "objects": ARRAYS * (CHUNKS + 1),
        "step": STEP,
        "step_dir": os.path.relpath(common.step_dir(out, STEP), common.ROOT),
        "values_seconds": round(t1 - t0, 1),
        "save_seconds": round(t2 - t1, 1),
    }
    return common.finish(tmp, out, info)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
