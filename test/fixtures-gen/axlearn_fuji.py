#!/usr/bin/env python3
"""Small fuji-shaped causal LMs built from AXLearn's own layers, saved by AXLearn's OrbaxCheckpointer, with the
logits AXLearn's own forward pass computes for fixed tokens: what an export to Hugging Face must reproduce.

Usage:
    .venv-axlearn/bin/python test/fixtures-gen/axlearn_fuji.py OUT_DIR

Needs AXLearn's source and its pins (.venv-axlearn, from ORBAX2REG_AXLEARN; see docs/testing.md). For each variant
(VARIANTS below) it writes OUT_DIR/<variant>/:
    checkpoints/step_00001000/   the state saved by `OrbaxCheckpointer` (axlearn/common/checkpointer_orbax.py):
                                 `model/decoder/...` (the fuji tree), `learner/...` (Adam's mu and a count) and
                                 `prng_key`, as a trainer saves them
    logits_f32.npy               [2, 16, V] float32: `Model.extract_logits` (predict, then compute_logits) in float32
    logits_bf16.npy              [2, 16, V] the same with every parameter cast to bfloat16 (stored as float32)
    expected.json                the tokens, the architecture, each position's greedy next token in float32 and
                                 bfloat16, and the smallest top-1/top-2 logit gap

The model config is what `model_config` in axlearn/experiments/text/gpt/fuji.py builds (that file and its
gpt/common.py import AXLearn's trainer, evaler and tf.data inputs, which are not in the vendored source, so the
lines that shape the model are repeated in `fuji_model_config` below, at upstream commit 34aed43c): SwiGLU
(`activation_fn = ("nn.silu", "linear")`), `FusedQKVLinear` (v1/v2) or `FusedGroupedQKVLinear` with
`num_kv_heads` under `GroupedQueryAttention` (v3), wrapped in `RoFormerQKVLinear(rotary_value=False)` with the
version's `rope_theta`, `RMSNorm(eps=1e-5, forward_dtype=None)` everywhere, no biases, token embeddings without
positional embeddings, `LmHead` when the head is not shared, `RepeatedTransformerLayer` (layers stacked on axis 0;
fuji's default) or `StackedTransformerLayer` (the stack_cfg fuji's model_config also takes: layer{i}/ subtrees).
What fuji sets only for sharding, remat and the KV cache does not change the forward pass and is left out.

The weights are random (a fixed seed), with every norm scale perturbed away from ones. Greedy tokens compared in
bfloat16 are only well-posed where the top two logits are further apart than bfloat16's rounding moves them (a
random model's top two are often nearly tied): of CANDIDATES random sequences, the BATCH kept are those whose
every position's float32 top-1/top-2 gap is the largest multiple of that position's largest bfloat16-vs-float32
logit difference in AXLearn itself (at least MIN_MARGIN: then AXLearn's bfloat16 greedy tokens are its float32
ones, and an export's bfloat16 forward that rounds no worse than AXLearn's must give them too).
"""

import json
import math
import os
import sys

os.environ["JAX_PLATFORMS"] = "cpu"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree

STEP = 1000
SEED = 35
BATCH, SEQ = 2, 16
CANDIDATES = 512
MIN_MARGIN = 2.0

# fuji.py: ROPE_THETA per version (1e4 for v1/v2, 5e5 for v3).
VARIANTS = {
    # v1/v2: MultiheadAttention with FusedQKVLinear [3, D, H, hd]; lm_head shared with the token embedding.
    "fused-tied": dict(
        fuji_version="v2", num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=None, vocab_size=256,
        rope_theta=1e4, shared_lm_head=True,
    ),
    # v3: GroupedQueryAttention with FusedGroupedQKVLinear [D, H + 2K, hd]; a separate lm_head.
    "grouped-untied": dict(
        fuji_version="v3", num_layers=3, hidden_dim=96, num_heads=4, num_kv_heads=2, vocab_size=384,
        rope_theta=5e5, shared_lm_head=False,
    ),
    # fuji's model_config takes a stack_cfg: StackedTransformerLayer keeps each layer's own tree
    # (transformer/layer{i}/...) instead of stacking them on axis 0.
    "stacked-v1": dict(
        fuji_version="v1", num_layers=2, hidden_dim=64, num_heads=4, num_kv_heads=None, vocab_size=320,
        rope_theta=1e4, shared_lm_head=False, stack="StackedTransformerLayer",
    ),
}


def scaled_hidden_dim(scale, *, round_up_to_multiples_of):
    """gpt/common.py's scaled_hidden_dim: ceil(input_dim * scale / m) * m."""
    from axlearn.common.config import config_for_function

    def scale_fn(input_dim, *, scale, round_up_to_multiples_of):
        return math.ceil(input_dim * scale / round_up_to_multiples_of) * round_up_to_multiples_of

    return config_for_function(scale_fn).set(scale=scale, round_up_to_multiples_of=round_up_to_multiples_of)


def fuji_model_config(
    *, num_layers, hidden_dim, num_heads, num_kv_heads, vocab_size, rope_theta, shared_lm_head, stack="RepeatedTransformerLayer"
):
    """fuji.py's model_config and the gpt/common.py model_config it calls, minus sharding, remat and KV cache."""
    import jax.numpy as jnp
    from axlearn.common import causal_lm
    from axlearn.common.attention import (
        FusedGroupedQKVLinear,
        FusedQKVLinear,
        GroupedQueryAttention,
        MultiheadAttention,
        RepeatedTransformerLayer,
        RoFormerQKVLinear,
        StackedTransformerLayer,
        TransformerLayer,
    )
    from axlearn.common.decoder import Decoder, LmHead
    from axlearn.common.embedding import TransformerTextEmbeddings
    from axlearn.common.layers import RMSNorm, set_bias_recursively, set_norm_recursively
    from axlearn.common.param_init import PARAM_REGEXP_WEIGHT, DefaultInitializer, WeightInitializer

    # fuji.py model_config.
    activation_fn = ("nn.silu", "linear")
    # fuji.py's "test" model size rounds to 16 (the others to 256, too coarse for a tiny model).
    ffn_dim = scaled_hidden_dim(scale=8 / 3, round_up_to_multiples_of=16)
    if num_kv_heads:
        atten_cfg = GroupedQueryAttention.default_config()
        atten_input_linear = FusedGroupedQKVLinear.default_config().set(num_kv_heads=num_kv_heads)
    else:
        atten_cfg = MultiheadAttention.default_config()
        atten_input_linear = FusedQKVLinear.default_config()
    atten_qkv_linear = RoFormerQKVLinear.default_config().set(input_linear=atten_input_linear, rotary_value=False)
    atten_qkv_linear.rope_pos_emb_layer.theta = rope_theta
    normalization = RMSNorm.default_config().set(eps=1e-5, forward_dtype=None)

    # gpt/common.py model_config with fuji's arguments (prenorm, no logit cap, dense feed-forward).
    layer_cfg = TransformerLayer.default_config()
    layer_cfg.self_attention.attention = atten_cfg
    layer_cfg.self_attention.attention.causal = True
    layer_cfg.self_attention.attention.num_heads = num_heads
    layer_cfg.self_attention.attention.input_linear = atten_qkv_linear
    layer_cfg.self_attention.structure = "prenorm"
    layer_cfg.self_attention.attention.atten_logit_cap = None
    layer_cfg.feed_forward.activation = activation_fn
    layer_cfg.feed_forward.hidden_dim = ffn_dim
    layer_cfg.feed_forward.structure = "prenorm"
    stack_cfg = {"RepeatedTransformerLayer": RepeatedTransformerLayer, "StackedTransformerLayer": StackedTransformerLayer}[stack]
    transformer_cfg = stack_cfg.default_config().set(num_layers=num_layers, layer=layer_cfg)
    decoder_cfg = Decoder.default_config().set(
        transformer=transformer_cfg,
        attention_mask=None,
        dim=hidden_dim,
        vocab_size=vocab_size,
        emb=TransformerTextEmbeddings.default_config().set(pos_emb=None),
        lm_head=LmHead.default_config() if not shared_lm_head else None,
        dropout_rate=0.0,
    )
    model_param_init = DefaultInitializer.default_config().set(
        init_by_param_name={PARAM_REGEXP_WEIGHT: WeightInitializer.default_config().set(fan="fan_in", distribution="normal")}
    )
    cfg = causal_lm.Model.default_config().set(decoder=decoder_cfg, param_init=model_param_init, batch_axis_names=None)
    cfg.dtype = jnp.float32
    set_bias_recursively(cfg, False)
    set_norm_recursively(cfg, normalization)
    return cfg


def build(arch, seed):
    """The model's parameters (random, norms perturbed), CANDIDATES random token sequences and their logits in
    float32 and bfloat16 (every parameter cast to bfloat16, as a bfloat16 export holds them)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from axlearn.common.module import functional as F

    cfg = fuji_model_config(**{k: v for k, v in arch.items() if k != "fuji_version"}).set(name="model")
    model = cfg.instantiate(parent=None)
    init_key, perturb_key, token_key = jax.random.split(jax.random.PRNGKey(seed), 3)
    params = model.initialize_parameters_recursively(init_key)

    # Norm scales initialize to ones, which would hide a norm mapped to the wrong place: perturb each one.
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    keys = jax.random.split(perturb_key, len(leaves))
    out = []
    for (path, value), k in zip(leaves, keys):
        if path_name(path).endswith("/scale"):
            value = value + 0.2 * jax.random.normal(k, value.shape, value.dtype)
        out.append(value)
    params = jax.tree_util.tree_unflatten(treedef, out)

    tokens = jax.random.randint(token_key, (CANDIDATES, SEQ), 0, arch["vocab_size"], dtype=jnp.int32)

    @jax.jit
    def logits_of(p):
        # Repeat splits a key per layer even without dropout (rate 0): any fixed key gives the same logits.
        logits, _ = F(model, prng_key=jax.random.PRNGKey(0), state=p, inputs=dict(input_batch=dict(input_ids=tokens)),
                      method="extract_logits", is_training=False)
        return logits.astype(jnp.float32)

    with jax.default_matmul_precision("float32"):
        f32 = np.asarray(logits_of(params))
    bf16_params = jax.tree.map(lambda x: x.astype(jnp.bfloat16) if jnp.issubdtype(x.dtype, jnp.floating) else x, params)
    bf16 = np.asarray(logits_of(bf16_params))
    return params, np.asarray(tokens), f32, bf16


def path_name(path):
    return "/".join(str(getattr(p, "key", p)) for p in path)


def top2_gap(logits):
    import numpy as np

    s = np.sort(logits, axis=-1)
    return s[..., -1] - s[..., -2]


def save(root, params, seed):
    """The state a trainer saves (model, learner, prng_key) with AXLearn's OrbaxCheckpointer, one process."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from axlearn.common.checkpointer_orbax import OrbaxCheckpointer
    from jax.sharding import Mesh

    mesh = Mesh(np.array(jax.devices()[:1]).reshape(1, 1), ("data", "model"))
    # Adam's first moment mirrors the model's tree, as learner/optimizer/... does in a trainer's state: an export
    # must take `model/` and leave the rest.
    mu = jax.tree.map(lambda x: (x * 0.01).astype(x.dtype), params)
    state = {
        "learner": {"count": jnp.asarray(STEP, jnp.int32), "optimizer": {"mu": mu}},
        "model": params,
        "prng_key": jax.random.PRNGKey(seed),
    }
    cfg = OrbaxCheckpointer.default_config().set(name="checkpointer", dir=os.path.join(root, "checkpoints"))
    with mesh:
        ckpt = cfg.instantiate(parent=None)
        ckpt.save(step=STEP, state=state)
        ckpt.wait_until_finished()
        ckpt.stop()


def generate(out, variant, arch):
    import jax
    import numpy as np
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.ERROR)
    root = os.path.join(out, variant)
    os.makedirs(root, exist_ok=True)
    seed = SEED
    params, candidates, f32_all, bf16_all = build(arch, seed)
    # A position's margin: its float32 top-1/top-2 gap over the largest change bfloat16 makes to its logits.
    margin = top2_gap(f32_all) / np.abs(bf16_all - f32_all).max(-1)
    chosen = np.argsort(-margin.min(-1), kind="stable")[:BATCH]
    tokens, f32, bf16 = candidates[chosen], f32_all[chosen], bf16_all[chosen]
    min_margin = float(margin[chosen].min())
    greedy_f32, greedy_bf16 = f32.argmax(-1), bf16.argmax(-1)
    if min_margin < MIN_MARGIN or not (greedy_f32 == greedy_bf16).all():
        raise RuntimeError(f"{variant}: the best {BATCH} of {CANDIDATES} sequences have a margin of {min_margin:.2f}")
    bf16_error = float(np.max(np.abs(bf16 - f32)))
    gap = float(top2_gap(f32).min())
    save(root, params, seed)
    np.save(os.path.join(root, "logits_f32.npy"), f32)
    np.save(os.path.join(root, "logits_bf16.npy"), bf16)
    shapes = {
        path_name(path): list(v.shape)
        for path, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    head_dim = arch["hidden_dim"] // arch["num_heads"]
    expected = {
        "variant": variant,
        "step": STEP,
        "seed": seed,
        **arch,
        "num_kv_heads": arch["num_kv_heads"] or arch["num_heads"],
        "head_dim": head_dim,
        "intermediate_size": next(v for k, v in shapes.items() if k.endswith("feed_forward/linear1_0/weight"))[-1],
        "rms_norm_eps": 1e-5,
        "tokens": tokens.tolist(),
        "greedy_f32": greedy_f32.tolist(),
        "greedy_bf16": greedy_bf16.tolist(),
        "min_top2_gap_f32": gap,
        "min_margin": min_margin,
        "axlearn_bf16_vs_f32_max_abs": bf16_error,
        "logits_max_abs": float(np.max(np.abs(f32))),
        "model_shapes": shapes,
    }
    with open(os.path.join(root, "expected.json"), "w") as f:
        json.dump(expected, f, indent=1)
    print(
        f"{variant}: seed {seed}, {len(shapes)} model arrays, logits max |x| {expected['logits_max_abs']:.3f}, "
        f"min top-2 gap {gap:.4f} ({min_margin:.2f}x its bf16 error), AXLearn bf16 vs f32 max abs {bf16_error:.4f}"
    )


def main(out):
    out = os.path.abspath(out)
    for variant, arch in VARIANTS.items():
        generate(out, variant, arch)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
