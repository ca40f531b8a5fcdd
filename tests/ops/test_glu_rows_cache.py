"""The CUDA gated-activation kernel (cc/ops/glu_rows.cuh) keeps a row in shared memory between
its passes when F floats fit, and recomputes it from the inputs otherwise: both paths give the
same bits for glu_quant, glu_quant2 and glu_quant2_sum (PRISM_GLU_CACHE=off forces the
recomputing one), and rows too long to cache match the CPU's first digit."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, assert_same_bits_under, run_on

# (600, 1000): more rows than RowBlockThreads' many-rows threshold (uncached blocks narrow to
# 256 threads, cached ones keep one chunk per thread); (5, 21504): the 27B's F.
SHAPES = [(1, 1), (3, 7), (9, 257), (33, 2048), (600, 1000), (5, 21504)]
ACT = "gelu_tanh"


def rows(rng, shape, dtype=jnp.float32, scale=2.0):
    x = rng.normal(0, scale, shape).astype(np.float32)
    if shape[0] > 2:
        x[1] = 0.0  # an all-zero row
    return np.asarray(jnp.asarray(x).astype(dtype))


def glu_ops(rng, m, f, dtype):
    """(name, fn, args) for the three ops on fresh inputs."""
    gu = rows(rng, (m, 2, f), dtype)
    out = [
        ("glu_quant_pair", lambda a: ops.glu_quant_pair(a, activation=ACT), (gu,)),
        ("glu_quant2_pair", lambda a: ops.glu_quant2_pair(a, activation=ACT), (gu,)),
    ]
    if dtype == jnp.float32:
        y2, yw2 = rows(rng, (2 * m, 2, f)), rows(rng, (m, 2, f), scale=0.01)
        out.append(
            ("glu_quant2_sum", lambda a, b: ops.glu_quant2_sum(a, b, activation=ACT), (y2, yw2))
        )
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("m,f", SHAPES)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cached_rows_match_recomputed_rows_bitwise(gpu, rng, monkeypatch, m, f, dtype):
    for name, fn, args in glu_ops(rng, m, f, dtype):
        knob = ("PRISM_GLU_CACHE", ("on", "off"))  # cached, then recomputed rows
        assert_same_bits_under(monkeypatch, *knob, gpu, fn, *args, what=name)


@pytest.mark.gpu
def test_rows_too_long_to_cache_match_the_cpu(gpu, rng):
    """F = 60,000 floats exceed the 200 KB cache: the recomputing path, against the CPU (scales
    to float32 rounding, codes within one step: CUDA's tanh is not libm's)."""
    gu = rows(rng, (2, 2, 60000))
    cpu = jax.devices("cpu")[0]
    q_gpu, s_gpu = run_on(gpu, lambda a: ops.glu_quant_pair(a, activation=ACT), gu)
    q_cpu, s_cpu = run_on(cpu, lambda a: ops.glu_quant_pair(a, activation=ACT), gu)
    np.testing.assert_allclose(s_gpu, s_cpu, rtol=2e-6)
    assert np.abs(q_gpu.astype(np.int32) - q_cpu).max() <= 1
    first = run_on(gpu, lambda a: ops.glu_quant2_pair(a, activation=ACT), gu)
    assert_bitwise_equal(first[0], q_gpu, "glu_quant2's first digit vs glu_quant, uncached")
    assert_bitwise_equal(first[1], s_gpu, "glu_quant2's first scale vs glu_quant, uncached")


@pytest.mark.gpu
def test_unknown_cache_setting_is_an_error(gpu, rng, monkeypatch):
    """A misspelt PRISM_GLU_CACHE must fail, not silently test the default path."""
    monkeypatch.setenv("PRISM_GLU_CACHE", "no")
    with pytest.raises(Exception, match="PRISM_GLU_CACHE"):
        run_on(gpu, lambda a: ops.glu_quant_pair(a, activation=ACT), rows(rng, (2, 2, 64)))
