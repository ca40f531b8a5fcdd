"""Forest masks: two questions sharing a prefix in one flat sequence must give the hidden
states each question gets alone.

int8 must be bitwise: everything but attention is row-wise custom calls and elementwise XLA,
and the plain-jnp attention adds the forest's extra keys as exact zeros, which XLA:CPU's
sequential reductions leave invisible. That last part is XLA's choice, not a guarantee (a GPU
reduction tree may differ): the tree-attention custom call is what will make it one. The float
models are checked to a tolerance (the design does not require them to be invariant)."""

from __future__ import annotations

import numpy as np
import pytest

from prism_jax.config import ModelConfig
from prism_jax.model import init_random
from tests.model.helpers import run
from tests.model.tiny import TINY_HF_CONFIGS

PREFIX, QA, QB = 11, 6, 5  # prefix longer than gemma3's sliding window (8)
# Hidden-state tolerance in units of the hidden states' standard deviation.
TOLERANCE = {"fp32": 1e-5, "bf16": 5e-2, "int8": 0.0}


def forest_inputs(prefix, qa, qb):
    """Flat [prefix, qa, qb]: qa and qb both continue the prefix, neither sees the other."""
    tokens = np.concatenate([prefix, qa, qb])
    p, a, b = len(prefix), len(qa), len(qb)
    positions = np.concatenate([np.arange(p), p + np.arange(a), p + np.arange(b)])
    segment = np.array([0] * p + [1] * a + [2] * b)
    # Key k is visible to query q if it is an earlier-or-same position in q's own segment or
    # in the shared prefix (segment 0).
    same_or_root = (segment[:, None] == segment[None, :]) | (segment[None, :] == 0)
    mask = same_or_root & (np.arange(len(tokens))[None, :] <= np.arange(len(tokens))[:, None])
    return tokens, positions, mask


def padded_alone(tokens, length):
    """One causal sequence padded to `length` (one compiled shape for the whole test): the
    padding rows see only themselves and no real row sees them, as the engine pads buckets."""
    t = len(tokens)
    mask = np.tril(np.ones((length, length), bool))
    mask[t:, :] = np.eye(length, dtype=bool)[t:]
    return np.pad(tokens, (0, length - t)), np.arange(length), mask


@pytest.mark.parametrize(
    ("family", "precision"),
    [("gemma3", "fp32"), ("gemma3", "bf16"), ("gemma3", "int8"), ("qwen3", "int8")],
)
def test_forest_matches_separate_questions(family, precision, rng):
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS[family])
    params = init_random(config, precision, seed=int(rng.integers(1 << 30)))
    prefix, qa, qb = (rng.integers(0, config.vocab_size, n) for n in (PREFIX, QA, QB))
    tokens, positions, mask = forest_inputs(prefix, qa, qb)
    flat = run(params, config, tokens, positions, mask)
    alone_a = run(params, config, *padded_alone(np.concatenate([prefix, qa]), len(tokens)))
    alone_b = run(params, config, *padded_alone(np.concatenate([prefix, qb]), len(tokens)))
    alone_a, alone_b = alone_a[: PREFIX + QA], alone_b[: PREFIX + QB]
    pairs = {
        "prefix": (flat[:PREFIX], alone_a[:PREFIX]),
        "question a": (flat[PREFIX : PREFIX + QA], alone_a[PREFIX:]),
        "question b": (flat[PREFIX + QA :], alone_b[PREFIX:]),
    }
    scale = alone_a.std()
    for what, (got, want) in pairs.items():
        diff = np.abs(got - want).max() / scale
        bitwise = np.array_equal(got.view(np.uint32), want.view(np.uint32))
        print(f"{family} {precision} {what}: max diff {diff:.1e} std, bitwise {bitwise}")
        assert diff <= TOLERANCE[precision], f"{what}: forest vs alone differ by {diff:.2e} std"
        if precision == "int8":
            assert bitwise, f"int8 {what}: forest and alone differ in bits (max {diff:.1e} std)"
