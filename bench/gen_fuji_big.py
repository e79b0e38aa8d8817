#!/usr/bin/env python3
"""Writes a big fuji-shaped Orbax step (params only) in bounded memory: the export benchmark's large case.

Usage:
    .venv/bin/python bench/gen_fuji_big.py [OUT_DIR] [--dims dim=4096,layers=32,...]
        # default bench/.generated/fuji-big with fuji-7B-v2's real dimensions (26.4 GB of float32)

The tree is gen_fuji.py's `model/decoder/...` (the same leaf paths, shapes, dtypes and fsdp=8 sharding: the
FFN, qkv and o_proj weights chunked 8-way on their model-dim axis, token_emb and the norms one chunk each) plus
`prng_key`, without the optimizer state: a 7B model's Adam state would triple the step past this machine's disk,
and the export reads only `model/`. It is saved with the real orbax-checkpoint through gen_common.save (AXLearn's
CheckpointManager layout and ArrayHandler override), as gen_fuji.py saves its step.

Why another generator: gen_fuji.py builds every array in host memory before Orbax saves it (about 2.2x the
step's size at its peak), which a 26 GB step cannot do on a 23 GiB machine. Here every shard of a large array
is a read-only view of one 64 MiB block of seeded random normals (times 0.02, as gen_fuji's params), mapped
again and again into one contiguous address range (mmap MAP_FIXED of a memfd); jax's CPU client adopts a
page-aligned host buffer without copying it, so the step's arrays take 64 MiB of memory whatever their size,
and Orbax reads them while it writes the chunks. The data repeat every 64 MiB: each 64 MiB stretch of a chunk
is random, and zstd (level 1, a window far below 64 MiB) shrinks the chunks as little as gen_fuji's. The norm
scales (small) are real per-element values near 1.

Cached like gen_fuji.py (OUT_DIR/generated.json records VERSION). Delete OUT_DIR after use: it is big.
"""

import ctypes
import mmap
import os
import sys
import time

import gen_common as common

g = common.fixture_generator()  # sets XLA_FLAGS (8 CPU devices) and JAX_PLATFORMS before jax is imported

import gen_fuji  # noqa: E402  (its param_specs reads gen_fuji.DIMS)
import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402

# fuji-7B-v2 (docs §8): dim 4096, 32 layers, 32 heads x 128, FFN 11008, vocab 32768.
DIMS = {"dim": 4096, "layers": 32, "heads": 32, "head_dim": 128, "ffn": 11008, "vocab": 32768}
STEP = 1000
BLOCK = 64 << 20  # the repeated block of random values

_libc = ctypes.CDLL("libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
PROT_NONE, PROT_READ = 0, 1
MAP_SHARED, MAP_PRIVATE, MAP_FIXED, MAP_ANONYMOUS, MAP_NORESERVE = 0x01, 0x02, 0x10, 0x20, 0x4000


def block_fd(seed: int) -> int:
    """A memfd holding BLOCK bytes of seeded float32 normals times 0.02."""
    fd = os.memfd_create("gen_fuji_big")
    x = np.random.default_rng(seed).standard_normal(BLOCK // 4, dtype=np.float32)
    x *= np.float32(0.02)
    os.write(fd, x.tobytes())
    return fd


def tiled(fd: int, shape: tuple) -> np.ndarray:
    """A read-only float32 array of `shape` whose bytes are the block repeated: the block's pages mapped again and
    again into one reserved, page-aligned range (so jax adopts it without a copy)."""
    nbytes = int(np.prod(shape)) * 4
    size = -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE
    base = _libc.mmap(None, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
    if base in (None, ctypes.c_void_p(-1).value):
        raise OSError(ctypes.get_errno(), "mmap reserve")
    for off in range(0, size, BLOCK):
        got = _libc.mmap(base + off, min(BLOCK, size - off), PROT_READ, MAP_SHARED | MAP_FIXED, fd, 0)
        if got != base + off:
            raise OSError(ctypes.get_errno(), "mmap fixed")
    buf = (ctypes.c_char * nbytes).from_address(base)
    arr = np.frombuffer(buf, dtype=np.float32).reshape(shape)
    arr.flags.writeable = False
    return arr


def version() -> str:
    return "fuji-big-v1:" + ",".join(f"{k}={v}" for k, v in DIMS.items()) + f":step={STEP}:block={BLOCK}"


def main(argv) -> int:
    if "--dims" in argv:
        i = argv.index("--dims")
        for item in argv[i + 1].split(","):
            k, v = item.split("=")
            if k not in DIMS:
                raise SystemExit(f"--dims: unknown dimension {k!r} (known: {', '.join(DIMS)})")
            DIMS[k] = int(v)
        argv = argv[:i] + argv[i + 2 :]
    gen_fuji.DIMS.update(DIMS)
    out = os.path.abspath(argv[0] if argv else os.path.join(common.HERE, ".generated", "fuji-big"))
    if common.cached(out, STEP, version()):
        return 0
    tmp = common.fresh_tmp(out)
    t0 = time.monotonic()
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    fd = block_fd(7)
    flat = {}
    for path, (shape, spec) in gen_fuji.param_specs().items():
        sharding = NamedSharding(mesh, spec)
        if path.endswith("/scale"):
            host = gen_fuji.values(path, shape, "param")  # small: real values near 1
            flat[path] = jax.make_array_from_callback(shape, sharding, lambda idx, h=host: np.asarray(h[idx]))
        else:
            # Every shard its own contiguous tiled buffer (a shard of a view would not be contiguous).
            flat[path] = jax.make_array_from_callback(
                shape, sharding, lambda idx, s=shape: tiled(fd, tuple(len(range(*sl.indices(n))) for sl, n in zip(idx, s)))
            )
    prng = jax.device_put(np.array([0, 42, 7, STEP], dtype=np.uint32), NamedSharding(mesh, jax.sharding.PartitionSpec()))
    tree = {"model": gen_fuji.nest(flat), "prng_key": prng}
    t1 = time.monotonic()
    # Orbax copies each shard to host memory before writing it; bound how many bytes are copied at a time (an
    # option of the handler: the files it writes are the same), so the copies do not add up to the step's size.
    real_init = ocp.PyTreeCheckpointHandler.__init__

    def bounded_init(self, *a, **k):
        real_init(self, *a, **{"save_device_host_concurrent_gb": 1, **k})

    ocp.PyTreeCheckpointHandler.__init__ = bounded_init
    try:
        common.save(tmp, STEP, tree, timeout_secs=3600)
    finally:
        ocp.PyTreeCheckpointHandler.__init__ = real_init
    t2 = time.monotonic()
    leaves = jax.tree_util.tree_leaves(tree)
    info = common.step_info(version(), DIMS, STEP, out, tmp, leaves, t0, t1, t2)
    del tree, leaves, flat
    return common.finish(tmp, out, info)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
