#!/usr/bin/env python3
"""Writes AXLearn-style Orbax checkpoint fixtures with the real orbax-checkpoint library.

Usage:
    .venv/bin/python test/fixtures-gen/generate.py OUT_DIR [--only NAME ...]

Fixtures (see README.md): dtypes, zarr3, zarr3_nofill, large, multiprocess, multiprocess_iterators, iterators,
emergency.
Each is written to OUT_DIR/<name>/ (replacing any previous copy) together with
OUT_DIR/<name>/expected.json: {slash/path: {name, dtype, shape, sha256}} where sha256 is taken
over the raw little-endian C-order bytes of the array as read back by TensorStore.

Writer setup follows AXLearn's OrbaxCheckpointer (axlearn/common/checkpointer_orbax.py):
CheckpointManager with step dirs "step_%08d", items "index" (JsonCheckpointHandler(filename=
"index")) and "state" (PyTreeCheckpointHandler), and jax.Array re-registered globally as
ArrayHandler(array_metadata_store=Store(), use_replica_parallel=False,
enable_write_sharding_file=False).
"""

import argparse
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import time

# --------------------------------------------------------------------------------------------
# Environment: must be set before jax is imported. Worker processes of the `multiprocess`
# fixture get 4 CPU devices each; the main process gets 8.
_WORKER_FLAG = "--_mp-worker"
_IS_WORKER = len(sys.argv) > 1 and sys.argv[1] == _WORKER_FLAG
os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={4 if _IS_WORKER else 8}"
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import dataclasses  # noqa: E402
from concurrent import futures  # noqa: E402
from typing import Any, NamedTuple, Optional, Protocol, Sequence, runtime_checkable  # noqa: E402

import jax  # noqa: E402
import ml_dtypes  # noqa: E402
import msgpack  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
import tensorstore as ts  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402
from orbax.checkpoint._src.metadata import (  # noqa: E402
    array_metadata_store as array_metadata_store_lib,
)
from orbax.checkpoint._src.serialization import tensorstore_utils as ts_utils  # noqa: E402
from orbax.checkpoint._src.serialization import type_handler_registry  # noqa: E402
from orbax.checkpoint._src.serialization.type_handlers import ArrayHandler  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)  # Silence orbax INFO/WARNING chatter.
jax.config.update("jax_enable_x64", True)  # float64/int64/complex128 leaves keep their dtype.

SEED = "axlearn-orbax-fixtures-v1"
STEP = 100
LARGE_STEP = 200
MP_TIMEOUT_SECS = 300
FIXTURES = ("dtypes", "zarr3", "zarr3_nofill", "large", "multiprocess", "multiprocess_iterators", "iterators", "emergency")

# AXLearn: STEP_PREFIX = "step", STEP_NUM_DIGITS = 8.
NAME_FORMAT = ocp.step.standard_name_format(step_prefix="step", step_format_fixed_length=8)

# AXLearn's global override of the jax.Array handler (checkpointer_orbax.py, since 2025-12).
ocp.type_handlers.register_type_handler(
    jax.Array,
    ArrayHandler(
        array_metadata_store=array_metadata_store_lib.Store(),
        use_replica_parallel=False,
        enable_write_sharding_file=False,
    ),
    override=True,
)


# --------------------------------------------------------------------------------------------
# AXLearn's PythonSavable protocol and _PythonSavableHandler (typestr "PythonSavable"), which
# writes msgpack.packb(value.get_state()) to dirname(state_dir)/python/python_<pid>/<name>.


@runtime_checkable
class PythonSavable(Protocol):
    """A Python object with save/restore logic (e.g. a grain iterator)."""

    def get_state(self) -> Any:
        ...

    def set_state(self, state: Any):
        ...


class FakeGrainIterator:
    """Stands in for a grain DatasetIterator: state is a msgpack-able dict."""

    def __init__(self, state: dict):
        self._state = state

    def get_state(self) -> dict:
        return self._state

    def set_state(self, state: dict):
        self._state = state


FakeGrainIterator.__module__ = "fixtures_gen"  # Stable str(type(...)) in the index file.


class PythonSavableHandler(ocp.type_handlers.TypeHandler):
    """Mirror of AXLearn's _PythonSavableHandler (axlearn/common/checkpointer_orbax.py HEAD)."""

    def __init__(self):
        super().__init__()
        self._executor = futures.ThreadPoolExecutor(max_workers=1)

    @dataclasses.dataclass
    class RestoreArgs(ocp.type_handlers.RestoreArgs):
        item: Optional[Any] = None

    def typestr(self) -> str:
        return "PythonSavable"

    def _ckpt_dir(self, info) -> str:
        return os.path.join(
            os.path.dirname(os.fspath(info.parent_dir)), "python", f"python_{jax.process_index()}"
        )

    @staticmethod
    def _save(value, path: str):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(msgpack.packb(value.get_state()))

    async def serialize(self, values, infos, args=None):
        del args
        return [
            self._executor.submit(self._save, value, os.path.join(self._ckpt_dir(info), info.name))
            for value, info in zip(values, infos)
        ]

    async def deserialize(self, infos, args=None):
        out = []
        for arg, info in zip(args, infos):
            with open(os.path.join(self._ckpt_dir(info), info.name), "rb") as f:
                arg.item.set_state(msgpack.unpackb(f.read()))
            out.append(arg.item)
        return out

    async def metadata(self, infos):
        return [ocp.metadata.Metadata(name=info.name, directory=info.path) for info in infos]


ocp.type_handlers.register_type_handler(PythonSavable, PythonSavableHandler(), override=True)


# Optax-like optimizer states: NamedTuple fields are GetAttrKeys (orbax key_type 2).
class ScaleByScheduleState(NamedTuple):
    count: Any


class ScaleByAdamState(NamedTuple):
    count: Any
    mu: Any
    nu: Any


class EmptyState(NamedTuple):
    pass


# --------------------------------------------------------------------------------------------
# Deterministic values: splitmix64(element index + seed(leaf path)).


@dataclasses.dataclass(frozen=True)
class Leaf:
    """Spec of one array leaf: shape, dtype name, partition spec, optional constant/zero rows."""

    shape: tuple
    dtype: str
    spec: Any = P()
    const: Optional[int] = None
    zero_rows: Optional[tuple] = None  # (start, stop) rows of axis 0 that are all zeros.


def to_dtype(name: str) -> np.dtype:
    return np.dtype(getattr(ml_dtypes, name)) if hasattr(ml_dtypes, name) else np.dtype(name)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _bits(path: str, n: int) -> np.ndarray:
    seed = int.from_bytes(hashlib.sha256(f"{SEED}:{path}".encode()).digest()[:8], "little")
    with np.errstate(over="ignore"):
        return _splitmix64(np.arange(n, dtype=np.uint64) + np.uint64(seed))


_SPECIALS = np.array([np.nan, -0.0, np.inf, -np.inf], dtype=np.float32)


def _floats(path: str, n: int, name: str) -> np.ndarray:
    bits = _bits(path, n)
    if name == "float8_e8m0fnu":  # Unsigned exponent-only type: powers of two.
        return np.exp2((bits % np.uint64(17)).astype(np.float32) - 8)
    u = (bits >> np.uint64(11)).astype(np.float64) * (2.0**-53)
    scale = 6.0 if name == "float4_e2m1fn" else 2.0
    v = ((u * 2.0 - 1.0) * scale).astype(np.float32 if name != "float64" else np.float64)
    if n >= 4:
        v[:4] = _SPECIALS
    return v


def leaf_values(path: str, leaf: Leaf) -> np.ndarray:
    """Full (global) value of a leaf, as a C-order numpy array of the leaf's dtype."""
    dt = to_dtype(leaf.dtype)
    n = int(np.prod(leaf.shape, dtype=np.int64))
    name = leaf.dtype
    if leaf.const is not None:
        flat = np.full(n, leaf.const).astype(dt)
    elif name == "bool":
        flat = (_bits(path, n) & np.uint64(1)).astype(bool)
    elif name in ("int4", "int2"):
        k = 16 if name == "int4" else 4
        flat = ((_bits(path, n) % np.uint64(k)).astype(np.int8) - k // 2).astype(dt)
    elif name.startswith("complex"):
        part = "float32" if name == "complex64" else "float64"
        re = _floats(path, n, part)
        im = _floats(path + "#imag", n, part)
        im[:4] = 0.5
        flat = (re.astype(np.float64) + 1j * im.astype(np.float64)).astype(dt)
        if n >= 4:  # Keep the exact special bits in the real part.
            flat.real[:4] = _SPECIALS.astype(flat.real.dtype)
    elif name.startswith("float") or name == "bfloat16":
        flat = _floats(path, n, name).astype(dt)
    elif name.startswith(("int", "uint")):
        flat = _bits(path, n).astype(np.dtype(f"uint{8 * dt.itemsize}")).view(dt)
    else:
        raise ValueError(f"unsupported dtype {name}")
    arr = flat.reshape(leaf.shape)
    if leaf.zero_rows is not None:
        arr[leaf.zero_rows[0] : leaf.zero_rows[1]] = 0
    return np.array(arr, order="C")  # (np.ascontiguousarray would make rank 0 into (1,))


# --------------------------------------------------------------------------------------------
# Trees.


def key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def flatten_items(tree, is_leaf=None):
    """AXLearn utils.flatten_items: [(slash/path, leaf)] in jax flatten order."""
    flat, _ = jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)
    return [("/".join(key_str(k) for k in kp), v) for kp, v in flat]


def _is_leaf(x):
    return isinstance(x, Leaf)


def materialize(spec_tree, mesh: Mesh):
    """Turns Leaf specs into jax.Arrays (works multi-process: each process builds its shards)."""

    def make(kp, leaf):
        if not isinstance(leaf, Leaf):
            return leaf
        path = "/".join(key_str(k) for k in kp)
        value = leaf_values(path, leaf)
        sharding = NamedSharding(mesh, leaf.spec)
        return jax.make_array_from_callback(leaf.shape, sharding, lambda idx: np.asarray(value[idx]))

    return jax.tree_util.tree_map_with_path(make, spec_tree, is_leaf=_is_leaf)


def axlearn_tree(extra_model: Optional[dict] = None, *, count: int = STEP, empty_state=False):
    """The `tiny` AXLearn-shaped tree (see ../shared generator.md), on a (4, 2) data/model mesh."""
    model = {
        "decoder": {
            "emb": {"token_emb": {"weight": Leaf((8, 16), "float32", P("data", None))}},
            "layer": {
                "ffn": {"weight": Leaf((64, 64), "float32", P("data", "model"))},
                "linear": {"weight": Leaf((4, 8), "bfloat16", P("data", "model"))},
            },
            "output_norm": {"scale": Leaf((3,), "float32", P())},
        }
    }
    if extra_model:
        for dotted, leaf in extra_model.items():
            node = model
            parts = dotted.split("/")
            for p in parts[:-1]:
                node = node.setdefault(p, {})
            node[parts[-1]] = leaf

    # Adam mu/nu mirror the model tree (same shapes/shardings; values differ by path).
    adam = ScaleByAdamState(count=Leaf((), "int32", const=count), mu=model, nu=model)
    opt1 = (adam, EmptyState()) if empty_state else (adam,)
    return {
        "learner": {"optimizer": (ScaleByScheduleState(count=Leaf((), "int32", const=count)), opt1)},
        "model": model,
        "prng_key": Leaf((4,), "uint32", P()),
    }


def tree_specs(spec_tree):
    """[(path, Leaf)] for all array leaves, in jax flatten order."""
    return [(p, v) for p, v in flatten_items(spec_tree, is_leaf=_is_leaf) if isinstance(v, Leaf)]


def make_index(step: int, tree) -> list:
    """AXLearn OrbaxCheckpointer._get_spec(...)["index"]."""
    index = [["step", step]]
    for path, value in flatten_items(tree):
        if isinstance(value, (jax.Array, Leaf)):
            dtype = to_dtype(value.dtype) if isinstance(value, Leaf) else value.dtype
            index.append([path, {"dtype": str(dtype), "shape": str(tuple(value.shape))}])
        elif isinstance(value, PythonSavable):
            index.append([path, str(type(value))])
        else:
            index.append([path, value])
    return index


# --------------------------------------------------------------------------------------------
# Saving.


def axlearn_manager(root: str, *, use_zarr3: bool = False) -> ocp.CheckpointManager:
    """CheckpointManager with AXLearn OrbaxCheckpointer's options and items."""
    return ocp.CheckpointManager(
        directory=root,
        options=ocp.CheckpointManagerOptions(
            create=True,
            max_to_keep=1,
            enable_async_checkpointing=True,
            step_name_format=NAME_FORMAT,
            enable_background_delete=True,
            async_options=ocp.options.AsyncOptions(
                timeout_secs=MP_TIMEOUT_SECS, create_directories_asynchronously=False
            ),
            lightweight_initialize=True,
            cleanup_tmp_directories=True,
        ),
        item_handlers={
            "index": ocp.JsonCheckpointHandler(filename="index"),
            # use_zarr3=True only for the zarr3 fixture (AXLearn itself uses the default False).
            "state": ocp.PyTreeCheckpointHandler(use_zarr3=use_zarr3),
        },
    )


def save_axlearn(root: str, step: int, tree, *, use_zarr3=False, save_args=None):
    mngr = axlearn_manager(root, use_zarr3=use_zarr3)
    mngr.save(
        step,
        args=ocp.args.Composite(
            index=ocp.args.JsonSave(make_index(step, tree)),
            state=ocp.args.PyTreeSave(item=tree, save_args=save_args),
        ),
        force=True,
    )
    mngr.wait_until_finished()
    mngr.close()


# --------------------------------------------------------------------------------------------
# Reading back / expected.json.


def kvstore_spec(item_dir: str) -> dict:
    return {"driver": "ocdbt", "base": f"file://{os.path.abspath(item_dir)}"}


def read_array(item_dir: str, name: str, zarr3: bool) -> np.ndarray:
    spec = {
        "driver": "zarr3" if zarr3 else "zarr",
        "kvstore": {**kvstore_spec(item_dir), "path": name + "/"},
    }
    return ts.open(spec, open=True, read=True).result().read().result()


def read_key(item_dir: str, key: str) -> bytes:
    kv = ts.KvStore.open(kvstore_spec(item_dir)).result()
    return bytes(kv.read(key).result().value)


def list_keys(item_dir: str) -> list:
    kv = ts.KvStore.open(kvstore_spec(item_dir)).result()
    return sorted(k.decode() for k in kv.list().result())


def sha256_of(arr: np.ndarray) -> str:
    arr = np.array(arr, order="C")
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    return hashlib.sha256(arr.tobytes()).hexdigest()


def write_expected(fixture_dir: str, item_dir: str, specs, zarr3: bool) -> dict:
    """Reads every array back with TensorStore, checks it bit-for-bit, writes expected.json."""
    expected = {}
    for path, leaf in specs:
        name = path.replace("/", ".")
        got = read_array(item_dir, name, zarr3)
        want = leaf_values(path, leaf)
        if got.dtype != want.dtype or got.shape != want.shape or got.tobytes() != want.tobytes():
            raise AssertionError(f"{path}: read-back differs from written value")
        expected[path] = {
            "dtype": str(got.dtype),
            "name": name,
            "sha256": sha256_of(got),
            "shape": list(got.shape),
        }
    with open(os.path.join(fixture_dir, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1, sort_keys=True)
        f.write("\n")
    return expected


def rewrite_commit_files(fixture_dir: str):
    """commit_success.txt names the writer's absolute path; make it stable (/checkpoints/...)."""
    prefix = os.path.abspath(fixture_dir)
    for dirpath, _, files in os.walk(fixture_dir):
        if "commit_success.txt" in files:
            p = os.path.join(dirpath, "commit_success.txt")
            with open(p) as f:
                text = f.read()
            with open(p, "w") as f:
                f.write(text.replace(prefix, "/checkpoints"))


def ocdbt_refs(item_dir: str) -> dict:
    """{key: "value:<base_path>:<relative path>:<offset>:<length>" | None (inline)} of the root."""
    base = ts.KvStore.open(f"file://{os.path.abspath(item_dir)}/").result()
    refs = {}

    def node_refs(obj):
        if isinstance(obj, str) and obj.startswith("btreenode::"):
            yield obj
        elif isinstance(obj, dict):
            for v in obj.values():
                yield from node_refs(v)

    def walk(ref):
        node = ts.ocdbt.dump(base, ref).result()
        for e in node["entries"]:
            if node["height"] > 0:
                for child in node_refs(e):
                    walk(child)
            else:
                refs[bytes(e["key"]).decode()] = e.get("indirect_value")

    manifest = ts.ocdbt.dump(base).result()
    root = manifest["versions"][-1]["root"]
    if "location" in root:
        walk(root["location"])
    return refs


# --------------------------------------------------------------------------------------------
# Fixtures. Each takes the (temporary) fixture dir and returns a list of report lines.


DTYPES = [
    "float32", "bfloat16", "float16", "float64",
    "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "bool",
    "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e4m3b11fnuz",
    "float8_e3m4", "float8_e8m0fnu", "float4_e2m1fn", "int4", "int2",
    "complex64", "complex128",
]  # fmt: skip


def mesh_1d():
    return Mesh(np.array(jax.devices()), ("data",))


def mesh_2d():
    return Mesh(np.array(jax.devices()).reshape(4, 2), ("data", "model"))


def gen_dtypes(fdir: str) -> list:
    dtypes = {d: Leaf((8, 16), d, P("data")) for d in DTYPES}
    dtypes["scalar_float64"] = Leaf((), "float64")
    dtypes["scalar_int32"] = Leaf((), "int32")
    dtypes["rank1_float32"] = Leaf((24,), "float32", P("data"))
    spec_tree = {
        "learner": {"optimizer": (ScaleByScheduleState(count=Leaf((), "int32", const=STEP)),)},
        "model": {"dtypes": dtypes},
        "prng_key": Leaf((4,), "uint32"),
    }
    save_axlearn(fdir, STEP, materialize(spec_tree, mesh_1d()))
    item = os.path.join(fdir, f"step_{STEP:08d}", "state")
    write_expected(fdir, item, tree_specs(spec_tree), zarr3=False)
    z = json.loads(read_key(item, "model.dtypes.int4/.zarray"))
    return [f"{len(DTYPES)} dtypes; int4 .zarray dtype={z['dtype']!r} chunks={z['chunks']}"]


def _gen_zarr3(fdir: str, *, store_fill_chunks: bool) -> list:
    # ffn/bias rows 16..31 (= chunk c/1 of 4) are all zeros == zarr3 fill_value 0;
    # linear/bias is entirely zero.
    extra = {
        "decoder/layer/ffn/bias": Leaf((64,), "float32", P("data"), zero_rows=(16, 32)),
        "decoder/layer/linear/bias": Leaf((8,), "float32", P("data"), zero_rows=(0, 8)),
    }
    spec_tree = axlearn_tree(extra)
    tree = materialize(spec_tree, mesh_2d())
    saved = ts_utils.STORE_ARRAY_DATA_EQUAL_TO_FILL_VALUE
    try:
        # False emulates orbax < 0.10 (TensorStore then skips chunks equal to the fill value).
        ts_utils.STORE_ARRAY_DATA_EQUAL_TO_FILL_VALUE = store_fill_chunks
        save_axlearn(fdir, STEP, tree, use_zarr3=True)
    finally:
        ts_utils.STORE_ARRAY_DATA_EQUAL_TO_FILL_VALUE = saved
    item = os.path.join(fdir, f"step_{STEP:08d}", "state")
    write_expected(fdir, item, tree_specs(spec_tree), zarr3=True)
    keys = list_keys(item)
    lines = []
    for name in ("model.decoder.layer.ffn.bias", "model.decoder.layer.linear.bias"):
        own = [k[len(name) + 1 :] for k in keys if k.startswith(name + "/")]
        meta = json.loads(read_key(item, f"{name}/zarr.json"))
        lines.append(f"{name}: keys {own}, fill_value={meta.get('fill_value')}")
    with open(os.path.join(item, "_METADATA")) as f:
        flag = json.load(f)["store_array_data_equal_to_fill_value"]
    lines.append(f"_METADATA store_array_data_equal_to_fill_value={flag}")
    return lines


def gen_zarr3(fdir: str) -> list:
    return _gen_zarr3(fdir, store_fill_chunks=True)


def gen_zarr3_nofill(fdir: str) -> list:
    return _gen_zarr3(fdir, store_fill_chunks=False)


SUBCHUNK_BYTES = 64 * 1024


def gen_large(fdir: str) -> list:
    spec_tree = {
        "learner": {"optimizer": (ScaleByScheduleState(count=Leaf((), "int32", const=LARGE_STEP)),)},
        "model": {
            "decoder": {
                "emb": {"token_emb": {"weight": Leaf((1024, 2048), "float32", P("data"))}},
                "layer": {"ffn": {"weight": Leaf((512, 1024), "float32", P("data"))}},
                "output": {"weight": Leaf((4096, 1024), "bfloat16", P())},
            }
        },
    }
    tree = materialize(spec_tree, mesh_1d())
    # Subchunk ffn/weight: shard (64, 1024) f32 = 256 KiB, chunk_byte_size 64 KiB.
    save_args = jax.tree.map(lambda _: ocp.SaveArgs(), tree)
    save_args["model"]["decoder"]["layer"]["ffn"]["weight"] = ocp.SaveArgs(
        chunk_byte_size=SUBCHUNK_BYTES
    )
    save_axlearn(fdir, LARGE_STEP, tree, save_args=save_args)
    item = os.path.join(fdir, f"step_{LARGE_STEP:08d}", "state")
    write_expected(fdir, item, tree_specs(spec_tree), zarr3=False)
    lines = []
    for name in (
        "model.decoder.emb.token_emb.weight",
        "model.decoder.layer.ffn.weight",
        "model.decoder.output.weight",
    ):
        z = json.loads(read_key(item, f"{name}/.zarray"))
        nchunks = sum(1 for k in list_keys(item) if k.startswith(name + "/") and ".z" not in k)
        lines.append(f"{name}: shape={z['shape']} chunks={z['chunks']} ({nchunks} chunk keys)")
    z = json.loads(read_key(item, "model.decoder.layer.ffn.weight/.zarray"))
    assert z["chunks"] != [64, 1024], "subchunking did not happen"
    refs = ocdbt_refs(item)
    big = sorted({v.split(":")[1] + v.split(":")[2] for v in refs.values() if v})
    lines.append(f"out-of-line data files: {big}")
    return lines


def gen_iterators(fdir: str) -> list:
    spec_tree = axlearn_tree(empty_state=True)
    tree = materialize(spec_tree, mesh_2d())
    tree["input_iter"] = FakeGrainIterator({"next_index": 1234, "epoch": 3, "seed": 7})
    save_axlearn(fdir, STEP, tree)
    step_dir = os.path.join(fdir, f"step_{STEP:08d}")
    write_expected(fdir, os.path.join(step_dir, "state"), tree_specs(spec_tree), zarr3=False)
    py = os.path.join(step_dir, "python", "python_0", "input_iter")
    with open(py, "rb") as f:
        raw = f.read()
    state = msgpack.unpackb(raw)
    assert state == {"next_index": 1234, "epoch": 3, "seed": 7}, state
    with open(os.path.join(step_dir, "state", "_METADATA")) as f:
        md = json.load(f)["tree_metadata"]
    files = {
        "step_00000100/python/python_0/input_iter": {
            "sha256": hashlib.sha256(raw).hexdigest(),
            "msgpack": state,
        }
    }
    with open(os.path.join(fdir, "expected_files.json"), "w") as f:
        json.dump(files, f, indent=1, sort_keys=True)
        f.write("\n")
    return [
        f"python file: {os.path.relpath(py, fdir)} ({len(raw)} bytes) = {state}",
        f"_METADATA input_iter: {md[str(('input_iter',))]['value_metadata']}",
        "_METADATA empty optax state: "
        + str(md[str(("learner", "optimizer", "1", "1"))]["value_metadata"]),
    ]


TF_ITERATOR_TYPE = "<class 'tensorflow.python.data.ops.iterator_ops.OwnedIterator'>"


def gen_emergency(fdir: str) -> list:
    """AXLearn OrbaxEmergencyCheckpointer persistent layout (§1.7): tensors/ + non-tensors/."""
    spec_tree = axlearn_tree()
    tree = materialize(spec_tree, mesh_2d())
    # AXLearn replaced non-tensor leaves (here: the input iterator) by None for the tensors save.
    tree["input_iter"] = None
    # orbax experimental.emergency.checkpoint_manager._persistent_checkpoint_handler():
    mp_options = ocp.options.MultiprocessingOptions(primary_host=0)
    registry = type_handler_registry.create_type_handler_registry(
        (jax.Array, ArrayHandler(primary_host=0, replica_id=0, use_replica_parallel=False))
    )
    handler = ocp.PyTreeCheckpointHandler(
        use_ocdbt=True,
        use_zarr3=True,
        multiprocessing_options=mp_options,
        type_handler_registry=registry,
    )
    tensors = os.path.join(fdir, "tensors")
    os.makedirs(tensors)
    mngr = ocp.CheckpointManager(
        tensors,
        options=ocp.CheckpointManagerOptions(
            max_to_keep=1,
            step_name_format=NAME_FORMAT,
            create=False,
            cleanup_tmp_directories=True,
            async_options=ocp.options.AsyncOptions(timeout_secs=MP_TIMEOUT_SECS),
            multiprocessing_options=mp_options,
            enable_async_checkpointing=True,
            save_root_metadata=False,
        ),
        item_handlers=handler,
    )
    mngr.save(STEP, args=ocp.args.PyTreeSave(item=tree), force=True)
    mngr.wait_until_finished()
    mngr.close()
    # Non-tensors: AXLearn native Checkpointer + _TFSavablesStateStorage; `index` written last.
    index = make_index(STEP, tree)
    index = [[p, TF_ITERATOR_TYPE] if p == "input_iter" else [p, v] for p, v in index]
    if not any(p == "input_iter" for p, _ in index):
        index.insert(1, ["input_iter", TF_ITERATOR_TYPE])
    nt = os.path.join(fdir, "non-tensors", f"step_{STEP:08d}")
    os.makedirs(nt)
    with open(os.path.join(nt, "index"), "w") as f:
        f.write(json.dumps(index))
    item = os.path.join(tensors, f"step_{STEP:08d}", "default")
    write_expected(fdir, item, tree_specs(spec_tree), zarr3=True)
    with open(os.path.join(nt, "index"), "rb") as f:
        raw = f.read()
    with open(os.path.join(fdir, "expected_files.json"), "w") as f:
        json.dump(
            {f"non-tensors/step_{STEP:08d}/index": {"sha256": hashlib.sha256(raw).hexdigest()}},
            f,
            indent=1,
            sort_keys=True,
        )
        f.write("\n")
    with open(os.path.join(item, "_METADATA")) as f:
        md = json.load(f)
    return [
        f"item dir: {os.path.relpath(item, fdir)}; files: {sorted(os.listdir(item))}",
        f"use_zarr3={md['use_zarr3']}; input_iter: "
        + str(md["tree_metadata"][str(("input_iter",))]["value_metadata"]),
    ]


# --------------------------------------------------------------------------------------------
# multiprocess: two real JAX processes (4 CPU devices each) on loopback.


def mp_spec_tree():
    return {
        "learner": {"optimizer": (ScaleByScheduleState(count=Leaf((), "int32", const=STEP)),)},
        "model": {
            "decoder": {
                "emb": {"token_emb": {"weight": Leaf((128, 64), "bfloat16", P("data", None))}},
                "layer": {
                    "ffn": {"weight": Leaf((64, 64), "float32", P("data", "model"))},
                    "proj": {"weight": Leaf((256, 256), "float32", P("data", "model"))},
                    # Sharded only on "model": replica 0 shards all live on process 0.
                    "out": {"weight": Leaf((32, 64), "float32", P(None, "model"))},
                },
                "output_norm": {"scale": Leaf((3,), "float32", P())},
            }
        },
        "prng_key": Leaf((4,), "uint32", P()),
    }


def mp_worker(process_id: int, port: int, root: str, iterators: bool = False):
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}",
        num_processes=2,
        process_id=process_id,
        initialization_timeout=120,
    )
    assert jax.process_count() == 2 and len(jax.devices()) == 8, jax.devices()
    assert len(jax.local_devices()) == 4
    spec_tree = mp_spec_tree()
    tree = materialize(spec_tree, mesh_2d())
    if iterators:
        # Each process's own input iterator (its own position in its own shard of the data), written by the
        # PythonSavable handler to python/python_<process index>/input_iter, as AXLearn's trainer saves it.
        tree["input_iter"] = FakeGrainIterator({"next_index": 1000 + process_id, "epoch": 3, "shard": process_id})
    save_axlearn(root, STEP, tree)
    print(f"process {process_id}: saved", flush=True)
    jax.distributed.shutdown()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gen_multiprocess(fdir: str, *, iterators: bool = False) -> list:
    port = _free_port()
    logs, procs = [], []
    os.makedirs(fdir)
    env = dict(os.environ)
    env.pop("XLA_FLAGS", None)
    try:
        for i in range(2):
            log = open(os.path.join(fdir, f".worker{i}.log"), "w")  # pylint: disable=consider-using-with
            logs.append(log)
            procs.append(
                subprocess.Popen(  # pylint: disable=consider-using-with
                    [sys.executable, os.path.abspath(__file__), _WORKER_FLAG, str(i), str(port), fdir]
                    + (["iterators"] if iterators else []),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            )
        deadline = time.monotonic() + MP_TIMEOUT_SECS
        while any(p.poll() is None for p in procs):
            if time.monotonic() > deadline:
                raise TimeoutError(f"multiprocess workers exceeded {MP_TIMEOUT_SECS}s")
            if any(p.poll() not in (None, 0) for p in procs):
                break
            time.sleep(0.1)
        rcs = [p.poll() for p in procs]
        if rcs != [0, 0]:
            raise RuntimeError(f"multiprocess workers failed: rc={rcs}")
    except BaseException:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for log in logs:
            log.close()
        for i in range(len(procs)):
            path = os.path.join(fdir, f".worker{i}.log")
            if os.path.exists(path):
                with open(path) as f:
                    sys.stderr.write(f"---- worker {i} log (tail) ----\n{f.read()[-4000:]}\n")
        raise
    for log in logs:
        log.close()
    for i in range(2):
        os.remove(os.path.join(fdir, f".worker{i}.log"))

    spec_tree = mp_spec_tree()
    item = os.path.join(fdir, f"step_{STEP:08d}", "state")
    write_expected(fdir, item, tree_specs(spec_tree), zarr3=False)
    # Verification: the merged root references both per-process databases.
    keys = list_keys(item)
    refs = ocdbt_refs(item)
    by_base = {}
    for key, ref in refs.items():
        base = ref.split(":")[1] if ref else "(inline)"
        by_base.setdefault(base, []).append(key)
    lines = [f"root keys: {len(keys)}"]
    for base in sorted(by_base):
        lines.append(f"  {base}: {len(by_base[base])} keys, e.g. {sorted(by_base[base])[:3]}")
    for pid in (0, 1):
        pdir = os.path.join(item, f"ocdbt.process_{pid}")
        dfiles = os.listdir(os.path.join(pdir, "d"))
        assert os.path.exists(os.path.join(pdir, "manifest.ocdbt")), pdir
        assert f"ocdbt.process_{pid}/" in by_base, f"no out-of-line values from process {pid}"
        own = list_keys(pdir)
        lines.append(
            f"ocdbt.process_{pid}: manifest.ocdbt + {len(dfiles)} d/ files; its own DB lists "
            f"{len(own)} keys ({sum(1 for k in own if '.z' not in k)} chunks)"
        )
    lines.append(f"array_metadatas: {sorted(os.listdir(os.path.join(item, 'array_metadatas')))}")
    if iterators:
        files = {}
        for pid in (0, 1):
            rel = f"step_{STEP:08d}/python/python_{pid}/input_iter"
            with open(os.path.join(fdir, rel), "rb") as f:
                raw = f.read()
            files[rel] = {"sha256": hashlib.sha256(raw).hexdigest(), "msgpack": msgpack.unpackb(raw)}
            assert files[rel]["msgpack"]["shard"] == pid, files[rel]
            lines.append(f"python file of process {pid}: {rel} = {files[rel]['msgpack']}")
        with open(os.path.join(fdir, "expected_files.json"), "w") as f:
            json.dump(files, f, indent=1, sort_keys=True)
            f.write("\n")
    return lines


def gen_multiprocess_iterators(fdir: str) -> list:
    """The two-process save with each process's python iterator (python/python_0, python/python_1)."""
    return gen_multiprocess(fdir, iterators=True)


# --------------------------------------------------------------------------------------------


GENERATORS = {
    "dtypes": gen_dtypes,
    "zarr3": gen_zarr3,
    "zarr3_nofill": gen_zarr3_nofill,
    "large": gen_large,
    "multiprocess": gen_multiprocess,
    "multiprocess_iterators": gen_multiprocess_iterators,
    "iterators": gen_iterators,
    "emergency": gen_emergency,
}


def dir_size(path: str) -> int:
    return sum(
        os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files
    )


def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--only", nargs="+", choices=FIXTURES, metavar="NAME")
    args = parser.parse_args(argv)
    names = args.only or list(FIXTURES)
    out = os.path.abspath(args.out_dir)
    os.makedirs(out, exist_ok=True)
    total_t = time.monotonic()
    for name in names:
        t = time.monotonic()
        tmp = os.path.join(out, f".{name}.tmp")
        if os.path.exists(tmp):
            shutil.rmtree(tmp)
        if not name.startswith("multiprocess"):
            os.makedirs(tmp)
        lines = GENERATORS[name](tmp)
        rewrite_commit_files(tmp)
        final = os.path.join(out, name)
        if os.path.exists(final):
            shutil.rmtree(final)
        os.rename(tmp, final)
        with open(os.path.join(final, "expected.json")) as f:
            n = len(json.load(f))
        print(
            f"[{name}] {n} arrays, {dir_size(final) / 2**20:.2f} MiB, "
            f"{time.monotonic() - t:.1f}s -> {final}",
            flush=True,
        )
        for line in lines:
            print(f"    {line}", flush=True)
    print(f"done in {time.monotonic() - total_t:.1f}s", flush=True)
    return 0


if __name__ == "__main__":
    if _IS_WORKER:
        mp_worker(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], iterators=sys.argv[5:] == ["iterators"])
        sys.exit(0)
    sys.exit(main(sys.argv[1:]))
