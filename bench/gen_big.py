#!/usr/bin/env python3
"""Writes a real Orbax step holding one 1 GiB chunk: the large-object case of the GCS path's memory bound.

Usage:
    .venv/bin/python bench/gen_big.py [OUT_DIR] [--mib N]    # default bench/.generated/big-chunk, 1024 MiB

One replicated float32 array model/big/weight of N MiB (shape (N*64, 4096): one chunk, since Orbax's
chunk is the shard, and a replicated array has one shard), plus prng_key, written with the real
orbax-checkpoint exactly as bench/gen_fuji.py does (test/fixtures-gen/generate.py's AXLearn layout).
Values are seeded random normals (nearly incompressible). Cached like gen_fuji.py: OUT_DIR/generated.json
records VERSION; a rerun with the same VERSION does nothing.
"""

import os
import sys
import time

import gen_common as common

common.fixture_generator()  # sets XLA_FLAGS and JAX_PLATFORMS before jax is imported

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

STEP = 1


def main(argv) -> int:
    mib = 1024
    if "--mib" in argv:
        i = argv.index("--mib")
        mib = int(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    version = f"big-chunk-v1:mib={mib}"
    out = os.path.abspath(argv[0] if argv else os.path.join(common.HERE, ".generated", "big-chunk"))
    if common.cached(out, STEP, version):
        return 0
    tmp = common.fresh_tmp(out)
    t0 = time.monotonic()
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    shape = (mib * 64, 4096)
    host = np.random.default_rng(7).standard_normal(shape, dtype=np.float32)
    big = jax.make_array_from_callback(shape, NamedSharding(mesh, P()), lambda idx: np.asarray(host[idx]))
    prng = jax.device_put(np.array([0, 42, 7, 1], dtype=np.uint32), NamedSharding(mesh, P()))
    tree = {"model": {"big": {"weight": big}}, "prng_key": prng}
    common.save(tmp, STEP, tree)
    info = {
        "version": version,
        "step_dir": os.path.relpath(common.step_dir(out, STEP), common.ROOT),
        "raw_bytes": int(big.nbytes + prng.nbytes),
        "stored_bytes": common.dir_size(os.path.join(tmp, "ckpt")),
        "seconds": round(time.monotonic() - t0, 1),
    }
    return common.finish(tmp, out, info)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
