#!/usr/bin/env python3
"""The example fuji step the package carries (test/fixtures/orbax-axlearn/fuji-v2-tiny/step_00001000): a fuji
v2-shaped model with fuji's 32k vocabulary (so `export-hf` writes AXLearn's tokenizer for it) and tiny widths,
built from AXLearn's own layers (axlearn_fuji.py's fuji_model_config) and saved by AXLearn's OrbaxCheckpointer,
model and prng_key only (what an export reads; a trainer's optimizer state would triple the package's share).

    .venv-axlearn/bin/python test/fixtures-gen/fuji_example.py OUT_DIR     # writes OUT_DIR/step_00001000
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.dont_write_bytecode = True
os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from axlearn_fuji import STEP, fuji_model_config  # noqa: E402

ARCH = dict(num_layers=2, hidden_dim=8, num_heads=2, num_kv_heads=None, vocab_size=32768, rope_theta=1e4, shared_lm_head=True)
SEED = 43


def main(out):
    import jax
    import numpy as np
    from absl import logging as absl_logging
    from axlearn.common.checkpointer_orbax import OrbaxCheckpointer
    from jax.sharding import Mesh

    absl_logging.set_verbosity(absl_logging.ERROR)
    model = fuji_model_config(**ARCH).set(name="model").instantiate(parent=None)
    params = model.initialize_parameters_recursively(jax.random.PRNGKey(SEED))
    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    # OrbaxCheckpointer writes <dir>/step_XXXXXXXX; a tmp parent keeps its other files out of OUT_DIR.
    cfg = OrbaxCheckpointer.default_config().set(name="checkpointer", dir=os.path.abspath(out))
    with mesh:
        ckpt = cfg.instantiate(parent=None)
        ckpt.save(step=STEP, state={"model": params, "prng_key": jax.random.PRNGKey(SEED)})
        ckpt.wait_until_finished()
        ckpt.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
