"""rmsnorm, rmsnorm_quant, add_rmsnorm_quant and add_rmsnorm against the canonical-order
reference.

The reference sums squares in the kernels' canonical order, so results must match bitwise.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.canonical import canonical_sum
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance

SHAPES = [(1, 1), (1, 640), (3, 7), (5, 257), (19, 1152), (2, 5376)]
DTYPES = [jnp.float32, jnp.bfloat16]
STYLES = [dict(eps=1e-6, weight_offset=1.0), dict(eps=1e-5, weight_offset=0.0)]  # Gemma, Llama


def activations(rng, shape, dtype, scale=1.0):
    x = rng.normal(0, scale, shape).astype(np.float32)
    if shape[0] > 1:
        x[shape[0] // 2] = 0.0  # an all-zero row
    return np.asarray(jnp.asarray(x).astype(dtype))


def both(device, fn, *args, **kwargs):
    """Kernel on `device`, reference on the CPU: XLA's GPU sqrt and division are not IEEE
    correctly rounded (seen on the H200), while the CUDA kernel's are."""
    cpu = jax.devices("cpu")[0]
    return run_on(device, fn, *args, **kwargs), run_on(cpu, fn, *args, impl="reference", **kwargs)


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("scale", [1.0, 3e4])
def test_rmsnorm_quant_bitwise(device, rng, m, d, dtype, style, scale):
    x = activations(rng, (m, d), dtype, scale)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    (q, s), (q_ref, s_ref) = both(device, ops.rmsnorm_quant, x, gamma, **style)
    assert q.dtype == np.int8 and s.dtype == np.float32
    assert_bitwise_equal(q, q_ref, "codes")
    assert_bitwise_equal(s, s_ref, "scales")
    assert np.abs(q).max() <= 127
    if m > 1:
        assert s[m // 2] == 0 and not q[m // 2].any(), "zero row -> zero scale and codes"


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
def test_add_rmsnorm_quant_bitwise(device, rng, m, d, dtype, style):
    x, res = activations(rng, (m, d), dtype), activations(rng, (m, d), dtype, 4.0)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    out, ref = both(device, ops.add_rmsnorm_quant, x, res, gamma, **style)
    for name, a, b in zip(("codes", "scales", "sum"), out, ref, strict=True):
        assert_bitwise_equal(a, b, name)
    assert out[2].dtype == np.dtype(dtype)


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
def test_add_rmsnorm_bitwise(device, rng, m, d, dtype, style):
    """The two-digit path's residual add and float norm: y is rmsnorm's of the sum, h the sum
    add_rmsnorm_quant writes, bit for bit."""
    x, res = activations(rng, (m, d), dtype), activations(rng, (m, d), dtype, 4.0)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    (y, h), (y_ref, h_ref) = both(device, ops.add_rmsnorm, x, res, gamma, **style)
    assert_bitwise_equal(y, y_ref, "y")
    assert_bitwise_equal(h, h_ref, "sum")
    assert y.dtype == h.dtype == np.dtype(dtype)
    h_quant = run_on(device, ops.add_rmsnorm_quant, x, res, gamma, **style)[2]
    assert_bitwise_equal(h, h_quant, "sum vs add_rmsnorm_quant's")
    assert_bitwise_equal(y, run_on(device, ops.rmsnorm, h, gamma, **style), "y vs rmsnorm(h)")


@pytest.mark.parametrize("m,d", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", STYLES)
def test_rmsnorm_bitwise_and_close_to_textbook(device, rng, m, d, dtype, style):
    x = activations(rng, (m, d), dtype, 10.0)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    y, y_ref = both(device, ops.rmsnorm, x, gamma, **style)
    assert_bitwise_equal(y, y_ref, "rmsnorm")
    x64 = np.asarray(jnp.asarray(x).astype(jnp.float32), np.float64)
    textbook = x64 / np.sqrt((x64**2).mean(-1, keepdims=True) + style["eps"])
    textbook *= style["weight_offset"] + gamma
    tol = 1e-2 if dtype == jnp.bfloat16 else 1e-5
    np.testing.assert_allclose(np.asarray(y, np.float64), textbook, rtol=tol, atol=tol)


def test_quantisation_error_is_bounded(device, rng):
    x = activations(rng, (8, 1000), jnp.float32)
    gamma = np.zeros(1000, np.float32)
    q, s = run_on(device, ops.rmsnorm_quant, x, gamma, eps=1e-6, weight_offset=1.0)
    y = run_on(device, ops.rmsnorm, x, gamma, eps=1e-6, weight_offset=1.0)
    # In float64: the f32 q * s - y of the check itself rounds (seed 4215415741: an element at
    # 23.500000077 steps read as 1.5e-8 over half a step). The kernel's y * (127 / amax) is an
    # f32 product, so a code may round from within |y| * 2^-24 of a half step.
    err = np.abs(q.astype(np.float64) * s[:, None].astype(np.float64) - y.astype(np.float64))
    bound = s[:, None].astype(np.float64) / 2 + np.abs(y) * 2.0**-23
    assert np.all(err <= bound), "rounding error above half a step"


@pytest.mark.parametrize("dtype", DTYPES)
def test_row_invariance(device, rng, dtype):
    d = 777
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    x, r = activations(rng, (1, d), dtype)[0], activations(rng, (1, d), dtype)[0]

    def others(n):
        return activations(rng, (n, d), dtype), activations(rng, (n, d), dtype)

    def fused(x, res, gamma):
        return ops.add_rmsnorm_quant(x, res, gamma, eps=1e-6, weight_offset=1.0)

    def plain(x, res, gamma):
        return ops.rmsnorm(x, gamma, eps=1e-6)

    check_row_invariance(device, fused, [x, r], others, [gamma])
    check_row_invariance(device, plain, [x, r], others, [gamma])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m,d", [(37, 5376), (600, 128), (1000, 64), (9, 200), (70, 256)])
def test_cuda_matches_cpu_bitwise(gpu, rng, dtype, m, d):
    """D <= 256 runs the warp-per-row kernel, longer rows the block-per-row one."""
    x, res = activations(rng, (m, d), dtype), activations(rng, (m, d), dtype)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    for fn, args in (
        (ops.add_rmsnorm_quant, (x, res, gamma)),
        (ops.rmsnorm_quant, (x, gamma)),
        (ops.rmsnorm, (x, gamma)),
    ):
        out_gpu = run_on(gpu, fn, *args, eps=1e-6, weight_offset=1.0)
        out_cpu = run_on(cpu, fn, *args, eps=1e-6, weight_offset=1.0)
        for a, b in zip(jax.tree.leaves(out_gpu), jax.tree.leaves(out_cpu), strict=True):
            assert_bitwise_equal(a, b, f"{fn.__name__}: CUDA vs CPU")


LONG_D = [640, 1152, 4099, 4101, 5376]  # 4099, 4101: odd rows (scalar loads, a partial chunk)
LONG_M = [1, 3, 16, 256, 416]


def hard_rows(rng, m, d, dtype):
    """Random rows plus the awkward ones: an outlier in row 0, an all-zero row, a tiny row, a
    row whose only non-zero is its last element (the tail chunk)."""
    x = rng.normal(0, 1.0, (m, d)).astype(np.float32)
    x[0, rng.integers(d)] = 3e4
    if m >= 3:
        x[m // 2] = 0.0
        x[1] *= 1e-15  # squares stay normal floats (no flush-to-zero question)
        x[-1] = 0.0
        x[-1, -1] = -7.0
    return np.asarray(jnp.asarray(x).astype(dtype))


def norm_family(x, res, gamma):
    """(name, fn, args) for every op of the family: plain y, codes, residual sum + codes."""
    return (
        ("rmsnorm", ops.rmsnorm, (x, gamma)),
        ("rmsnorm_quant", ops.rmsnorm_quant, (x, gamma)),
        ("add_rmsnorm_quant", ops.add_rmsnorm_quant, (x, res, gamma)),
        ("add_rmsnorm", ops.add_rmsnorm, (x, res, gamma)),
    )


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", LONG_M)
@pytest.mark.parametrize("d", LONG_D)
def test_register_kernel_matches_block_kernel_and_cpu_bitwise(gpu, rng, monkeypatch, dtype, m, d):
    """Rows of 256 < D <= 5376 run a register kernel (warps per row by M and D); forcing the
    old one-block-per-row kernel (PRISM_RMSNORM_KERNEL=block) and the CPU must give the same
    bits."""
    x, res = hard_rows(rng, m, d, dtype), hard_rows(rng, m, d, dtype)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    for name, fn, args in norm_family(x, res, gamma):
        outs = []
        for forced in ("", "block"):
            monkeypatch.setenv("PRISM_RMSNORM_KERNEL", forced)
            outs.append(run_on(gpu, fn, *args, eps=1e-6, weight_offset=1.0))
        monkeypatch.delenv("PRISM_RMSNORM_KERNEL")
        ref = run_on(cpu, fn, *args, eps=1e-6, weight_offset=1.0)
        for new, old, want in zip(*map(jax.tree.leaves, (outs[0], outs[1], ref)), strict=True):
            assert_bitwise_equal(new, old, f"{name}: register vs block kernel")
            assert_bitwise_equal(new, want, f"{name}: CUDA vs CPU")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [5376, 4101])
def test_register_kernel_many_rows_llama_style(gpu, rng, dtype, d):
    """Many rows, Llama's eps and offset 0, CUDA vs CPU bitwise."""
    m = 1000
    x, res = hard_rows(rng, m, d, dtype), hard_rows(rng, m, d, dtype)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    cpu = jax.devices("cpu")[0]
    for name, fn, args in norm_family(x, res, gamma):
        out = run_on(gpu, fn, *args, eps=1e-5, weight_offset=0.0)
        ref = run_on(cpu, fn, *args, eps=1e-5, weight_offset=0.0)
        for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(ref), strict=True):
            assert_bitwise_equal(a, b, f"{name}: CUDA vs CPU")


# Register kernels by warps per row (reg1: NormRegRowsKernel; reg2/4/8: NormSplitRowsKernel,
# the lanes' partials chained warp to warp; lean2/4/8: its lean form, gamma read after the
# reduction), the block kernel and the launcher's own choice.
KERNELS = ("", "reg1", "reg2", "reg4", "reg8", "lean2", "lean4", "lean8", "block")
SPLIT_D = [128, 1000, 1152, 4101, 5376, 777]  # 1000: whole chunks, partial stride; 777, 4101: odd
SPLIT_M = [1, 3, 64, 256, 600, 1100]  # 1100: the launcher's own choice is the lean form


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", SPLIT_M)
@pytest.mark.parametrize("d", SPLIT_D)
def test_split_register_kernels_match_one_warp_block_and_cpu_bitwise(
    gpu, rng, monkeypatch, dtype, m, d
):
    """Every register kernel (1, 2, 4, 8 warps per row), the block kernel and the CPU give the
    same bits for all three ops (with and without a residual)."""
    x, res = hard_rows(rng, m, d, dtype), hard_rows(rng, m, d, dtype)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    style = STYLES[(m + d) % 2]  # both Gemma's offset 1 and Llama's offset 0 across the grid
    cpu = jax.devices("cpu")[0]
    for name, fn, args in norm_family(x, res, gamma):
        want = jax.tree.leaves(run_on(cpu, fn, *args, **style))
        for kernel in KERNELS:
            monkeypatch.setenv("PRISM_RMSNORM_KERNEL", kernel)
            got = jax.tree.leaves(run_on(gpu, fn, *args, **style))
            for i, (a, b) in enumerate(zip(got, want, strict=True)):
                assert_bitwise_equal(a, b, f"{name} output {i}: kernel {kernel!r} vs CPU")
        monkeypatch.delenv("PRISM_RMSNORM_KERNEL")


def test_unknown_kernel_name_is_an_error(gpu, rng, monkeypatch):
    """A misspelt PRISM_RMSNORM_KERNEL must fail, not silently test the default kernel."""
    x = activations(rng, (4, 5376), jnp.float32)
    gamma = rng.normal(0, 0.5, 5376).astype(np.float32)
    monkeypatch.setenv("PRISM_RMSNORM_KERNEL", "reg3")
    with pytest.raises(Exception, match="PRISM_RMSNORM_KERNEL"):
        run_on(gpu, ops.rmsnorm, x, gamma, eps=1e-6)


def lane_partials(sq: np.ndarray, chunks: range, start: np.ndarray | None = None) -> np.ndarray:
    """Each lane's sequential float32 sum over its canonical chunks `chunks` of sq [M, D],
    starting from `start` [M, 32] (zeros by default) -> [M, 32]."""
    m, d = sq.shape
    acc = np.zeros((m, 32), np.float32) if start is None else start.copy()
    for c in chunks:
        for i in range(8):
            idx = np.arange(32) * 8 + c * 256 + i
            present = idx < d
            acc[:, present] = acc[:, present] + sq[:, idx[present]]
    return acc


def butterfly(acc: np.ndarray) -> np.ndarray:
    off = 16
    while off:
        acc = acc[:, :off] + acc[:, off : 2 * off]
        off //= 2
    return acc[:, 0]


def test_split_sum_order_is_observable(rng):
    """Why the split kernel chains partials: at D = 5376, summing each warp's chunks on its own
    and adding the warps' partials changes the bits of some rows' sums, which the bitwise tests
    above would catch; the chained order reproduces the canonical sum."""
    m, d, warps = 64, 5376, 4
    x = hard_rows(rng, m, d, jnp.float32)
    sq = x * x
    chunks = -(-d // 256)
    bounds = [w * chunks // warps for w in range(warps + 1)]
    canonical = np.asarray(canonical_sum(jnp.asarray(sq)))
    chained = None
    for w in range(warps):
        chained = lane_partials(sq, range(bounds[w], bounds[w + 1]), chained)
    assert_bitwise_equal(butterfly(chained), canonical, "chained partials vs canonical_sum")
    apart = sum(lane_partials(sq, range(bounds[w], bounds[w + 1])) for w in range(warps))
    assert (butterfly(apart) != canonical).any(), "split sums should differ somewhere"
