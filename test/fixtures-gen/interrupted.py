"""Writes an AXLearn step whose save was killed before Orbax finalized it, on the local filesystem.

OUT_DIR/step_00000200.orbax-checkpoint-tmp/ is what a process killed between writing its shards and
Orbax's finalize leaves (orbax-checkpoint >= 0.11.20 names): the step directory under its temporary name, and
in it the items under theirs (`state.orbax-checkpoint-tmp/`, `index.orbax-checkpoint-tmp/`), the per-process
OCDBT database never merged into a root manifest, and no commit_success.txt. It is made by the real
CheckpointManager with AXLearn's options (generate.py's `axlearn_manager`), killed (os._exit) the moment
CompositeCheckpointHandler.finalize starts. OUT_DIR/expected.json (generate.py's schema) has the
arrays' hashes, read back with TensorStore from the per-process database.

Usage: python interrupted.py OUT_DIR   (replaced whole; the tests' global setup uses test/.generated/interrupted)
"""

import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

STEP = 200


def save_and_die(root: str) -> None:
    import generate as g  # sets JAX's environment before importing it
    from orbax.checkpoint._src.handlers import composite_checkpoint_handler as cch

    def killed(*_args, **_kwargs):
        sys.stdout.flush()
        os._exit(0)

    cch.CompositeCheckpointHandler.finalize = killed
    tree = g.materialize(g.axlearn_tree(count=STEP), g.mesh_2d())
    g.save_axlearn(root, STEP, tree)
    raise SystemExit("the save finished: finalize was not reached")


def main(out_dir: str) -> int:
    out = os.path.abspath(out_dir)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    # The save runs in a child, which the patched finalize kills.
    r = subprocess.run([sys.executable, os.path.abspath(__file__), "--save", out], check=False)
    if r.returncode != 0:
        return r.returncode
    step = os.path.join(out, f"step_{STEP:08d}.orbax-checkpoint-tmp")
    state = os.path.join(step, "state.orbax-checkpoint-tmp")
    assert os.path.isdir(state) and os.path.isdir(os.path.join(step, "index.orbax-checkpoint-tmp")), os.listdir(step)
    assert not os.path.exists(os.path.join(state, "manifest.ocdbt")), "merged: finalize ran"
    import generate as g

    # The arrays as TensorStore reads them from the only database there is, the process's own.
    g.write_expected(out, os.path.join(state, "ocdbt.process_0"), g.tree_specs(g.axlearn_tree(count=STEP)), zarr3=False)
    print(f"interrupted: {sorted(os.listdir(step))}; state: {sorted(os.listdir(state))}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--save":
        save_and_die(sys.argv[2])
    sys.exit(main(sys.argv[1]))
