"""int8_gemm_add_pair against its pure-jnp reference (bitwise) and against the unfused ops."""

import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.int8_gemm_add_pair import int8_gemm_add_pair_reference
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.test_int8_gemm import random_int8

# (M, K, N): odd sizes (the CUDA fallback: simt GEMM, then the elementwise adds), M <= 64 (the
# swapped tile), larger M (128x128), one 27B-like K.
SHAPES = [
    (1, 37, 11),
    (3, 64, 130),
    (40, 1040, 136),
    (64, 528, 392),
    (200, 528, 392),
    (130, 5376, 264),
]


def random_inputs(rng, m, k, n):
    x, w = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    # Partials of mixed sign and magnitude, so both adds round.
    pair = rng.standard_normal((2 * m, n)) * rng.choice([1e-3, 1.0, 1e3], (2 * m, n))
    return x, s_x, w, s_w, pair.astype(np.float32)


@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matches_reference_bitwise(device, rng, m, k, n):
    args = random_inputs(rng, m, k, n)
    got = run_on(device, ops.int8_gemm_add_pair, *args)
    want = run_on(device, int8_gemm_add_pair_reference, *args)
    assert_bitwise_equal(got, want, "int8_gemm_add_pair vs reference")


@pytest.mark.parametrize("m,k,n", SHAPES[2:4])
def test_equals_gemm_then_adds(device, rng, m, k, n):
    """The fused op gives the bits of prism_int8_gemm followed by the adds in float32."""
    x, s_x, w, s_w, pair = random_inputs(rng, m, k, n)
    y = np.asarray(run_on(device, ops.int8_gemm, x, s_x, w, s_w))
    want = pair[:m] + (pair[m:] + y)
    assert_bitwise_equal(
        run_on(device, ops.int8_gemm_add_pair, x, s_x, w, s_w, pair), want, "fused vs unfused"
    )


def test_rejects_a_pair_of_the_wrong_shape():
    x, s_x, w, s_w, pair = random_inputs(np.random.default_rng(0), 4, 32, 8)
    with pytest.raises(ValueError, match=r"pair must be float32 \[8, 8\]"):
        ops.int8_gemm_add_pair(x, s_x, w, s_w, pair[:4])
    with pytest.raises(ValueError, match="x_q must be int8"):
        ops.int8_gemm_add_pair(x.astype(np.int32), s_x, w, s_w, pair)
