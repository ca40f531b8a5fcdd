"""add_rmsnorm_quant_sum: add_rmsnorm_quant (plain, or with Gemma's fused post-norm x_gamma) of
a two-digit projection's partial products, x = y2[:M] + (y2[M:] + y_w2), added in the kernel in
Linear's order. Every kernel must give the bits of XLA's sum followed by add_rmsnorm_quant, and
the two-digit model must hand its o and down partials to it with unchanged results."""

import jax
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model import forward, init_random
from prism_jax.model.layers import Linear
from tests.conftest import assert_bitwise_equal, run_on
from tests.model.tiny import TINY_HF_CONFIGS
from tests.ops.test_rmsnorm_quant import KERNELS, STYLES, hard_rows

SHAPES = [(1, 1), (3, 7), (5, 257), (19, 1152), (2, 5376), (300, 5376)]


def partials(rng, m, d):
    """y2 [2M, D] (x1 W1 over x2 W1: the second digit's rows ~127x smaller) and y_w2 [M, D]."""
    y1 = hard_rows(rng, m, d, np.float32)
    y2 = np.concatenate([y1, y1 / 127 * rng.normal(0, 1, (m, d)).astype(np.float32)])
    return y2, (y1 / 127 * rng.normal(0, 1, (m, d))).astype(np.float32)


def summed(y2, y_w2, residual, gamma, **kw):
    """XLA adds the partials (Linear's order), then the unsummed custom call."""
    m = y_w2.shape[0]
    return ops.add_rmsnorm_quant(y2[:m] + (y2[m:] + y_w2), residual, gamma, **kw)


def case(rng, m, d):
    y2, y_w2 = partials(rng, m, d)
    residual = rng.normal(0, 3.0, (m, d)).astype(np.float32)
    gamma, x_gamma = (rng.normal(0, 0.5, d).astype(np.float32) for _ in range(2))
    return (y2, y_w2, residual, gamma), x_gamma


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("post_norm", [False, True])
@pytest.mark.parametrize("digits", [1, 2])
def test_sum_is_the_norm_of_the_models_sum(device, rng, m, d, post_norm, digits):
    """Against XLA's sum then add_rmsnorm_quant on the device, and the reference on the CPU."""
    args, x_gamma = case(rng, m, d)
    kw = dict(STYLES[(m + d) % 2], digits=digits, x_gamma=x_gamma if post_norm else None)
    got = run_on(device, ops.add_rmsnorm_quant_sum, *args, **kw)
    want = run_on(device, summed, *args, **kw)
    ref = run_on(jax.devices("cpu")[0], ops.add_rmsnorm_quant_sum, *args, impl="reference", **kw)
    assert len(got) == len(want) == len(ref) == 2 * digits + 1
    for i, (a, b, c) in enumerate(zip(got, want, ref, strict=True)):
        assert_bitwise_equal(a, b, f"output {i}: summed in the kernel vs by XLA")
        assert_bitwise_equal(a, c, f"output {i}: kernel vs reference")


@pytest.mark.parametrize("m", [1, 64, 256, 1100])  # 1100: the launcher's own choice is lean
@pytest.mark.parametrize("d", [777, 1000, 5376])
def test_sum_every_kernel(gpu, rng, monkeypatch, m, d):
    """The split kernels add the parts in their loads (reg2-8, lean2-8, the launcher's choice);
    the one-warp and block kernels, and the post-norm's two-launch fallback, sum into h first."""
    args, x_gamma = case(rng, m, d)
    cpu = jax.devices("cpu")[0]
    for post_norm in (False, True):
        kw = dict(STYLES[(m + d) % 2], digits=2, x_gamma=x_gamma if post_norm else None)
        want = run_on(cpu, ops.add_rmsnorm_quant_sum, *args, **kw)
        for kernel in KERNELS:
            monkeypatch.setenv("PRISM_RMSNORM_KERNEL", kernel)
            got = run_on(gpu, ops.add_rmsnorm_quant_sum, *args, **kw)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert_bitwise_equal(a, b, f"post-norm {post_norm}, {kernel!r}: output {i}")
        monkeypatch.delenv("PRISM_RMSNORM_KERNEL")


def test_sum_rejects_mismatched_parts():
    y_w2, g = np.zeros((3, 8), np.float32), np.zeros(8, np.float32)
    with pytest.raises(ValueError, match=r"y2 must be float32 \[2M, D\]"):
        ops.add_rmsnorm_quant_sum(np.zeros((3, 8), np.float32), y_w2, y_w2, g, eps=1e-6)
    with pytest.raises(ValueError, match="y2 must be float32"):
        ops.add_rmsnorm_quant_sum(np.zeros((6, 8), np.float16), y_w2, y_w2, g, eps=1e-6)


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_two_digit_model_adds_o_and_down_in_the_norm(device, monkeypatch, family):
    """The forward hands the o and down partials to the norms (the jaxpr has the _sum target)
    and gives the bits of the model whose projections add their partials in XLA."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS[family])
    assert {"o", "down"} <= set(config.int8_two_digit_rows) & set(config.int8_two_digit_weights)
    params = init_random(config, "int8", seed=1)
    tokens = np.random.default_rng(0).integers(0, config.vocab_size, 12).astype(np.int32)
    positions, causal = np.arange(12, dtype=np.int32), np.tril(np.ones((12, 12), bool))

    def traced(tokens):  # a new function each time: make_jaxpr caches by function
        return str(jax.make_jaxpr(lambda t: forward(params, config, t, positions, causal))(tokens))

    def run(tokens):
        return forward(params, config, tokens, positions, causal)

    target = "prism_norm_add_rmsnorm_quant_sum" if config.sandwich_norms else (
        "prism_add_rmsnorm_quant_sum")  # fmt: skip
    assert target in traced(tokens)
    got = run_on(device, run, tokens)
    monkeypatch.setattr(Linear, "partials_or_output", Linear.__call__)
    assert target not in traced(tokens)
    assert_bitwise_equal(got, run_on(device, run, tokens), f"{family}: partials summed by XLA")
