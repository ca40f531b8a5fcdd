"""rmsnorm_quant / add_rmsnorm_quant with digits=2: the row's remainder quantised in the same
custom call (the two-digit INT8 path). Every kernel must give the bits of the unfused pair it
replaces, the float norm then quantize_digits, and the first digit must be the one-digit
call's codes and scales."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.test_rmsnorm_quant import KERNELS, SHAPES, STYLES, activations, hard_rows


def fused(x, res, xg, g, **kw):
    """(q1, s1, q2, s2[, h]) of the op under test: no residual, a residual, or both plus the
    fused post-norm (x_gamma)."""
    if res is None:
        return ops.rmsnorm_quant(x, g, digits=2, **kw)
    return ops.add_rmsnorm_quant(x, res, g, x_gamma=xg, digits=2, **kw)


def unfused(x, res, xg, g, **kw):
    """The same from the float norm and ops.quantize_digits, two custom calls."""
    if res is None:
        return ops.quantize_digits(ops.rmsnorm(x, g, **kw), digits=2)
    y, h = ops.add_rmsnorm(x, res, g, x_gamma=xg, **kw)
    return (*ops.quantize_digits(y, digits=2), h)


def one_digit(x, res, xg, g, **kw):
    if res is None:
        return ops.rmsnorm_quant(x, g, **kw)
    return ops.add_rmsnorm_quant(x, res, g, x_gamma=xg, **kw)


def forms(rng, x, d):
    """(name, residual, x_gamma) of every form the two-digit path calls."""
    res = activations(rng, x.shape, jnp.float32, 4.0)
    xg = rng.normal(0, 0.5, d).astype(np.float32)
    return (("rmsnorm_quant", None, None), ("add", res, None), ("norm_add", res, xg))


def check_digits(device, x, res, xg, g, what, **kw):
    got = run_on(device, fused, x, res, xg, g, **kw)
    want = run_on(device, unfused, x, res, xg, g, **kw)
    assert len(got) == len(want) == (4 if res is None else 5), what
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert_bitwise_equal(a, b, f"{what}: output {i} vs the unfused pair")
    first = run_on(device, one_digit, x, res, xg, g, **kw)
    assert_bitwise_equal(got[0], first[0], f"{what}: first digit's codes vs one digit")
    assert_bitwise_equal(got[1], first[1], f"{what}: first digit's scales vs one digit")
    return got


@pytest.mark.parametrize("m,d", SHAPES + [(4, 13000)])  # 13000: the block kernel, unstaged
@pytest.mark.parametrize("style", STYLES)
def test_two_digits_match_the_unfused_pair_bitwise(device, rng, m, d, style):
    x = activations(rng, (m, d), jnp.float32, 3.0)
    g = rng.normal(0, 0.5, d).astype(np.float32)
    for name, res, xg in forms(rng, x, d):
        got = check_digits(device, x, res, xg, g, f"{name} {m}x{d}", **style)
        assert np.abs(got[2]).max() <= 127
        if m > 1:  # activations() zeroes the middle row (no residual: its norm is zero)
            assert res is not None or (got[3][m // 2] == 0 and not got[2][m // 2].any())


@pytest.mark.parametrize("m,d", [(3, 5376), (2, 300)])
def test_two_digits_match_the_reference_bitwise(device, rng, m, d):
    """Against the pure-jnp reference (quantize_digits_reference of the normalised rows),
    computed on the CPU as the one-digit tests do (XLA's GPU division is not IEEE)."""
    x = activations(rng, (m, d), jnp.float32, 2.0)
    g = rng.normal(0, 0.5, d).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    for name, res, xg in forms(rng, x, d):
        got = run_on(device, fused, x, res, xg, g, eps=1e-6, weight_offset=1.0)
        want = run_on(cpu, fused, x, res, xg, g, eps=1e-6, weight_offset=1.0, impl="reference")
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert_bitwise_equal(a, b, f"{name}: output {i} vs the reference")


@pytest.mark.parametrize("m", [3, 256, 1100])  # 1100: the launcher takes the lean form
@pytest.mark.parametrize("d", [128, 777, 5376])
def test_every_cuda_kernel_gives_the_cpu_bits(gpu, rng, monkeypatch, m, d):
    """Every forced kernel (one warp, 2/4/8 warps, their lean forms, the block kernel; the
    fused post-norm's split form and its unfused fallback) against the CPU, bit for bit."""
    x = hard_rows(rng, m, d, jnp.float32)
    g = rng.normal(0, 0.5, d).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    for name, res, xg in forms(rng, x, d):
        want = run_on(cpu, fused, x, res, xg, g, eps=1e-6, weight_offset=1.0)
        for kernel in KERNELS:
            monkeypatch.setenv("PRISM_RMSNORM_KERNEL", kernel)
            got = run_on(gpu, fused, x, res, xg, g, eps=1e-6, weight_offset=1.0)
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert_bitwise_equal(a, b, f"{name} output {i}: kernel {kernel!r} vs CPU")
        monkeypatch.delenv("PRISM_RMSNORM_KERNEL")


def test_two_digits_need_float32_rows_and_one_or_two_digits():
    x = jnp.ones((2, 8), jnp.bfloat16)
    g = jnp.ones((8,), jnp.float32)
    with pytest.raises(ValueError, match="two digits need float32 rows"):
        ops.rmsnorm_quant(x, g, eps=1e-6, digits=2)
    with pytest.raises(ValueError, match="digits must be 1 or 2"):
        ops.add_rmsnorm_quant(x.astype(jnp.float32), x.astype(jnp.float32), g, eps=1e-6, digits=3)


def test_handler_checks_digits_and_shapes(device):
    """A hand-written call must fail with a message, never write past its outputs."""
    x = jax.device_put(jnp.ones((2, 8), jnp.float32), device)
    g = jax.device_put(jnp.ones((8,), jnp.float32), device)

    def call(digits, rows, dtype=jnp.float32):
        outs = (
            jax.ShapeDtypeStruct((rows, 8), jnp.int8),
            jax.ShapeDtypeStruct((rows,), jnp.float32),
        )
        f = jax.ffi.ffi_call("prism_rmsnorm_quant", outs)
        arg = x.astype(dtype)
        return jax.block_until_ready(
            f(arg, g, eps=np.float32(1e-6), weight_offset=np.float32(0), digits=np.int32(digits))
        )

    with pytest.raises(Exception, match="digits must be 1 or 2"):
        call(3, 6)
    with pytest.raises(Exception, match=r"x_q must be \[digits \* M, D\]"):
        call(2, 2)
    with pytest.raises(Exception, match="two digits need float32 rows"):
        call(2, 4, jnp.bfloat16)
    q, s = call(2, 4)
    assert q.shape == (4, 8) and s.shape == (4,)
