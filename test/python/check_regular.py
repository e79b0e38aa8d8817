#!/usr/bin/env python3
"""Checks converted AXLearn regular checkpoints against their Orbax sources, independently of orbax2reg.

Usage:
    .venv/bin/python test/python/check_regular.py CASES.json

CASES.json is a list of cases:
    {"name": str,
     "regular": "<abs path of the converted step_XXXXXXXX dir>",
     "source_item": "<abs path of the Orbax PyTree item dir (has _METADATA)>",
     "source_kvstore": "<abs OCDBT dir to read instead of source_item>" (optional; an unmerged item),
     "source_index": "<abs path of the source AXLearn index file>" (optional),
     "params_only": bool (optional),
     "orbax": bool (optional, default true: also restore the source with orbax's PyTreeCheckpointer)}

For every case prints ONE JSON line (a summary; `problems` lists everything that is wrong):
- each `gda/<path>` of the converted index is opened exactly as AXLearn's restore opens it
  (ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": <abs>}}, open=True)) and read;
- the source is read twice: with orbax (PyTreeCheckpointer.restore, restore_type=np.ndarray) and with
  tensorstore's own zarr/zarr3 driver over the OCDBT kvstore (what orbax does underneath);
- arrays are compared bit for bit (`.tobytes()`, so NaN payloads and -0.0 matter), with dtype and shape;
- what AXLearn's restore silently accepts is checked too: every chunk file of the grid exists, the
  `.zarray` shape and dtype equal the index's, no array under gda/ is missing from the index, no stray
  files sit next to the chunks;
- the index: `["step", N]` first with N an int equal to the directory's step, dict values with keys
  exactly (dtype, shape), AXLearn's EXACT check (sorted f"{path}={value}") against the source index and
  against the index AXLearn would build from the restored arrays, and the bytes against json.dumps;
- every `.zarray` is compact JSON with sorted keys, zstd level 1, fill_value/filters null, order C,
  separator "."; for zarr v2 sources it must equal the source's `.zarray` bytes.
"""

import ast
import hashlib
import json
import math
import os
import sys

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorstore as ts  # noqa: E402

ARRAY_TYPES = ("jax.Array", "np.ndarray", "scalar")
ZARRAY_FIXED = {
    "compressor": {"id": "zstd", "level": 1},
    "dimension_separator": ".",
    "fill_value": None,
    "filters": None,
    "order": "C",
    "zarr_format": 2,
}


def is_param(path):
    """What --params-only keeps: the model's parameters and the PRNG key (what AXLearn's InferenceRunner restores)."""
    return path == "prng_key" or path == "model" or path.startswith("model/")


def structure(entries):
    """AXLearn's check_state_structure: sorted f"{path}={value}" strings."""
    return sorted(f"{k}={v}" for k, v in entries)


def source_leaves(item_dir, kv_dir):
    """(orbax name, slash path) of every array leaf, from the item's _METADATA, in tree order.

    Without _METADATA (one of Orbax's own compatibility fixtures), every `<name>/.zarray` or `<name>/zarr.json`
    key of the database is an array and its path is the name split at ".".
    """
    if not os.path.exists(os.path.join(item_dir, "_METADATA")):
        keys = [k.decode() for k in ts.KvStore.open({"driver": "ocdbt", "base": f"file://{kv_dir}"}).result().list().result()]
        leaves = [(k.rsplit("/", 1)[0], k.rsplit("/", 1)[0].replace(".", "/")) for k in keys if k.endswith(("/.zarray", "/zarr.json"))]
        return sorted(leaves), any(k.endswith("/zarr.json") for k in keys)
    with open(os.path.join(item_dir, "_METADATA")) as f:
        meta = json.load(f)
    leaves = []
    for key, value in meta["tree_metadata"].items():
        if value["value_metadata"]["value_type"] not in ARRAY_TYPES:
            continue
        parts = [str(p) for p in ast.literal_eval(key)]
        leaves.append((".".join(parts), "/".join(parts)))
    return leaves, bool(meta.get("use_zarr3"))


def read_source_tensorstore(kv_dir, leaves, zarr3):
    out = {}
    for name, path in leaves:
        spec = {
            "driver": "zarr3" if zarr3 else "zarr",
            "kvstore": {"driver": "ocdbt", "base": f"file://{kv_dir}", "path": f"{name}/"},
        }
        out[path] = ts.open(spec, open=True).result().read().result()
    return out


_ORBAX = None


def orbax_module():
    global _ORBAX
    if _ORBAX is None:
        import jax
        import orbax.checkpoint as ocp
        from absl import logging as absl_logging

        absl_logging.set_verbosity(absl_logging.ERROR)
        jax.config.update("jax_enable_x64", True)

        # The `iterators` fixture holds a leaf saved by a custom "PythonSavable" type handler (AXLearn's
        # _PythonSavableHandler). Orbax needs some handler for that typestr to read the tree at all; this one
        # restores the leaf as None (its file is checked byte for byte by the TS test).
        class _Opaque:
            pass

        class _OpaqueHandler(ocp.type_handlers.TypeHandler):
            def typestr(self):
                return "PythonSavable"

            async def metadata(self, infos):
                return [ocp.metadata.Metadata(name=i.name, directory=i.path) for i in infos]

            async def serialize(self, values, infos, args=None):
                raise NotImplementedError

            async def deserialize(self, infos, args=None):
                return [None for _ in infos]

        ocp.type_handlers.register_type_handler(_Opaque, _OpaqueHandler(), override=True)
        _ORBAX = (jax, ocp)
    return _ORBAX


def key_str(k):
    for attr in ("key", "idx", "name"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    raise TypeError(f"unknown key {k!r}")


def read_source_orbax(item_dir):
    """The item restored by orbax itself, as (slash path, np.ndarray) in jax flatten order."""
    jax, ocp = orbax_module()
    ckptr = ocp.PyTreeCheckpointer()
    tree = ckptr.metadata(item_dir).item_metadata.tree
    restore_args = jax.tree.map(
        lambda m: ocp.RestoreArgs(restore_type=np.ndarray) if isinstance(m, ocp.metadata.ArrayMetadata) else ocp.RestoreArgs(),
        tree,
    )
    restored = ckptr.restore(item_dir, restore_args=restore_args)
    flat = jax.tree_util.tree_flatten_with_path(restored)[0]
    return [("/".join(key_str(k) for k in path), v) for path, v in flat if isinstance(v, np.ndarray)]


def same_array(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def chunk_keys(shape, chunks):
    if len(shape) == 0:
        return ["0"]
    grid = [math.ceil(s / c) for s, c in zip(shape, chunks)]
    keys = [""]
    for n in grid:
        keys = [f"{k}.{i}" if k else str(i) for k in keys for i in range(n)]
    return keys


def check_case(case):
    problems = []
    regular = case["regular"]
    item = case["source_item"]
    kv = case.get("source_kvstore") or item
    params_only = bool(case.get("params_only"))
    summary = {"name": case["name"], "params_only": params_only}

    # ---- index -------------------------------------------------------------------------------
    with open(os.path.join(regular, "index"), "rb") as f:
        index_bytes = f.read()
    entries = json.loads(index_bytes)
    summary["index_entries"] = len(entries)
    dir_step = int(os.path.basename(regular.rstrip("/"))[-8:])  # AXLearn's parse_step_from_dir
    first = entries[0] if entries else None
    summary["step"] = first[1] if isinstance(first, list) and len(first) == 2 else None
    if not (first and first[0] == "step" and type(first[1]) is int):
        problems.append(f'index does not start with ["step", <int>]: {first!r}')
    elif first[1] != dir_step:
        problems.append(f"index step {first[1]} != directory step {dir_step}")
    arrays_in_index = {}
    for pair in entries[1:]:
        path, value = pair
        if isinstance(value, dict):
            if list(value.keys()) != ["dtype", "shape"]:
                problems.append(f"{path}: index value keys {list(value.keys())} (AXLearn needs exactly dtype, shape)")
            if path in arrays_in_index:
                problems.append(f"{path}: duplicated in the index")
            arrays_in_index[path] = value
    summary["structure"] = structure(entries)

    source_entries = None
    if case.get("source_index"):
        with open(case["source_index"], "rb") as f:
            source_entries = json.loads(f.read())
        if params_only:
            source_entries = [e for e in source_entries if e[0] == "step" or is_param(e[0])]
        summary["structure_exact_vs_source_index"] = structure(entries) == structure(source_entries)
        if not summary["structure_exact_vs_source_index"]:
            problems.append("EXACT structure check against the source index fails")
        summary["index_bytes_equal_json_dumps"] = index_bytes == json.dumps(source_entries).encode()
        if not summary["index_bytes_equal_json_dumps"]:
            problems.append("index bytes differ from json.dumps(source index entries)")

    # ---- source, read twice --------------------------------------------------------------------
    leaves, zarr3 = source_leaves(item, kv)
    if params_only:
        leaves = [(n, p) for n, p in leaves if is_param(p)]
    via_ts = read_source_tensorstore(kv, leaves, zarr3)
    summary["source_zarr_format"] = 3 if zarr3 else 2
    summary["source_arrays_tensorstore"] = len(via_ts)
    via_orbax = None
    if case.get("orbax", True):
        restored = read_source_orbax(item)
        if params_only:
            restored = [(p, a) for p, a in restored if is_param(p)]
        via_orbax = dict(restored)
        summary["source_arrays_orbax"] = len(via_orbax)
        agree = sorted(via_orbax) == sorted(via_ts) and all(same_array(via_orbax[p], via_ts[p]) for p in via_ts)
        summary["orbax_agrees_with_tensorstore"] = agree
        if not agree:
            problems.append("orbax's restore and tensorstore's OCDBT read of the source disagree")
        # The index AXLearn builds for this state (_get_spec): step, then arrays in jax flatten order.
        target = [["step", dir_step]] + [
            [p, {"dtype": str(a.dtype), "shape": str(tuple(a.shape))}] for p, a in restored
        ]
        others = [e for e in entries[1:] if not isinstance(e[1], dict)]  # iterator entries: not arrays
        summary["structure_exact_vs_restored_arrays"] = structure(entries) == structure(target + others)
        if not summary["structure_exact_vs_restored_arrays"]:
            problems.append("EXACT structure check against the index built from the restored arrays fails")
        if not others:
            summary["index_bytes_equal_axlearn_save"] = index_bytes == json.dumps(target).encode()
    source = via_orbax if via_orbax is not None else via_ts

    # ---- arrays, as AXLearn's restore reads them -----------------------------------------------------
    matched = 0
    compared_bytes = 0
    chunk_files = 0
    zarray_ok = 0
    zarray_same_as_source = 0
    src_kv = ts.KvStore.open({"driver": "ocdbt", "base": f"file://{kv}"}).result() if not zarr3 else None
    names = {p: n for n, p in leaves}
    for path, value in arrays_in_index.items():
        gda = os.path.join(regular, "gda", path)
        zpath = os.path.join(gda, ".zarray")
        if not os.path.isfile(zpath):
            problems.append(f"{path}: no .zarray")
            continue
        with open(zpath, "rb") as f:
            zraw = f.read()
        z = json.loads(zraw)
        form = json.dumps(z, sort_keys=True, separators=(",", ":")).encode() == zraw
        fixed = all(z.get(k, "<missing>") == v for k, v in ZARRAY_FIXED.items())
        keys = sorted(z.keys()) == sorted(["chunks", "dtype", "shape", *ZARRAY_FIXED])
        if form and fixed and keys:
            zarray_ok += 1
        else:
            problems.append(f"{path}: .zarray is not in AXLearn's form: {zraw[:200]!r}")
        if src_kv is not None and path in names:
            src_z = src_kv.read(f"{names[path]}/.zarray").result().value
            if src_z == zraw:
                zarray_same_as_source += 1
            else:
                problems.append(f"{path}: .zarray differs from the source's {src_z[:200]!r}")
        if str(tuple(z.get("shape", []))) != value.get("shape"):
            problems.append(f"{path}: .zarray shape {z.get('shape')} but index shape {value.get('shape')}")
        expected_keys = chunk_keys(z["shape"], z["chunks"])
        present = set(os.listdir(gda))
        missing = [k for k in expected_keys if k not in present]
        stray = sorted(present - set(expected_keys) - {".zarray"})
        chunk_files += len(expected_keys) - len(missing)
        if missing:
            problems.append(f"{path}: chunk files missing (AXLearn would read zeros): {missing[:5]}")
        if stray:
            problems.append(f"{path}: unexpected files next to the chunks: {stray[:5]}")
        try:
            arr = ts.open({"driver": "zarr", "kvstore": {"driver": "file", "path": gda}}, open=True).result().read().result()
        except Exception as e:  # noqa: BLE001
            problems.append(f"{path}: tensorstore cannot read it: {e}")
            continue
        if str(arr.dtype) != value.get("dtype"):
            problems.append(f"{path}: stored dtype {arr.dtype} but index dtype {value.get('dtype')}")
        src = source.get(path)
        if src is None:
            problems.append(f"{path}: in the converted index but not an array of the source")
            continue
        if same_array(arr, src):
            matched += 1
            compared_bytes += arr.nbytes
        else:
            problems.append(
                f"{path}: differs from the source ({arr.dtype}{arr.shape} sha256 "
                f"{hashlib.sha256(arr.tobytes()).hexdigest()[:12]} vs {src.dtype}{src.shape} "
                f"{hashlib.sha256(src.tobytes()).hexdigest()[:12]})"
            )
    not_converted = sorted(set(source) - set(arrays_in_index))
    if not_converted:
        problems.append(f"source arrays missing from the converted index: {not_converted[:5]}")
    on_disk = set()
    for d, _, files in os.walk(os.path.join(regular, "gda")):
        if ".zarray" in files:
            on_disk.add(os.path.relpath(d, os.path.join(regular, "gda")))
    extra = sorted(on_disk - set(arrays_in_index))
    if extra:
        problems.append(f"arrays under gda/ that the index does not list: {extra[:5]}")

    summary.update(
        {
            "arrays": len(arrays_in_index),
            "arrays_matched": matched,
            "bytes_compared": compared_bytes,
            "chunk_files": chunk_files,
            "zarray_axlearn_form": zarray_ok,
            "zarray_identical_to_source": zarray_same_as_source,
            "problems": problems,
        }
    )
    return summary


def main(argv):
    with open(argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        try:
            out = check_case(case)
        except Exception as e:  # noqa: BLE001 - one broken case must not hide the others
            out = {"name": case.get("name"), "problems": [f"checker failed: {type(e).__name__}: {e}"]}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
