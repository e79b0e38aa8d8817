#!/usr/bin/env python3
"""A step saved by AXLearn's own OrbaxCheckpointer from two jax.distributed processes, with a tf.data iterator.

Usage:
    .venv-axlearn/bin/python test/fixtures-gen/axlearn_orbax.py OUT_DIR

Needs AXLearn's source and its pins (.venv-axlearn, from ORBAX2REG_AXLEARN; see docs/testing.md). Two processes
(one CPU device each) join on loopback and save step 100 into OUT_DIR/checkpoints with
`OrbaxCheckpointer.default_config().set(dir=...)` (axlearn/common/checkpointer_orbax.py): a small model,
`prng_key`, a learner count, and `input_iter`, each process's own `iter(tf.data.Dataset.range(1000))` advanced
10 + <process index> elements, which AXLearn's `_TfIteratorHandler` writes to `tfds/tf_<i>/input_iter.*`
(tf.train.Checkpoint's `.index` and `.data-00000-of-00001`). OUT_DIR/expected.json: the next element each
process's restored iterator must yield.
"""

import json
import os
import socket
import subprocess
import sys
import time

_WORKER = len(sys.argv) > 1 and sys.argv[1] == "--_worker"
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

STEP = 100
TIMEOUT = 300


def worker(process_id: int, port: int, root: str):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import tensorflow as tf
    from absl import logging as absl_logging
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from axlearn.common.checkpointer_orbax import OrbaxCheckpointer

    absl_logging.set_verbosity(absl_logging.ERROR)
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=120)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 1), ("data", "model"))

    def array(shape, dtype, spec, seed):
        values = (np.arange(np.prod(shape), dtype=np.float64).reshape(shape) * 0.37 + seed).astype(dtype)
        return jax.make_array_from_callback(shape, NamedSharding(mesh, spec), lambda idx: values[idx])

    it = iter(tf.data.Dataset.range(1000))
    for _ in range(10 + process_id):
        next(it)
    state = {
        "input_iter": it,
        "learner": {"count": array((), jnp.int32, P(), 7)},
        "model": {
            "linear": {"weight": array((8, 4), jnp.float32, P("data", None), 1), "bias": array((4,), jnp.float32, P(), 2)}
        },
        "prng_key": array((4,), jnp.uint32, P(), 3),
    }
    cfg = OrbaxCheckpointer.default_config().set(name="checkpointer", dir=os.path.join(root, "checkpoints"))
    ckpt = cfg.instantiate(parent=None)
    ckpt.save(step=STEP, state=state)
    ckpt.wait_until_finished()
    ckpt.stop()
    print(json.dumps({"process": process_id, "next": int(next(it))}), flush=True)
    jax.distributed.shutdown()


def main(out: str) -> int:
    out = os.path.abspath(out)
    os.makedirs(out, exist_ok=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--_worker", str(i), str(port), out],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + TIMEOUT
    nexts = {}
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        if p.returncode != 0:
            for q in procs:
                q.kill()
            sys.stderr.write(stderr[-4000:])
            raise RuntimeError(f"worker exited {p.returncode}")
        line = json.loads([x for x in stdout.splitlines() if x.startswith("{")][-1])
        nexts[line["process"]] = line["next"]
    # The element each process's iterator yields next: what its restored iterator must yield first.
    with open(os.path.join(out, "expected.json"), "w") as f:
        json.dump({"step": STEP, "next": [nexts[0], nexts[1]]}, f)
    step = os.path.join(out, "checkpoints", f"step_{STEP:08d}")
    for pid in (0, 1):
        print(f"process {pid}: {sorted(os.listdir(os.path.join(step, 'tfds', f'tf_{pid}')))}, next {nexts[pid]}")
    return 0


if __name__ == "__main__":
    if _WORKER:
        worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
        sys.exit(0)
    sys.exit(main(sys.argv[1]))
