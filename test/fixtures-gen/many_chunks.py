"""Writes an AXLearn step of many small objects: OUT_DIR/step_00000100 with ARRAYS float32 arrays, each sharded
over 64 fake CPU devices into 64 chunks of 2 KiB (the issue's scale shape, smaller: 100 x 64 = 6,400 chunks).

Saved by the real CheckpointManager with AXLearn's options (generate.py's `save_axlearn`). A conversion of it
writes thousands of files, each flushed in the background: the test that it stays under a low open-file
limit uses it.

Usage: python many_chunks.py OUT_DIR [ARRAYS]   (replaced whole; the tests' global setup uses test/.generated/many-chunks)
"""

import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CHUNKS = 64


def main(out_dir: str, arrays: int) -> int:
    import generate as g  # sets JAX's environment (8 devices) before importing it

    # JAX starts its CPU backend lazily, at the first jax.devices(): this many devices instead.
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={CHUNKS}"
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    out = os.path.abspath(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    devices = jax.devices()
    assert len(devices) == CHUNKS, len(devices)
    sharding = NamedSharding(Mesh(np.array(devices), ("x",)), P("x"))
    n = CHUNKS * 512  # 512 float32 = 2 KiB per chunk
    tree = {
        "model": {
            f"layer_{i:04d}": {"w": jax.device_put(np.arange(n, dtype=np.float32) + i, sharding)} for i in range(arrays)
        }
    }
    g.save_axlearn(out, 100, tree)
    g.rewrite_commit_files(out)
    print(f"many_chunks: {arrays} arrays x {CHUNKS} chunks -> {out}/step_00000100")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 100))
