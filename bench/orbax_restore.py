"""What the benchmark's two Python routes (python_route.py, python_hf_route.py) share: JAX on the CPU with quiet
logs, and the restore an AXLearn user does today of a step's whole `state` item with the real orbax-checkpoint,
as numpy arrays (PyTreeCheckpointer + RestoreArgs(restore_type=np.ndarray) for every leaf, from the item's own
metadata). Import it before jax: it sets JAX_PLATFORMS first.
"""

import os

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import orbax.checkpoint as ocp  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from etils import epath  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def key_str(k) -> str:
    for attr in ("key", "name", "idx"):
        if hasattr(k, attr):
            return str(getattr(k, attr))
    return str(k)


def path_of(key_path) -> str:
    """A leaf's key path as AXLearn names it: its keys joined with '/'."""
    return "/".join(key_str(k) for k in key_path)


def restore_state(step_dir: str):
    """The step's `state` item: its metadata tree and the restored tree of numpy arrays."""
    state = epath.Path(step_dir) / "state"
    metadata = ocp.PyTreeCheckpointHandler().metadata(state).tree
    restore_args = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), metadata)
    with ocp.PyTreeCheckpointer() as ckptr:
        restored = ckptr.restore(state, args=ocp.args.PyTreeRestore(restore_args=restore_args))
    return metadata, restored
