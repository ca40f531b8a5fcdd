"""The pure-function API: init_random, logical axes, input checks, no recompiles."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from prism_jax import config as C
from prism_jax.config import ModelConfig
from prism_jax.model import abstract_model, forward, full_logits, init_random
from tests.model.helpers import mean_kl, run, top1
from tests.model.tiny import TINY_HF_CONFIGS

AXES = {"vocab", "embed", "mlp", "heads", "kv_heads", "head_dim", None}


@pytest.fixture(scope="module")
def gemma() -> ModelConfig:
    return ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])


def test_init_random_is_one_model_at_three_precisions(gemma, rng):
    """Same seed: the int8 model is the quantised fp32 model (keys follow parameter paths)."""
    tokens = rng.integers(0, gemma.vocab_size, 16)
    logits = {}
    for precision in ("fp32", "bf16", "int8"):
        params = init_random(gemma, precision, seed=7)
        hidden = jnp.asarray(run(params, gemma, tokens))
        logits[precision] = np.asarray(full_logits(params, gemma, hidden))
    for precision in ("bf16", "int8"):
        kl = mean_kl(logits["fp32"], logits[precision])
        assert kl < 1e-2 and top1(logits["fp32"], logits[precision]) >= 0.8, (precision, kl)
    other = init_random(gemma, "fp32", seed=8)
    assert not np.array_equal(
        jax.tree.leaves(other)[0], jax.tree.leaves(init_random(gemma, "fp32", seed=7))[0]
    ), "different seeds must give different weights"


def test_every_parameter_has_logical_axes():
    model = abstract_model(ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen2"]), "int8")
    params = nnx.state(model, nnx.Param)
    variables = jax.tree.leaves(params, is_leaf=lambda x: isinstance(x, nnx.Variable))
    assert variables, "no parameters found"
    for var in variables:
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == var.value.ndim, f"{var} lacks logical axes"
        assert set(axes) <= AXES, f"unknown logical axis in {axes}"


def test_27b_shapes_need_no_memory():
    """The benchmark model's structure is abstract until loaded (init_random fills it tensor
    by tensor on the device)."""
    state = nnx.state(abstract_model(C.GEMMA3_27B, "int8"))
    leaves = jax.tree.leaves(state)
    assert all(isinstance(x, jax.ShapeDtypeStruct) for x in leaves)
    named = [(jax.tree_util.keystr(k), x) for k, x in jax.tree_util.tree_leaves_with_path(state)]
    # projections and the embedding; w_q2 is the second INT8 digit of the projections
    weights = sum(x.size for k, x in named if x.ndim >= 2 and "w_q2" not in k)
    assert 26.8e9 < weights < 27.2e9, f"Gemma 3 27B's text model has ~27.0B weights: {weights}"
    firsts = sum(x.size for k, x in named if "'w_q'" in k)
    assert sum(x.size for k, x in named if "'w_q2'" in k) == firsts > 25e9, (
        "by default (INT8_TWO_DIGITS) every projection weight has its second INT8 digit"
    )
    one = nnx.state(abstract_model(C.GEMMA3_27B.replace(**C.INT8_ONE_DIGIT), "int8"))
    named = [(jax.tree_util.keystr(k), x) for k, x in jax.tree_util.tree_leaves_with_path(one)]
    assert not any("'w_q2'" in k for k, _ in named), "int8-1digit has no second weight digit"


def test_step_inputs_are_checked(gemma):
    params = init_random(gemma, "fp32", seed=0)
    t = jnp.zeros(4, jnp.int32)
    mask = jnp.ones((4, 4), bool)
    with pytest.raises(ValueError, match=r"tokens must be int32 \[T\]"):
        forward(
            params, gemma, t.astype(jnp.int64 if jax.config.x64_enabled else jnp.float32), t, mask
        )
    with pytest.raises(ValueError, match=r"mask must be bool \[4, 4\]"):
        forward(params, gemma, t, t, mask[:3])
    with pytest.raises(ValueError, match=r"positions must be int32 \[4\]"):
        forward(params, gemma, t, t[:2], mask)


def test_jitted_step_compiles_once_per_shape(gemma, rng):
    params = init_random(gemma, "int8", seed=0)
    traces = []

    @jax.jit
    def step(params, tokens, positions, mask):
        traces.append(1)
        return forward(params, gemma, tokens, positions, mask)

    for _ in range(3):
        tokens = jnp.asarray(rng.integers(0, gemma.vocab_size, 8), jnp.int32)
        step(params, tokens, jnp.arange(8, dtype=jnp.int32), jnp.tril(jnp.ones((8, 8), bool)))
    assert len(traces) == 1, f"the step retraced {len(traces)} times for one shape"
