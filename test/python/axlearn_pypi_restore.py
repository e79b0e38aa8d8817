#!/usr/bin/env python3
"""Restores converted checkpoints with AXLearn's own Checkpointer from the PyPI `axlearn` wheel.

Usage:
    .venv/bin/python test/python/axlearn_pypi_restore.py CASES.json WHEEL_DIR

WHEEL_DIR holds `axlearn-0.0.1.post20240213000026-py3-none-any.whl` (the only `axlearn` on PyPI, a February
2024 snapshot) and an `attrs` wheel; both are imported straight from the zip files, nothing is installed.
CASES.json: [{"name", "root": <regular checkpoint root>, "step": int, "source_item": <Orbax item dir>,
"params_only": bool}]. Without "source_item" (a control: a checkpoint AXLearn itself wrote) the target state is
AXLearn's `read_state_spec(<step dir>)` and the values of arrays with at most 8 elements are printed.

That snapshot was written for jax 0.4.2x with tensorflow and flax installed. On this environment (jax 0.10.2,
no tensorflow, no flax) it needs shims that do not touch the restore logic:
- `tensorflow`: only `tf.io.gfile` (here: the local filesystem via os/glob) and the `tf.data.Iterator` and
  `tf.train.Checkpoint` names are used on this path;
- `flax.struct` / `flax.serialization`: only used to declare summary classes and register serializers;
- `jax.experimental.maps` (removed from jax): `thread_resources` lives in `jax._src.mesh` now;
- `typing.runtime_checkable` on a non-Protocol class is tolerated during the import (Python 3.11 rejects it).
Everything that matters runs unmodified: `Checkpointer.restore` -> `_validate_checkpoint` (index present) ->
`TensorStoreStateStorage.restore_from_dir` -> `check_state_structure` (EXACT unless the index holds
non-array entries such as an input iterator, then CONTAINS_STATE) -> jax's `run_deserialization` over
`{"driver": "zarr", "kvstore": file}` specs with the target's shapes and dtypes.

Prints one JSON line per case: restored step, arrays, arrays equal bit for bit to the Orbax source.
"""

import glob
import importlib.machinery
import json
import os
import shutil
import sys
import types
import typing

os.environ.setdefault("JAX_PLATFORMS", "cpu")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import check_regular  # noqa: E402  (the orbax reader, loaded before the tensorflow shim exists)
import numpy as np  # noqa: E402


def reference_tree(item_dir, params_only):
    jax, ocp = check_regular.orbax_module()
    ckptr = ocp.PyTreeCheckpointer()
    meta = ckptr.metadata(item_dir).item_metadata.tree
    restore_args = jax.tree.map(
        lambda m: ocp.RestoreArgs(restore_type=np.ndarray) if isinstance(m, ocp.metadata.ArrayMetadata) else ocp.RestoreArgs(),
        meta,
    )
    tree = ckptr.restore(item_dir, restore_args=restore_args)
    tree = {k: v for k, v in tree.items() if v is not None}
    return {"model": tree["model"]} if params_only else tree


def install_shims():
    class _GFile:
        def __init__(self, path, mode="r"):
            self._f = open(path, mode)  # noqa: SIM115

        def __enter__(self):
            return self._f

        def __exit__(self, *exc):
            self._f.close()

    class _Iterator:
        pass

    tf = types.ModuleType("tensorflow")
    tf.__spec__ = importlib.machinery.ModuleSpec("tensorflow", None)
    tf.io = types.SimpleNamespace(
        gfile=types.SimpleNamespace(
            exists=os.path.exists,
            glob=glob.glob,
            GFile=_GFile,
            makedirs=lambda p: os.makedirs(p, exist_ok=True),
            rmtree=shutil.rmtree,
            isdir=os.path.isdir,
            listdir=os.listdir,
        )
    )
    tf.data = types.SimpleNamespace(Iterator=_Iterator)
    tf.train = types.SimpleNamespace(Checkpoint=None)
    sys.modules["tensorflow"] = tf

    import dataclasses

    class _PyTreeNode:
        pass

    flax = types.ModuleType("flax")
    struct = types.ModuleType("flax.struct")
    struct.dataclass = dataclasses.dataclass
    struct.PyTreeNode = _PyTreeNode
    struct.field = lambda pytree_node=True, **kw: dataclasses.field(**kw)  # noqa: ARG005
    serialization = types.ModuleType("flax.serialization")
    serialization.register_serialization_state = lambda *a, **kw: None
    serialization._dict_state_dict = None
    serialization._restore_dict = None
    flax.struct = struct
    flax.serialization = serialization
    sys.modules.update({"flax": flax, "flax.struct": struct, "flax.serialization": serialization})

    import jax.experimental
    from jax._src import mesh as mesh_lib

    maps = types.ModuleType("jax.experimental.maps")
    maps.thread_resources = mesh_lib.thread_resources
    sys.modules["jax.experimental.maps"] = maps
    jax.experimental.maps = maps


def import_axlearn(wheel_dir):
    for whl in sorted(glob.glob(os.path.join(wheel_dir, "*.whl"))):
        sys.path.insert(0, whl)
    install_shims()
    strict = typing.runtime_checkable

    def lenient(cls):
        try:
            return strict(cls)
        except TypeError:
            return cls

    typing.runtime_checkable = lenient
    try:
        from axlearn.common import checkpointer, utils
    finally:
        typing.runtime_checkable = strict
    return checkpointer, utils


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    refs = {c["name"]: reference_tree(c["source_item"], bool(c.get("params_only"))) for c in cases if c.get("source_item")}
    checkpointer, utils = import_axlearn(argv[2])
    import jax
    from jax.sharding import Mesh, PartitionSpec

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    for case in cases:
        out = {"name": case["name"], "problems": []}
        try:
            step_dir = os.path.join(case["root"], f"step_{case['step']:08d}")
            ref = refs.get(case["name"])
            if ref is None:
                ref = checkpointer.read_state_spec(step_dir)
            state = jax.tree.map(lambda a: utils.TensorSpec(shape=a.shape, dtype=a.dtype, mesh_axes=PartitionSpec()), ref)
            with open(os.path.join(step_dir, "index")) as f:
                plain = all(isinstance(v, dict) or k == "step" for k, v in json.load(f))
            validation = checkpointer.CheckpointValidationType.EXACT if plain else checkpointer.CheckpointValidationType.CONTAINS_STATE
            cfg = checkpointer.Checkpointer.default_config().set(name="restore", dir=case["root"])
            ckpt = cfg.instantiate(parent=None)
            with mesh:
                if plain:
                    step, restored = ckpt.restore(step=case["step"], state=state)
                else:
                    step = case["step"]
                    restored = ckpt._storage.restore_from_dir(  # noqa: SLF001 - restore() offers no validation argument
                        step=step, state=state, ckpt_dir=step_dir, validation=validation
                    )
            got = jax.tree_util.tree_flatten_with_path(restored)[0]
            if case["name"] not in refs:
                out["small"] = {
                    "/".join(check_regular.key_str(k) for k in path): np.asarray(a).tolist()
                    for path, a in got
                    if np.asarray(a).size <= 8
                }
                out.update({"step": step, "arrays": len(got)})
                print(json.dumps(out), flush=True)
                continue
            want = jax.tree_util.tree_flatten_with_path(ref)[0]
            matched = 0
            for (path, a), (_, b) in zip(got, want):
                a = np.asarray(a)
                if a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes():
                    matched += 1
                else:
                    out["problems"].append(f"{jax.tree_util.keystr(path)}: restored value differs")
            if len(got) != len(want):
                out["problems"].append(f"restored {len(got)} leaves, the source has {len(want)}")
            out.update({"step": step, "validation": validation.value, "arrays": len(want), "matched": matched})
        except Exception as e:  # noqa: BLE001 - report and go on with the next case
            out["problems"].append(f"{type(e).__name__}: {str(e)[:2000]}")
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
