#!/usr/bin/env python3
"""Restores converted checkpoints with AXLearn's own code (its real source, installed by scripts/install.sh from
ORBAX2REG_AXLEARN into .venv-axlearn), and compares every restored value with the Orbax source.

Usage:
    .venv-axlearn/bin/python test/python/axlearn_restore.py CASES.json

CASES.json: a list of
    {"name": str, "root": <regular checkpoint root>, "step": int,
     "source_index": <the directory holding the source's AXLearn `index` file (step/index/ in the OrbaxCheckpointer
                      layout), which AXLearn's read_state_spec reads>,
     "source_python": <the source's python/python_0 directory, to compare restored iterators with> (optional),
     "source_item": <the Orbax PyTree item dir (_METADATA + OCDBT)> (optional: a control without a source),
     "mode": "trainer" | "inference",
     "validation": "EXACT" | "CONTAINS_STATE" (trainer mode; default EXACT),
     "cast": "bfloat16" (optional: the export was written with --dtype bfloat16),
     "model_dtype": "bfloat16" | "float32" (inference mode: the dtype of the model's floating-point specs),
     "processes": 2 (optional, trainer mode: restore on that many jax.distributed processes on loopback, one CPU
                     device each; each process compares its own iterator with the source's python_<i>),
     "tf_iterator": {"range": N, "next": [<per process>]} (optional: the index's tf.data iterator is
                     `iter(tf.data.Dataset.range(N))`, restored by AXLearn's restore_tf_savables from tf_<i>/;
                     process i's restored iterator must yield next[i] first)}

trainer: AXLearn's `Checkpointer.restore(step, state)`, its config's validation (EXACT by default), with the
    state AXLearn's `read_state_spec` reads from the source step's own index (its float32/float64 specs as
    bfloat16 for a cast export: a trainer whose state is bfloat16); an iterator the index lists is a
    PythonSavable of the same type name, so EXACT holds for steps with iterators too and the iterator file is
    restored through AXLearn's `maybe_restore_python_savables`.
inference: what `InferenceRunner.__init__` does (axlearn/common/inference.py): its default `init_state_builder`
    config (TensorStoreStateStorageBuilder, validation CONTAINS_STATE_UP_TO_DTYPE) set to the step's `dir`, called
    with `Builder.State(step=0, trainer_state=_InferenceRunnerState(prng_key=TensorSpec(uint32, [4],
    PartitionSpec(None)), model=<the model's specs>))`. The model specs are the source's `model/...` specs with
    floating-point dtypes set to `model_dtype`, as a model config's dtype sets them.

Expected values: the source's arrays read with TensorStore over its OCDBT kvstore (check_regular.py's reader),
cast with `jnp.asarray(x).astype(jnp.bfloat16)` where the export was cast, then to the target spec's dtype.
Prints one JSON line per case: step, validation, arrays, matched, iterators restored, problems.
"""

import ast
import json
import os
import socket
import subprocess
import sys
import time

_WORKER = len(sys.argv) > 1 and sys.argv[1] == "--_worker"
if _WORKER:
    os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=1"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_regular  # noqa: E402  (the TensorStore reader of the source)
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import msgpack  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from axlearn.common import checkpointer, inference, utils  # noqa: E402
from axlearn.common.state_builder import Builder  # noqa: E402
from jax.sharding import Mesh, PartitionSpec  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)
jax.config.update("jax_enable_x64", True)  # float64/int64 leaves keep their dtype


class _Iterator:
    """A PythonSavable whose type prints as the one the source's index names (its state is what AXLearn restores)."""

    def __init__(self):
        self.state = None

    def get_state(self):
        return self.state

    def set_state(self, state):
        self.state = state


def iterator_type(type_repr):
    """A class whose str() is `type_repr` ("<class 'module.Name'>"), or None when it is not a class repr."""
    if not (type_repr.startswith("<class '") and type_repr.endswith("'>")):
        return None
    module, _, name = type_repr[len("<class '") : -2].rpartition(".")
    cls = type(name, (_Iterator,), {})
    cls.__module__ = module
    cls.__qualname__ = name
    return cls


def set_path(tree, path, value):
    utils.set_recursively(tree, value=value, path=path, separator="/")


def retyped(spec, dtype):
    """The specs with floating-point dtypes of 32 or 64 bits set to `dtype` (what --dtype casts)."""

    def one(s):
        if dtype is not None and jnp.issubdtype(s.dtype, jnp.floating) and jnp.dtype(s.dtype).itemsize >= 4:
            return utils.TensorSpec(shape=s.shape, dtype=jnp.dtype(dtype), mesh_axes=PartitionSpec())
        return utils.TensorSpec(shape=s.shape, dtype=s.dtype, mesh_axes=PartitionSpec())

    return jax.tree.map(one, spec, is_leaf=lambda x: isinstance(x, utils.TensorSpec))


def state_spec(index_dir):
    """AXLearn's read_state_spec of the index. Its _parse_tensor_spec maps only the 10 dtypes its trainers use
    (no uint8, complex, float8...): for an index with others, the same loop over read_index_file with numpy's
    dtype of the name (the `dtypes` fixtures hold every dtype TensorStore writes)."""
    try:
        return checkpointer.read_state_spec(index_dir)
    except NotImplementedError:
        state = {}
        for path, value in checkpointer.read_index_file(index_dir):
            if isinstance(value, dict):
                spec = utils.TensorSpec(shape=ast.literal_eval(value["shape"]), dtype=jnp.dtype(value["dtype"]))
                set_path(state, path, spec)
        return state


def trainer_state(index_dir, cast, tf_iterator=None):
    """The source's state spec (state_spec), plus each iterator its index lists: a PythonSavable of its type name,
    or (with `tf_iterator`) a fresh tf.data iterator of the same dataset."""
    state = retyped(state_spec(index_dir), cast)
    iterators = {}
    for path, value in checkpointer.read_index_file(index_dir):
        if path == "step" or not isinstance(value, str):
            continue
        if "tensorflow" in value:
            if tf_iterator is not None:
                import tensorflow as tf

                it = iter(tf.data.Dataset.range(tf_iterator["range"]))
                set_path(state, path, it)
                iterators[path] = it
            continue
        cls = iterator_type(value)
        if cls is not None:
            it = cls()
            set_path(state, path, it)
            iterators[path] = it
    return state, iterators


def cast_dtype(x, name):
    return np.asarray(jnp.asarray(x).astype(jnp.dtype(name)))


def expected(source_arrays, path, cast, spec_dtype):
    x = source_arrays[path]
    if cast and np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize >= 4:
        x = cast_dtype(x, cast)
    if spec_dtype is not None and np.dtype(spec_dtype) != x.dtype:
        x = cast_dtype(x, spec_dtype)
    return x


def flat(tree):
    return {"/".join(check_regular.key_str(k) for k in path): v for path, v in jax.tree_util.tree_flatten_with_path(tree)[0]}


def restore_trainer(case, step_dir, mesh):
    state, iterators = trainer_state(case["source_index"], case.get("cast"), case.get("tf_iterator"))
    validation = checkpointer.CheckpointValidationType[case.get("validation", "EXACT")]
    cfg = checkpointer.Checkpointer.default_config().set(name="restore", dir=case["root"])
    ckpt = cfg.instantiate(parent=None)
    with mesh:
        if validation == checkpointer.CheckpointValidationType.EXACT:
            step, restored = ckpt.restore(step=case["step"], state=state)
        else:
            # Checkpointer.restore takes no validation argument: its storage's restore_from_dir does.
            step = case["step"]
            restored = ckpt._storage.restore_from_dir(  # noqa: SLF001
                step=step, state=state, ckpt_dir=step_dir, validation=validation
            )
    ckpt.stop()
    return step, validation.name, restored, iterators


def model_specs(index_dir, model_dtype):
    """The source's model specs with every floating-point dtype set to `model_dtype`, as a model config's dtype does."""
    spec = state_spec(index_dir)["model"]

    def one(s):
        if model_dtype is not None and jnp.issubdtype(s.dtype, jnp.floating):
            return utils.TensorSpec(shape=s.shape, dtype=jnp.dtype(model_dtype), mesh_axes=PartitionSpec())
        return utils.TensorSpec(shape=s.shape, dtype=s.dtype, mesh_axes=PartitionSpec())

    return jax.tree.map(one, spec, is_leaf=lambda x: isinstance(x, utils.TensorSpec))


def restore_inference(case, step_dir, mesh):
    # inference.py, InferenceRunner.__init__: the state specs and the default builder, set as it sets them.
    with mesh:
        specs = inference._InferenceRunnerState(  # noqa: SLF001
            prng_key=utils.TensorSpec(dtype=jnp.uint32, shape=[4], mesh_axes=PartitionSpec(None)),
            model=model_specs(case["source_index"], case.get("model_dtype")),
        )
        builder_cfg = inference.InferenceRunner.default_config().init_state_builder
        builder = builder_cfg.set(name="init_state_builder", dir=step_dir).instantiate(parent=None)
        assert builder.input_state_type() == Builder.StateType.TENSOR_SPECS
        restored = builder(Builder.State(step=0, trainer_state=specs, built_keys=set())).trainer_state
    return case["step"], builder_cfg.validation.name, restored, {}


def local(value):
    """This process's copy of a (replicated) restored array."""
    if isinstance(value, jax.Array) and not value.is_fully_addressable:
        return np.asarray(value.addressable_data(0))
    return np.asarray(value)


def check(case, mesh):
    out = {"name": case["name"], "problems": []}
    step_dir = os.path.join(case["root"], f"step_{case['step']:08d}")
    if case.get("mode") == "inference":
        step, validation, restored, iterators = restore_inference(case, step_dir, mesh)
    else:
        step, validation, restored, iterators = restore_trainer(case, step_dir, mesh)
    got = {p: local(v) for p, v in flat(restored).items() if p not in iterators}
    out.update({"step": step, "validation": validation, "arrays": len(got)})
    out["dtypes"] = {p: str(v.dtype) for p, v in got.items()}
    if not case.get("source_item"):
        out["small"] = {p: v.tolist() for p, v in got.items() if v.size <= 8}
        return out
    leaves, zarr3 = check_regular.source_leaves(case["source_item"], case.get("source_kvstore") or case["source_item"])
    wanted = {p for p in got}
    source = check_regular.read_source_tensorstore(
        case.get("source_kvstore") or case["source_item"], [(n, p) for n, p in leaves if p in wanted], zarr3
    )
    matched = 0
    for path, value in got.items():
        a = np.asarray(value)
        if path not in source:
            out["problems"].append(f"{path}: restored, but not an array of the source")
            continue
        b = expected(source, path, case.get("cast"), a.dtype)
        if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
            matched += 1
        else:
            out["problems"].append(f"{path}: restored {a.dtype}{a.shape} differs from the source's {b.dtype}{b.shape}")
    out["matched"] = matched
    restored_iterators = {}
    for path, it in iterators.items():
        if not isinstance(it, _Iterator):
            want = case["tf_iterator"]["next"][jax.process_index()]
            got_next = int(next(it))
            restored_iterators[path] = got_next == want
            if got_next != want:
                out["problems"].append(f"{path}: the restored tf.data iterator yields {got_next} first, the source's {want}")
            continue
        # Process i restores python_<i> (checkpointer.py); the source's file of process i is python/python_<i>.
        python_dir = case["source_python"].rstrip("/")
        python_dir = f"{python_dir.rsplit('_', 1)[0]}_{jax.process_index()}"
        raw = os.path.join(python_dir, path.replace("/", "."))
        with open(raw, "rb") as f:
            want = msgpack.unpackb(f.read())
        restored_iterators[path] = it.state == want
        if it.state != want:
            out["problems"].append(f"{path}: iterator restored as {it.state!r}, the source holds {want!r}")
    out["iterators"] = restored_iterators
    return out


def run_case(case, mesh):
    try:
        return check(case, mesh)
    except Exception as e:  # noqa: BLE001 - report and go on with the next case
        return {"name": case["name"], "problems": [f"{type(e).__name__}: {str(e)[:3000]}"]}


def worker(process_id, count, port, case_json):
    """One process of a multi-process restore: joins the others, restores on the global mesh, prints its result."""
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=count, process_id=process_id, initialization_timeout=120
    )
    mesh = Mesh(np.array(jax.devices()).reshape(count, 1), ("data", "model"))
    out = run_case(json.loads(case_json), mesh)
    print(json.dumps({**out, "process": jax.process_index()}), flush=True)
    jax.distributed.shutdown()


def run_processes(case, timeout=240):
    """Runs `case` on case["processes"] processes; one line with every process's result (or how it ended)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    count = case["processes"]
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    procs = [
        subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--_worker", str(i), str(count), str(port), json.dumps(case)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(count)
    ]
    deadline = time.monotonic() + timeout
    outs = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
            stdout += "\n" + json.dumps({"problems": [f"timed out after {timeout} s"]})
        lines = [line for line in stdout.splitlines() if line.startswith("{")]
        outs.append(json.loads(lines[-1]) if lines else {"problems": [f"exit {p.returncode}: {stderr[-1500:]}"]})
    return {
        "name": case["name"],
        "processes": outs,
        "problems": [f"process {i}: {m}" for i, o in enumerate(outs) for m in o.get("problems", [])],
    }


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    for case in cases:
        out = run_processes(case) if case.get("processes", 1) > 1 else run_case(case, mesh)
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    if _WORKER:
        worker(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
        sys.exit(0)
    sys.exit(main(sys.argv))
