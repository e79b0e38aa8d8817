#!/usr/bin/env python3
"""An import of a Hugging Face Llama checkpoint, restored into a fine-tuning trainer by AXLearn's own machinery and
run: its logits against `transformers`' on the source (test/python/make_llama.py's fixtures).

Usage:
    .venv-axlearn/bin/python test/python/axlearn_import_check.py CASES.json

CASES.json: a list of
    {"name": str,
     "step_dir": <the imported regular step, ROOT/step_XXXXXXXX>,
     "source": <the Hugging Face folder imported (its config.json gives the architecture)>,
     "fixture": <make_llama.py's OUT/<variant>: expected.json, logits_f32.npy, logits_bf16.npy>,
     "compute": "float32" | "bfloat16",
     "same_as": <another regular step of the same model> (optional: every array of both steps' indexes read with
                TensorStore must be equal, dtype, shape and bytes: an import against the Python route's)}

For each case:
1. the model config is the real `fuji.model_config(...)` (axlearn/experiments/text/gpt/fuji.py from the full tree)
   with config.json's num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads (None when equal to
   the heads: fuji's multi-head FusedQKVLinear), vocab_size, rope theta, tie_word_embeddings and intermediate_size
   (ffn_dim). fuji.py imports input-pipeline packages (seqio, tensorflow_datasets, ...) that building a model config
   does not use: where they are absent, empty stand-in modules take their names (STAND_INS).
2. the trainer is gpt/common.py's `get_trainer_config_fn` (what fuji's trainer configs call) with that model,
   AdamW and the `init_state_builder` a fine-tuning run sets (INIT_STATE_BUILDER below):
       RestoreAndConvertBuilder(
           builder=TensorStoreStateStorageBuilder(dir=<step dir>, validation=EXACT_UP_TO_DTYPE),
           converter=ModelStateScopeConverter(source_trainer_config=<the same trainer config>))
   ModelStateScopeConverter prunes the state it asks the builder for to `model/...` (learner and prng_key
   emptied), so a checkpoint holding exactly the model restores; EXACT_UP_TO_DTYPE lets a bfloat16 import restore
   into the float32 parameters (read as float32). The trainer then runs `SpmdTrainer.init(prng_key)`, what
   `_prepare_training` calls when its own directory has no checkpoint: the model comes from the builder, the
   learner's state is initialized fresh.
3. the forward pass is `Model.extract_logits` on the fixture's tokens with the trainer's model and restored
   parameters: in float32 (`jax.default_matmul_precision("float32")`) against transformers' float32 logits, within
   F32_RELATIVE_TOLERANCE of the largest logit; with every parameter cast to bfloat16 (compute "bfloat16"), each
   position's greedy next token against transformers' bfloat16 model's (make_llama.py keeps tokens whose greedy
   choice bfloat16 rounding cannot flip).
Prints one JSON line per case: the figures and the problems (empty when all hold).
"""

import importlib.abc
import importlib.machinery
import json
import os
import sys
import tempfile
import types

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.dont_write_bytecode = True

# Float32 rounding: XLA and torch sum the same products in different orders and compute the rotary sin/cos from
# differently arranged float32 expressions, so equal weights give logits some units in the last place apart,
# amplified by the layers: ~1e-6 of the largest logit here (see f32_max_rel_diff). 1e-4 is 100x above that and
# 1000x below what a wrong layout does (a swapped gate/up, unpermuted rotary rows or a misplaced norm move the
# logits by 1e-1 and more).
F32_RELATIVE_TOLERANCE = 1e-4

# Input-pipeline packages fuji.py and gpt/common.py import at module level and a model config never uses.
STAND_INS = ("seqio", "tensorflow_datasets", "nltk", "tensorflow_text", "tokamax", "cloudpickle")


class _StandIn(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")

    def __call__(self, *args, **kwargs):
        return _StandIn(f"{self.__name__}()")

    def __mro_entries__(self, bases):
        return (object,)


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Last on sys.meta_path: only names no installed package provides get a stand-in."""

    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        return _StandIn(spec.name)

    def exec_module(self, module):
        module.__path__ = []


sys.meta_path.append(_StandInFinder())

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from absl import logging as absl_logging  # noqa: E402
from axlearn.common import state_builder  # noqa: E402
from axlearn.common.checkpointer import CheckpointValidationType  # noqa: E402
from axlearn.common.config import config_for_function  # noqa: E402
from axlearn.common.input_fake import EmptyInput  # noqa: E402
from axlearn.common.module import functional as F  # noqa: E402
from axlearn.common.utils import flatten_items  # noqa: E402
from axlearn.experiments.text.gpt import common, fuji  # noqa: E402

absl_logging.set_verbosity(absl_logging.ERROR)


def fuji_arguments(config):
    """fuji.model_config's arguments from a Llama config.json (transformers 5 nests rope_theta in rope_parameters)."""
    heads, kv = config["num_attention_heads"], config.get("num_key_value_heads") or config["num_attention_heads"]
    rope = config.get("rope_parameters") or {}
    return dict(
        num_layers=config["num_hidden_layers"],
        hidden_dim=config["hidden_size"],
        num_heads=heads,
        num_kv_heads=None if kv == heads else kv,
        vocab_size=config["vocab_size"],
        rope_theta=rope.get("rope_theta", config.get("rope_theta", 1e4)),
        shared_lm_head=bool(config.get("tie_word_embeddings", False)),
        ffn_dim=config["intermediate_size"],
    )


def init_state_builder(step_dir, source_trainer_config):
    """What a fine-tuning trainer's `init_state_builder` is set to, to start from a model-only regular step."""
    return state_builder.RestoreAndConvertBuilder.default_config().set(
        builder=state_builder.TensorStoreStateStorageBuilder.default_config().set(
            dir=step_dir, validation=CheckpointValidationType.EXACT_UP_TO_DTYPE
        ),
        converter=state_builder.ModelStateScopeConverter.default_config().set(
            source_trainer_config=source_trainer_config
        ),
    )


def trainer_config_fn(model_args, step_dir=None):
    """gpt/common.py's trainer config for the fuji model, on one CPU device, with an empty input."""
    mesh_shape = (1,) * len(common.MESH_AXIS_NAMES)
    builder = None
    if step_dir is not None:
        builder = init_state_builder(
            step_dir, config_for_function(trainer_config_fn).set(model_args=model_args, step_dir=None)
        )
    config_fn = common.get_trainer_config_fn(
        model_cfg=fuji.model_config(**model_args),
        learner_cfg=common.adamw_decoupled_learner_config(
            peak_lr=1e-5, max_step=100, weight_decay=0.01, lr_warmup_steps=10
        ),
        max_step=100,
        train_batch_size=1,
        train_input_source=None,
        evalers={},
        mesh_shape=mesh_shape,
        init_state_builder=builder,
    )

    def fn():
        cfg = config_fn()
        cfg.input = EmptyInput.default_config().set(global_batch_size=1)
        return cfg

    return fn


def restore(case, model_args, workdir):
    cfg = trainer_config_fn(model_args, case["step_dir"])()
    cfg.dir = workdir
    trainer = cfg.set(name="trainer").instantiate(parent=None)
    trainer.init(jax.random.PRNGKey(0))
    return trainer


def logits_of(model, params, tokens):
    @jax.jit
    def run(p):
        logits, _ = F(model, prng_key=jax.random.PRNGKey(0), state=p, inputs=dict(input_batch=dict(input_ids=tokens)),
                      method="extract_logits", is_training=False)
        return logits.astype(jnp.float32)

    return np.asarray(run(params))


def read_step(step_dir):
    """Every array of a regular step, read with TensorStore as AXLearn's index lists them."""
    import tensorstore as ts
    from axlearn.common.checkpointer import read_index_file

    arrays = {}
    for path, value in read_index_file(step_dir):
        if isinstance(value, dict):
            spec = {"driver": "zarr", "kvstore": {"driver": "file", "path": os.path.join(step_dir, "gda", path)}}
            arrays[path] = ts.open(spec, open=True).result().read().result()
    return arrays


def compare_steps(a_dir, b_dir, out):
    a, b = read_step(a_dir), read_step(b_dir)
    if sorted(a) != sorted(b):
        out["problems"].append(f"arrays differ from {b_dir}'s: {sorted(set(a) ^ set(b))[:10]}")
    equal = [p for p in a if p in b and a[p].dtype == b[p].dtype and a[p].shape == b[p].shape
             and a[p].tobytes() == b[p].tobytes()]
    out["same_as_equal"] = len(equal)
    for p in sorted(set(a) & set(b) - set(equal)):
        out["problems"].append(f"{p}: {a[p].dtype}{a[p].shape} differs from {b_dir}'s {b[p].dtype}{b[p].shape}")


def check(case):
    out = {"name": case["name"], "compute": case["compute"], "problems": []}
    with open(os.path.join(case["source"], "config.json")) as f:
        model_args = fuji_arguments(json.load(f))
    with open(os.path.join(case["fixture"], "expected.json")) as f:
        e = json.load(f)
    out["fuji_model_config"] = model_args
    if case.get("same_as"):
        compare_steps(case["step_dir"], case["same_as"], out)
    with tempfile.TemporaryDirectory() as workdir:
        trainer = restore(case, model_args, workdir)
        state = trainer.trainer_state
        out["model_arrays"] = len(list(flatten_items(state.model)))
        out["model_dtypes"] = sorted({str(v.dtype) for _, v in flatten_items(state.model)})
        tokens = jnp.asarray(e["tokens"], jnp.int32)
        params = state.model
        model = trainer.model
        if case["compute"] == "float32":
            with jax.default_matmul_precision("float32"):
                ax = logits_of(model, params, tokens)
            want = np.load(os.path.join(case["fixture"], "logits_f32.npy"))
            scale = float(np.abs(want).max())
            diff = float(np.abs(ax - want).max())
            out.update(f32_max_abs_diff=diff, f32_max_rel_diff=diff / scale, logits_max_abs=scale,
                       f32_tolerance=F32_RELATIVE_TOLERANCE * scale)
            if not diff <= F32_RELATIVE_TOLERANCE * scale:
                out["problems"].append(f"float32 logits differ from transformers' by up to {diff:.3g}")
            greedy_want = np.array(e["greedy_f32"])
        else:
            bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
            ax = logits_of(model, bf16, tokens)
            want = np.load(os.path.join(case["fixture"], "logits_bf16.npy"))
            out["bf16_max_abs_diff"] = float(np.abs(ax - want).max())
            greedy_want = np.array(e["greedy_bf16"])
        greedy = ax.argmax(-1)
        out["greedy_positions"] = int(greedy_want.size)
        out["greedy_equal"] = int((greedy == greedy_want).sum())
        if out["greedy_equal"] != greedy_want.size:
            where = [list(map(int, p)) for p in np.argwhere(greedy != greedy_want)[:5]]
            out["problems"].append(
                f"{case['compute']} greedy tokens differ from transformers' at {greedy_want.size - out['greedy_equal']}"
                f" of {greedy_want.size} positions (first [sequence, position]: {where})"
            )
    return out


def main(argv):
    if len(argv) != 2:
        sys.stderr.write(__doc__)
        return 2
    with open(argv[1]) as f:
        cases = json.load(f)
    for case in cases:
        try:
            out = check(case)
        except Exception as e:  # noqa: BLE001 - report and go on with the next case
            out = {"name": case["name"], "problems": [f"{type(e).__name__}: {str(e)[:3000]}"]}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
