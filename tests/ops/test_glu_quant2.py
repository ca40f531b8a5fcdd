"""glu_quant2 (both INT8 digits of the gated activation in one custom call): the first digit
is glu_quant's, bitwise; both digits against the pure-jnp reference (codes within one step:
XLA's tanh/exp differ from libm by ulps); reconstruction to 1 / (127 * 254) of the row max;
row invariance bitwise; no XLA transcendental on the model's path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model import init_random
from prism_jax.model.layers import Quantized
from prism_jax.model.transformer import bind
from prism_jax.ops.glu_quant import gelu_tanh, silu
from tests.conftest import assert_bitwise_equal, run_on
from tests.model.tiny import TINY_HF_CONFIGS
from tests.ops.invariance import check_row_invariance

SHAPES = [(1, 1), (4, 1), (1, 1152), (3, 7), (9, 257), (33, 2048)]
ACTIVATIONS = ["gelu_tanh", "silu"]
DTYPES = [jnp.float32, jnp.bfloat16]


def gate_up(rng, shape, dtype, scale=2.0):
    """Random rows; with 3+ rows, row 1 is all zero and row 2 has one planted outlier."""
    g = rng.normal(0, scale, shape).astype(np.float32)
    u = rng.normal(0, scale, shape).astype(np.float32)
    if shape[0] > 2:
        u[1] = 0.0  # all-zero product row
        g[2, rng.integers(0, shape[1])] = 40.0 * scale  # the row's max, far above the rest
    return np.asarray(jnp.asarray(g).astype(dtype)), np.asarray(jnp.asarray(u).astype(dtype))


def activation_noise(g, u):
    """A bound on |XLA's act(g) * u - the kernel's|: tanh/exp a few ulps apart, which GELU's
    1 + tanh cancellation (very negative gate) turns into ulps of |g * u|, not of the result."""
    return 3e-7 * np.abs(g.astype(np.float64) * u.astype(np.float64))


def reference_activation(g, u, activation):
    act = gelu_tanh if activation == "gelu_tanh" else silu  # run by XLA: ulps off the kernel
    cpu = jax.devices("cpu")[0]
    return run_on(cpu, lambda a, b: act(a.astype(jnp.float32)) * b.astype(jnp.float32), g, u)


@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_pair_reads_the_fused_projection_in_place(device, rng, m, f, dtype, activation):
    """The model passes the gate/up projection's [T, 2, F] output as it is: both ops on it give
    the bits of the same ops on gate and up given apart (leading dims kept)."""
    g, u = gate_up(rng, (m, f), dtype)
    fused = np.stack([g, u], axis=-2).reshape(1, m, 2, f)
    for pair, apart in ((ops.glu_quant_pair, ops.glu_quant), (ops.glu_quant2_pair, ops.glu_quant2)):
        got = run_on(device, pair, fused, activation=activation)
        want = run_on(device, apart, g, u, activation=activation)
        for x, y, name in zip(got, want, ("q1", "s1", "q2", "s2"), strict=False):
            assert x.shape[0] == 1 and x.shape[1:] == y.shape, f"{name}: {x.shape} vs {y.shape}"
            assert_bitwise_equal(x[0], y, f"{pair.__name__} {name}")


@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_first_digit_is_glu_quant(device, rng, m, f, dtype, activation):
    g, u = gate_up(rng, (m, f), dtype)
    q1, s1, _, _ = run_on(device, ops.glu_quant2, g, u, activation=activation)
    q, s = run_on(device, ops.glu_quant, g, u, activation=activation)
    assert_bitwise_equal(q1, q, "q1 vs glu_quant's codes")
    assert_bitwise_equal(s1, s, "s1 vs glu_quant's scales")


@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("scale", [2.0, 300.0])
def test_matches_reference(device, rng, m, f, dtype, activation, scale):
    g, u = gate_up(rng, (m, f), dtype, scale)
    q1, s1, q2, s2 = run_on(device, ops.glu_quant2, g, u, activation=activation)
    # The reference runs on the CPU, as in test_glu_quant.py (XLA's GPU tanh is cruder).
    cpu = jax.devices("cpu")[0]
    r1, t1, r2, t2 = run_on(cpu, ops.glu_quant2, g, u, activation=activation, impl="reference")
    assert q1.dtype == q2.dtype == np.int8 and s1.shape == s2.shape == (m,)
    assert np.abs(q1).max() <= 127 and np.abs(q2).max() <= 127
    magnitude = np.abs(g.astype(np.float32) * u.astype(np.float32)).max(-1)
    assert np.all(np.abs(s1 - t1) * 127 <= 1e-5 * magnitude + 1e-30), "first scales differ"
    # Where XLA's activation and the kernel's differ by under a quarter of a step, the codes
    # are within one step; GELU's cancelling tail (a very negative gate) can leave XLA's a = 0
    # where the kernel's is -1e-6, which a one-element row scales to code -127.
    close = activation_noise(g, u) <= 0.25 * np.maximum(s1, t1)[:, None]
    first_gap = np.abs(q1.astype(np.int32) - r1)[close].max(initial=0)
    assert first_gap <= 1, "first codes differ by more than a step"
    # Where the first codes agree and the activations differ by under a quarter of a second
    # step, the remainders do too: second codes within one step. Elsewhere (one-element rows,
    # whose remainder is ulp-sized; GELU's cancelling tails) the second digit is ulp noise.
    same = (q1 == r1) & (activation_noise(g, u) <= 0.25 * s2[:, None])
    assert np.abs(q2.astype(np.int32) - r2)[same].max(initial=0) <= 1, "second codes differ"
    assert np.all(np.abs(s2 - t2) <= 1e-3 * t2 + 1e-6 * s1 + 1e-30), "second scales differ"
    if m > 2:
        assert s1[1] == s2[1] == 0 and not q1[1].any() and not q2[1].any(), "zero row"


@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_two_digits_reconstruct_the_activation(device, rng, m, f, dtype, activation):
    g, u = gate_up(rng, (m, f), dtype)
    q1, s1, q2, s2 = run_on(device, ops.glu_quant2, g, u, activation=activation)
    a = reference_activation(g, u, activation).astype(np.float64)
    one = q1 * s1[:, None].astype(np.float64)
    two = one + q2 * s2[:, None].astype(np.float64)
    amax = np.abs(a).max(-1, keepdims=True)
    # The remainder is at most half a first step (amax / 254), so its digit's step is at most
    # amax / (127 * 254); two digits miss by half of that, plus XLA-vs-kernel activation noise.
    # The first code rounds f32 a * (127 / amax), two roundings of up to 2^-24 relative at
    # codes up to 127, so a remainder can pass half a step by 127 * 2 * 2^-24 steps: 3.0e-5 of
    # the half step (seed 4043404849 gave 2.1e-5).
    slack = 1 + 2 * 127 * 2 * 2.0**-24
    assert np.all(s2 <= s1 / 254 * slack + 1e-30), "second step above 1/254 of the first"
    bound = amax / (127 * 254) * 0.5 * slack + activation_noise(g, u) + 1e-30
    assert np.all(np.abs(two - a) <= bound), "two digits miss by more than half a step"
    if f >= 7:
        rows = amax[:, 0] > 0
        assert np.all(np.abs(two - a).max(-1)[rows] < np.abs(one - a).max(-1)[rows] / 50)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_row_invariance(device, rng, dtype, activation):
    f = 1000
    g, u = gate_up(rng, (1, f), dtype)

    def others(n):
        return gate_up(rng, (n, f), dtype)

    check_row_invariance(device, ops.glu_quant2, [g[0], u[0]], others, activation=activation)


def test_cuda_matches_cpu(gpu, rng):
    """Both kernels call accurate tanhf/expf, so codes agree within a step (test_glu_quant)."""
    g, u = gate_up(rng, (64, 21504 // 8), jnp.bfloat16)
    cpu = jax.devices("cpu")[0]
    for activation in ACTIVATIONS:
        q1g, s1g, q2g, s2g = run_on(gpu, ops.glu_quant2, g, u, activation=activation)
        q1c, s1c, q2c, s2c = run_on(cpu, ops.glu_quant2, g, u, activation=activation)
        np.testing.assert_allclose(s1g, s1c, rtol=2e-6)
        assert np.abs(q1g.astype(np.int32) - q1c).max() <= 1
        same = q1g == q1c
        assert np.abs(q2g.astype(np.int32) - q2c)[same].max(initial=0) <= 1
        np.testing.assert_allclose(s2g, s2c, rtol=1e-3)


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_model_mlp_leaves_transcendentals_to_the_kernel(family):
    """XLA's tanh/exp are not row-invariant on the GPU: the two-digit int8 MLP must take both
    digits of its activation from the custom call, with no XLA transcendental anywhere."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS[family]).replace(
        int8_two_digit_rows=("down",)
    )
    mlp = bind(init_random(config, "int8", seed=0), config).layers[0].mlp
    q = jnp.zeros((4, config.hidden_size), jnp.int8)
    s = jnp.ones((4,), jnp.float32)
    jaxpr = str(jax.make_jaxpr(lambda q, s: mlp(Quantized(q, s)))(q, s))
    assert "prism_glu_quant2" in jaxpr
    for prim in ("tanh", "exp", "logistic", "erf"):
        assert f" {prim}[" not in jaxpr and f"= {prim} " not in jaxpr, prim


def partials(rng, m, f, scale=2.0):
    """A two-digit projection's partial products: y2 [2M, 2, F] (x1 W1 over x2 W1, the second
    digit's rows ~1/254 of the first's) and y_w2 [M, 2, F] (x1 W2, ~1/254 too)."""
    first = rng.normal(0, scale, (m, 2, f))
    second = rng.normal(0, scale / 254, (2, m, 2, f))
    y2 = np.concatenate([first, second[0]]).astype(np.float32)
    return y2, second[1].astype(np.float32)


# (2, 60000): a row of more floats than the CUDA kernel keeps in shared memory (recomputed).
# 300 rows: more than a GPU has SMs, so the CUDA kernel takes its two-blocks-an-SM width.
SUM_SHAPES = [(1, 1), (3, 7), (9, 257), (33, 2048), (300, 2048), (2, 60000)]


@pytest.mark.parametrize("m,f", SUM_SHAPES)
@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_sum_is_the_pair_of_the_models_sum(device, rng, m, f, activation):
    """glu_quant2_sum adds the partials in Int8Linear's order, y2[:M] + (y2[M:] + y_w2): its
    digits are glu_quant2_pair's of that sum, bit for bit, on each device."""
    y2, y_w2 = partials(rng, m, f)
    if m > 2:
        y2[1, 1], y2[m + 1, 1], y_w2[1, 1] = 0.0, 0.0, 0.0  # an all-zero up row
    got = run_on(device, ops.glu_quant2_sum, y2, y_w2, activation=activation)

    def summed_pair(y2, y_w2):
        return ops.glu_quant2_pair(y2[:m] + (y2[m:] + y_w2), activation=activation)

    want = run_on(device, summed_pair, y2, y_w2)
    for x, y, name in zip(got, want, ("q1", "s1", "q2", "s2"), strict=True):
        assert_bitwise_equal(x, y, f"glu_quant2_sum {name}")
    if m > 2:
        assert got[1][1] == got[3][1] == 0 and not got[0][1].any(), "zero row"


def test_sum_reference_adds_in_the_models_order(rng):
    y2, y_w2 = partials(rng, 5, 64)
    got = ops.glu_quant2_sum(y2, y_w2, activation="silu", impl="reference")
    gate_up = y2[:5] + (y2[5:] + y_w2)
    want = ops.glu_quant2_pair(gate_up, activation="silu", impl="reference")
    for x, y in zip(got, want, strict=True):
        assert_bitwise_equal(np.asarray(x), np.asarray(y), "reference")


@pytest.mark.parametrize("family", ["gemma3", "llama"])
def test_two_digit_mlp_adds_gate_up_in_the_kernel(device, family):
    """With two-digit gate/up rows and weights, the MLP hands gate_up's partial products to
    glu_quant2_sum: the same bits as Int8Linear's own sum through glu_quant2_pair."""
    config = ModelConfig.from_hf_config(TINY_HF_CONFIGS[family])
    assert {"gate_up", "down"} <= set(config.int8_two_digit_rows), "the default: two digits"
    mlp = bind(init_random(config, "int8", seed=0), config).layers[0].mlp
    rng = np.random.default_rng(0)
    x = rng.normal(0, 1, (6, config.hidden_size)).astype(np.float32)

    def quantized(x):
        q, s = ops.quantize_rows(x)
        return Quantized(q, s, *ops.quantize_remainder(x, q, s))

    def old_path(x):
        gu = mlp.gate_up(quantized(x))
        return mlp.down(Quantized(*ops.glu_quant2_pair(gu, activation=mlp.activation)))

    jaxpr = str(jax.make_jaxpr(lambda x: mlp(quantized(x)))(x))
    assert "prism_glu_quant2_sum" in jaxpr
    assert_bitwise_equal(run_on(device, lambda x: mlp(quantized(x)), x),
                         run_on(device, old_path, x), "two-digit MLP")  # fmt: skip
