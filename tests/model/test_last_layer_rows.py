"""The last layer for the readout rows only (forward_paged's and forward's `rows`; the engine's
EngineConfig.readout_only_last_layer): the rows' hidden states keep the bits of the whole
layer's, and every pool the step writes keeps its bits, so later steps that read them cannot
tell. Tiny random models, a forest of three questions with multi-token options on a state
longer than an attention tile; on CPU here and on the H200 through benchmarks/gpu_suite.sh.
The float modes (bf16, fp32) use XLA's dots, which DESIGN.md lets vary with the shape: on CPU
they keep the bits too, on a GPU they are checked to a tolerance (the H200's cuBLAS picks other
algorithms for R rows than for T, session 29)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax.config import EngineConfig, ModelConfig
from prism_jax.forest import build_forest
from prism_jax.kv_pages import init_kv_pool
from prism_jax.model import PagedTables, forward, forward_paged, init_random
from prism_jax.prompts import RenderedQuestion
from prism_jax.scheduler import pad
from tests.conftest import assert_bitwise_equal
from tests.model.tiny import TINY_HF_CONFIGS

ROOT, STATE = 5, 140
BUCKETS = EngineConfig(page_size=8, token_buckets=(64, 128, 256), row_buckets=(1, 4, 16))
_forward_paged = jax.jit(forward_paged, static_argnames="config")


def _config(name: str) -> tuple[ModelConfig, str]:
    family = name.split("-")[0]
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS[family])
    if name.endswith("-digits-attn"):
        config = config.replace(attention_numerics="digits")
    return config, "bf16" if name.endswith("-bf16") else "int8"


def _forest_arrays(rng, vocab: int) -> dict[str, np.ndarray]:
    def toks(n):
        return tuple(int(x) for x in rng.integers(0, vocab, n))

    state = toks(ROOT + STATE)
    questions = [
        RenderedQuestion(state, toks(4), ((1,), (2,))),
        RenderedQuestion(state, toks(6), ((7, 8, 9), (7,), (3,))),  # leaves under the slot
        RenderedQuestion(state, toks(3), ((4, 5), (6,))),
    ]
    return pad(build_forest(questions, ROOT), BUCKETS)


# The float modes' tolerance on a GPU: a few bf16 ulps of the hidden states, fp32 near its own.
FLOAT_TOLERANCE = {"bf16": 3e-2, "fp32": 1e-4}


def _assert_same(got, want, precision: str, platform: str, what: str) -> None:
    """Bit for bit, except a float mode off the CPU (XLA dots there need not be invariant)."""
    if precision == "int8" or platform == "cpu":
        assert_bitwise_equal(got, want, what)
        return
    tol = FLOAT_TOLERANCE[precision]
    np.testing.assert_allclose(
        np.asarray(got, np.float32), np.asarray(want, np.float32), rtol=tol, atol=tol, err_msg=what
    )


def _step(device, config, params, arrays, rows):
    """forward_paged on a fresh pool: (hidden, pools) as numpy."""
    pages = arrays["pages_flat"].shape[0] + 1
    with jax.default_device(device):
        pool = init_kv_pool(config, pages, BUCKETS.page_size, params.precision)
        tables = PagedTables(
            *(jnp.asarray(arrays[k]) for k in ("slot", "positions", "chain_of")),
            jnp.asarray(arrays["chain_segments"]),
            jnp.asarray(arrays["pages_flat"]),
        )
        tokens = jnp.asarray(arrays["tokens"])
        hidden, kv = _forward_paged(params, config, pool, tokens, tables, rows)
    return np.asarray(hidden.astype(jnp.float32)), jax.tree.map(np.asarray, kv)


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "gemma3-digits-attn", "gemma3-bf16"])
def test_rows_keep_the_whole_layers_bits(name, device, rng):
    config, precision = _config(name)
    with jax.default_device(device):
        params = init_random(config, precision, seed=int(rng.integers(1 << 30)))
    arrays = _forest_arrays(rng, config.vocab_size)
    n = int(np.count_nonzero(arrays["positions"] >= 0))
    assert arrays["tokens"].shape[0] > n > 2 * 64, "padding, and a state over two key tiles"
    whole, whole_kv = _step(device, config, params, arrays, None)
    # The step's readout rows, a repeat and a state token, in a shuffled order.
    rows = np.concatenate([arrays["rows"], arrays["rows"][:1], [ROOT + 17]]).astype(np.int32)
    rows = rng.permutation(rows)
    got, got_kv = _step(device, config, params, arrays, jnp.asarray(rows))
    platform = device.platform
    _assert_same(got, whole[rows], precision, platform, f"{name}: the rows' hidden states")
    for layer, (a, b) in enumerate(zip(got_kv, whole_kv, strict=True)):
        for which, x, y in zip("kv", a, b, strict=True):
            _assert_same(x, y, precision, platform, f"{name}: layer {layer}'s {which} pool")


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("r", [5, 25])  # 25 > T: the whole last layer, then its rows
def test_masked_forward_rows_are_the_whole_forwards_rows(precision, r, rng):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["gemma3"])
    params = init_random(config, precision, seed=int(rng.integers(1 << 30)))
    t = 20
    tokens = jnp.asarray(rng.integers(0, config.vocab_size, t), jnp.int32)
    positions = jnp.arange(t, dtype=jnp.int32)
    mask = jnp.tril(jnp.ones((t, t), bool))
    rows = jnp.asarray(rng.choice(t, r), jnp.int32)
    fwd = jax.jit(forward, static_argnames="config")
    whole = np.asarray(fwd(params, config, tokens, positions, mask))
    got = np.asarray(fwd(params, config, tokens, positions, mask, rows))
    platform = jax.devices()[0].platform  # the default device: the H200 in gpu_suite.sh
    _assert_same(got, whole[np.asarray(rows)], precision, platform, f"{precision}: forward's rows")


def test_rows_must_be_int32_indices(rng):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS["qwen3"])
    params = init_random(config, "int8", seed=0)
    tokens = jnp.zeros(4, jnp.int32)
    positions = jnp.arange(4, dtype=jnp.int32)
    mask = jnp.tril(jnp.ones((4, 4), bool))
    with pytest.raises(ValueError, match="rows must be int32"):
        forward(params, config, tokens, positions, mask, jnp.zeros((2, 1), jnp.int32))
