"""add_rmsnorm_quant / add_rmsnorm with x_gamma: Gemma's post-norm fused in front of the next
residual add and norm (prism_norm_add_rmsnorm*). The reference normalises x, rounds it to x's
dtype and adds: the unfused sequence's bits, which every kernel must give."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance
from tests.ops.test_rmsnorm_quant import DTYPES, KERNELS, SHAPES, STYLES, activations, hard_rows


def fused_quant(x, res, xg, g, **kw):
    return ops.add_rmsnorm_quant(x, res, g, x_gamma=xg, **kw)


def fused_float(x, res, xg, g, **kw):
    return ops.add_rmsnorm(x, res, g, x_gamma=xg, **kw)


def unfused_quant(x, res, xg, g, **kw):
    return ops.add_rmsnorm_quant(ops.rmsnorm(x, xg, **kw), res, g, **kw)


def unfused_float(x, res, xg, g, **kw):
    return ops.add_rmsnorm(ops.rmsnorm(x, xg, **kw), res, g, **kw)


PAIRS = (("quant", fused_quant, unfused_quant), ("float", fused_float, unfused_float))


def gammas(rng, d):
    return [rng.normal(0, 0.5, d).astype(np.float32) for _ in range(2)]


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
def test_fused_post_norm_bitwise(device, rng, m, d, dtype, style):
    """Against the reference (on the CPU) and against the two unfused calls on the device."""
    x, res = activations(rng, (m, d), dtype, 5.0), activations(rng, (m, d), dtype, 4.0)
    args = (x, res, *gammas(rng, d))
    cpu = jax.devices("cpu")[0]
    for name, fused, unfused in PAIRS:
        got = jax.tree.leaves(run_on(device, fused, *args, **style))
        want = jax.tree.leaves(run_on(cpu, fused, *args, impl="reference", **style))
        split = jax.tree.leaves(run_on(device, unfused, *args, **style))
        for i, (a, b, c) in enumerate(zip(got, want, split, strict=True)):
            assert_bitwise_equal(a, b, f"{name} output {i}: kernel vs reference")
            assert_bitwise_equal(a, c, f"{name} output {i}: fused vs rmsnorm then add")
            assert a.dtype == b.dtype


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 64, 256, 1100])  # 1100: the launcher's own choice is lean
@pytest.mark.parametrize("d", [777, 1000, 4101, 5376])
def test_fused_post_norm_every_kernel(gpu, rng, monkeypatch, dtype, m, d):
    """The split kernels' fused form (reg2/4/8, lean2/4/8, the launcher's choice) and the
    two-launch fallback (reg1, block) give the CPU's bits."""
    x, res = hard_rows(rng, m, d, dtype), hard_rows(rng, m, d, dtype)
    args = (x, res, *gammas(rng, d))
    style = STYLES[(m + d) % 2]
    cpu = jax.devices("cpu")[0]
    for name, fused, _ in PAIRS:
        want = jax.tree.leaves(run_on(cpu, fused, *args, **style))
        for kernel in KERNELS:
            monkeypatch.setenv("PRISM_RMSNORM_KERNEL", kernel)
            got = jax.tree.leaves(run_on(gpu, fused, *args, **style))
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert_bitwise_equal(a, b, f"{name} output {i}: kernel {kernel!r} vs CPU")
        monkeypatch.delenv("PRISM_RMSNORM_KERNEL")


def test_fused_post_norm_row_invariance(device, rng):
    d = 5376
    xg, g = gammas(rng, d)
    x, r = activations(rng, (1, d), jnp.float32)[0], activations(rng, (1, d), jnp.float32)[0]

    def others(n):
        return activations(rng, (n, d), jnp.float32), activations(rng, (n, d), jnp.float32)

    check_row_invariance(
        device, lambda a, b, xg, g: fused_quant(a, b, xg, g, eps=1e-6), [x, r], others, [xg, g]
    )


def test_fused_post_norm_bad_x_gamma():
    x = np.zeros((2, 8), np.float32)
    with pytest.raises(ValueError, match="x_gamma"):
        ops.add_rmsnorm_quant(
            x, x, np.zeros(8, np.float32), eps=1e-6, x_gamma=np.zeros(7, np.float32)
        )
