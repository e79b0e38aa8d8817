"""What bench/gen_fuji.py, gen_big.py and gen_scale.py share: the cache keyed by VERSION, the temporary
directory a step is written into, the save with the real orbax-checkpoint in AXLearn's layout, and the
generated.json record that makes the step a cache hit next time.

A generator's output directory OUT holds ckpt/step_%08d (the step) and generated.json ({"version": ...,
"step_dir": ..., timings}); a rerun whose VERSION matches and whose step is committed prints that record
with "cached": true and writes nothing. A step is written under OUT.tmp and renamed to OUT when complete,
so an interrupted run leaves no half step behind a valid record.
"""

import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "test", "fixtures-gen"))


def fixture_generator():
    """test/fixtures-gen/generate.py, the project's fixture generator: CheckpointManager with step_%08d names,
    items index + state, AXLearn's ArrayHandler override. Importing it sets XLA_FLAGS (8 CPU devices) and
    JAX_PLATFORMS, so it must come before `import jax`."""
    import generate

    return generate


def step_dir(out: str, step: int) -> str:
    return os.path.join(out, "ckpt", f"step_{step:08d}")


def cached(out: str, step: int, version: str) -> bool:
    """Prints OUT's record and returns True when it is for `version` and its step is committed."""
    stamp = os.path.join(out, "generated.json")
    if os.path.exists(stamp):
        with open(stamp) as f:
            info = json.load(f)
        if info.get("version") == version and os.path.exists(os.path.join(step_dir(out, step), "commit_success.txt")):
            print(json.dumps({**info, "cached": True}))
            return True
    return False


def fresh_tmp(out: str) -> str:
    """Removes OUT and OUT.tmp (a stale step or an interrupted run) and returns the empty OUT.tmp."""
    tmp = out + ".tmp"
    for d in (out, tmp):
        if os.path.exists(d):
            shutil.rmtree(d)
    os.makedirs(tmp)
    return tmp


def save(tmp: str, step: int, tree, timeout_secs: int | None = None) -> None:
    """Saves `tree` as step `step` under TMP/ckpt with the real orbax-checkpoint, in AXLearn's layout."""
    g = fixture_generator()
    if timeout_secs is not None:
        g.MP_TIMEOUT_SECS = timeout_secs
    g.save_axlearn(os.path.join(tmp, "ckpt"), step, tree)


def dir_size(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path) for f in files)


def step_info(version: str, dims: dict, step: int, out: str, tmp: str, leaves, t0: float, t1: float, t2: float) -> dict:
    """The record of a generated Orbax step: what it is, its arrays' raw and stored bytes, and how long it took."""
    return {
        "version": version,
        "dims": dims,
        "step": step,
        "step_dir": os.path.relpath(step_dir(out, step), ROOT),
        "arrays": len(leaves),
        "raw_bytes": int(sum(x.nbytes for x in leaves)),
        "stored_bytes": dir_size(step_dir(tmp, step)),
        "values_seconds": round(t1 - t0, 1),
        "save_seconds": round(t2 - t1, 1),
        "seconds": round(t2 - t0, 1),
    }


def finish(tmp: str, out: str, info: dict) -> int:
    """Records `info` in TMP/generated.json, moves TMP to OUT and prints the record; returns the exit code."""
    with open(os.path.join(tmp, "generated.json"), "w") as f:
        json.dump(info, f, indent=1)
        f.write("\n")
    os.rename(tmp, out)
    print(json.dumps({**info, "cached": False}))
    return 0
