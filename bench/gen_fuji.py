#!/usr/bin/env python3
"""Writes the conversion benchmark's source: one real Orbax step shaped like fuji-7B-v2, scaled down.

Usage:
    .venv/bin/python bench/gen_fuji.py [OUT_DIR] [--dims dim=512,layers=1,...]   # default bench/.generated/fuji-mini

--dims overrides some of DIMS (the tests' fault run writes a ~45 MB step with 8 MiB chunks that way).

The tree has fuji-7B-v2's leaf paths (docs/axlearn-regular-format.md §8): float32 params under
model/decoder/..., Adam mu/nu copies under learner/optimizer/1/0/{mu,nu}/..., int32 counts at
learner/optimizer/1/{0,1,3}/count (1/2 is AddDecayedWeightsState(count=None): no leaf) and prng_key
uint32 (4,). Dimensions are shrunk (see DIMS) so the step is about 2 GB on disk.

It is written with the real orbax-checkpoint exactly as the project's fixture generator does
(test/fixtures-gen/generate.py is imported for that: CheckpointManager with step_%08d names, items
index + state, AXLearn's ArrayHandler override, 8 CPU devices). Arrays live on an (8,) "fsdp" mesh;
the FFN, qkv and o_proj weights are sharded 8-way on their model-dim axis (chunk = shard), as under
fuji's default mesh; token_emb and the norms are replicated (one chunk each). Values are seeded
random normals times a small scale (params 0.02, mu 1e-3, nu = (1e-3 * normal)^2): float32 noise that
zstd compresses by about 8 %, like real fp32 weights, and not all zeros.

The step is cached: OUT_DIR/generated.json records VERSION; a rerun with the same VERSION does nothing.
Change VERSION whenever the tree, the dimensions or the values change.
"""

import hashlib
import os
import sys
import time

import gen_common as common

# The project's generator sets XLA_FLAGS (8 CPU devices) and JAX_PLATFORMS before jax is imported, and
# registers AXLearn's ArrayHandler override: it must come before `import jax`.
g = common.fixture_generator()

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from typing import Any, NamedTuple  # noqa: E402

# fuji-7B-v2: dim 4096, 32 layers, 32 heads x 128, FFN 11008, vocab 32768.
DIMS = {"dim": 1024, "layers": 14, "heads": 8, "head_dim": 128, "ffn": 2816, "vocab": 8192}
STEP = 1000


def version() -> str:
    return "fuji-mini-v1:" + ",".join(f"{k}={v}" for k, v in DIMS.items()) + f":step={STEP}"


VERSION = version()
FSDP = 8


class AddDecayedWeightsState(NamedTuple):
    count: Any  # None in fuji: no leaf.


def param_specs():
    """{slash path under model/: (shape, partition spec)} of fuji-7B-v2's params, scaled down."""
    d, n, h, hd, f, v = (DIMS[k] for k in ("dim", "layers", "heads", "head_dim", "ffn", "vocab"))
    layer = "decoder/transformer/repeat/layer"
    fs = "fsdp"
    return {
        "decoder/emb/token_emb/weight": ((v, d), P()),
        "decoder/output_norm/scale": ((d,), P()),
        f"{layer}/self_attention/norm/scale": ((n, d), P()),
        f"{layer}/self_attention/attention/i_proj/i_proj/qkv_proj/weight": ((n, 3, d, h, hd), P(None, None, fs)),
        f"{layer}/self_attention/attention/o_proj/weight": ((n, d, h, hd), P(None, fs)),
        f"{layer}/feed_forward/norm/scale": ((n, d), P()),
        f"{layer}/feed_forward/linear1_0/weight": ((n, d, f), P(None, fs)),
        f"{layer}/feed_forward/linear1_1/weight": ((n, d, f), P(None, fs)),
        f"{layer}/feed_forward/linear2/weight": ((n, f, d), P(None, None, fs)),
    }


def nest(flat: dict) -> dict:
    out: dict = {}
    for path, value in flat.items():
        node = out
        parts = path.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


def values(path: str, shape: tuple, kind: str) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{VERSION}:{kind}:{path}".encode()).digest()[:8], "little")
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape, dtype=np.float32)
    if kind == "param":
        x *= np.float32(0.02)
    elif kind == "mu":
        x *= np.float32(1e-3)
    else:  # nu: second moment, positive
        x *= np.float32(1e-3)
        np.square(x, out=x)
    if path.endswith("/scale") and kind == "param":
        x += np.float32(1.0)  # norm scales sit near 1
    return x


def build_tree(mesh: Mesh):
    def arrays(kind: str) -> dict:
        out = {}
        for path, (shape, spec) in param_specs().items():
            host = values(path, shape, kind)
            out[path] = jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda idx, h=host: np.asarray(h[idx]))
            del host
        return nest(out)

    def scalar(value, dtype):
        return jax.device_put(np.array(value, dtype=dtype), NamedSharding(mesh, P()))

    count = lambda: scalar(STEP, np.int32)  # noqa: E731
    adam = g.ScaleByAdamState(count=count(), mu=arrays("mu"), nu=arrays("nu"))
    adamw = (adam, g.ScaleByScheduleState(count=count()), AddDecayedWeightsState(count=None), g.ScaleByScheduleState(count=count()))
    prng = jax.device_put(np.array([0, 42, 7, 1000], dtype=np.uint32), NamedSharding(mesh, P()))
    return {
        "learner": {"optimizer": (g.EmptyState(), adamw)},
        "model": arrays("param"),
        "prng_key": prng,
    }


def main(argv) -> int:
    global VERSION
    if "--dims" in argv:
        i = argv.index("--dims")
        for item in argv[i + 1].split(","):
            k, v = item.split("=")
            if k not in DIMS:
                raise SystemExit(f"--dims: unknown dimension {k!r} (known: {', '.join(DIMS)})")
            DIMS[k] = int(v)
        VERSION = version()
        argv = argv[:i] + argv[i + 2 :]
    out = os.path.abspath(argv[0] if argv else os.path.join(common.HERE, ".generated", "fuji-mini"))
    if common.cached(out, STEP, VERSION):
        return 0
    tmp = common.fresh_tmp(out)
    t0 = time.monotonic()
    mesh = Mesh(np.array(jax.devices()), ("fsdp",))
    assert len(jax.devices()) == FSDP, jax.devices()
    tree = build_tree(mesh)
    t1 = time.monotonic()
    common.save(tmp, STEP, tree)
    t2 = time.monotonic()
    leaves = jax.tree_util.tree_leaves(tree)
    info = common.step_info(VERSION, DIMS, STEP, out, tmp, leaves, t0, t1, t2)
    del tree, leaves
    return common.finish(tmp, out, info)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
