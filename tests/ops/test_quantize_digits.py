"""quantize_digits (the prism_quantize_rows custom call) against its reference, ops.quantize_rows
then ops.quantize_remainder (the XLA path the two-digit model took before) run on the CPU:
bitwise on each device, one and two digits; the digits stacked in the call's output; row
invariance; the CUDA kernel's cached and recomputed rows; bad arguments."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance

# (2, 60000): a row longer than the CUDA kernel keeps in shared memory (recomputed).
SHAPES = [(1, 1), (3, 7), (9, 257), (64, 5376), (300, 1000), (2, 60000)]


def rows(rng, shape, scale=2.0):
    """Random rows; with 3+ rows, row 1 is all zero and row 2 has one planted outlier."""
    y = rng.normal(0, scale, shape).astype(np.float32)
    if shape[0] > 2:
        y[1] = 0.0
        y[2, rng.integers(0, shape[1])] = 50.0 * scale
    return y


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("digits", [1, 2])
def test_matches_reference_bitwise(device, rng, m, d, digits):
    """The reference runs on the CPU: XLA's GPU division 127 / amax is not correctly rounded
    (one code of 344,064 off by one on the H200), while both handlers' is (numerics.h)."""
    y = rows(rng, (m, d))
    got = run_on(device, lambda a: ops.quantize_digits(a, digits=digits), y)
    cpu = jax.devices("cpu")[0]
    want = run_on(cpu, lambda a: ops.quantize_digits(a, digits=digits, impl="reference"), y)
    assert len(got) == len(want) == 2 * digits
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_bitwise_equal(a, b, f"quantize_digits({digits}) output {i}")
    if m > 2:
        assert got[1][1] == 0 and not got[0][1].any(), "an all-zero row quantises to zeros"


def test_digits_reconstruct_the_rows(rng):
    y = rows(rng, (16, 2048))
    q1, s1, q2, s2 = run_on(jax.devices("cpu")[0], lambda a: ops.quantize_digits(a, digits=2), y)
    back = q1 * s1[:, None].astype(np.float64) + q2 * s2[:, None].astype(np.float64)
    amax = np.abs(y).max(axis=1, keepdims=True)
    assert np.all(np.abs(back - y) <= amax / (127 * 254) * 1.01)


def test_two_digits_come_from_one_stacked_output(rng):
    """The halves are slices of one [2M, D] result, so the GEMM's concatenate folds away."""
    y = rows(rng, (5, 64))

    def stacked(a):
        q1, s1, q2, s2 = ops.quantize_digits(a, digits=2)
        return jnp.concatenate([q1, q2]), jnp.concatenate([s1, s2])

    hlo = jax.jit(stacked).lower(jnp.asarray(y)).compile().as_text()
    assert "concatenate" not in hlo, "XLA should fold the halves back into the call's output"


@pytest.mark.parametrize("digits", [1, 2])
def test_row_invariance(device, rng, digits):
    d = 1000
    check_row_invariance(
        device,
        lambda a: ops.quantize_digits(a, digits=digits),
        [rows(rng, (1, d))[0]],
        lambda n: [rows(rng, (n, d))],
    )


@pytest.mark.gpu
def test_cached_rows_match_recomputed_rows_bitwise(gpu, rng, monkeypatch):
    y = rows(rng, (33, 5376))
    out = []
    for cache in ("on", "off"):
        monkeypatch.setenv("PRISM_GLU_CACHE", cache)
        out.append(run_on(gpu, lambda a: ops.quantize_digits(a, digits=2), y))
    monkeypatch.delenv("PRISM_GLU_CACHE")
    for i, (a, b) in enumerate(zip(*out, strict=True)):
        assert_bitwise_equal(a, b, f"output {i}: cached vs recomputed row")


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="y must be float32"):
        ops.quantize_digits(jnp.zeros((2, 8), jnp.bfloat16), digits=2)
    with pytest.raises(ValueError, match="y must be float32"):
        ops.quantize_digits(jnp.zeros((8,), jnp.float32), digits=1)
    with pytest.raises(AssertionError, match="digits must be 1 or 2"):
        ops.quantize_digits(jnp.zeros((2, 8), jnp.float32), digits=3)
