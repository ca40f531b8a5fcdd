"""int8_gemm against an int64 reference (exact) and the pure-jnp reference (bitwise)."""

import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.int8_gemm import workspace_bytes
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.invariance import check_row_invariance

# (M, K, N): M = 1, sizes that are no multiple of any tile, one 27B-like K.
SHAPES = [(1, 1, 1), (1, 37, 11), (3, 64, 130), (17, 129, 65), (64, 1000, 96), (5, 5376, 40)]


def random_int8(rng, shape, extreme=False):
    if extreme:  # the largest magnitudes the contract allows, with both signs
        return rng.choice(np.array([-127, 127], np.int8), size=shape)
    return rng.integers(-127, 128, size=shape, dtype=np.int8)


def epilogue(acc: np.ndarray, s_x: np.ndarray, s_w: np.ndarray) -> np.ndarray:
    """(float32(acc) * s_x[m]) * s_w[n] in float32, the contract's order."""
    return (acc.astype(np.float32) * s_x[:, None]).astype(np.float32) * s_w[None, :]


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("extreme", [False, True])
def test_integer_part_is_exact(device, rng, m, k, n, extreme):
    x, w = random_int8(rng, (m, k), extreme), random_int8(rng, (n, k), extreme)
    ones_m, ones_n = np.ones(m, np.float32), np.ones(n, np.float32)
    y = run_on(device, ops.int8_gemm, x, ones_m, w, ones_n)
    acc64 = x.astype(np.int64) @ w.astype(np.int64).T
    # With unit scales y is float32(acc); int32 -> float32 rounding equals int64 -> float32's.
    assert_bitwise_equal(y, acc64.astype(np.float32), "int8_gemm integer part")


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_matches_reference_bitwise(device, rng, m, k, n, out_dtype):
    x, w = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    y = run_on(device, ops.int8_gemm, x, s_x, w, s_w, out_dtype=out_dtype)
    ref = run_on(device, ops.int8_gemm, x, s_x, w, s_w, out_dtype=out_dtype, impl="reference")
    assert y.dtype == np.dtype(out_dtype)
    assert_bitwise_equal(y, ref, "int8_gemm vs reference")
    expected = epilogue(x.astype(np.int64) @ w.astype(np.int64).T, s_x, s_w)
    assert_bitwise_equal(y, np.asarray(jnp.asarray(expected).astype(out_dtype)), "vs numpy")


def test_zero_rows_and_leading_dims(device, rng):
    x = random_int8(rng, (2, 3, 70))
    x[1, 2] = 0
    w = random_int8(rng, (33, 70))
    s_x, s_w = np.full((2, 3), 0.5, np.float32), np.full(33, 0.25, np.float32)
    y = run_on(device, ops.int8_gemm, x, s_x, w, s_w)
    assert y.shape == (2, 3, 33)
    assert not np.any(y[1, 2]), "an all-zero row must give exact zeros"


@pytest.mark.parametrize(
    "r,rows,k,n", [(6, 3, 64, 130), (64, 32, 5376, 40), (9, 9, 37, 11), (4, 0, 16, 8)]
)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_leading_rows_match_the_slice(device, rng, r, rows, k, n, out_dtype):
    """rows= (the two-digit model's x1 read from the stacked digits) gives the bits of the GEMM
    of the sliced rows, whatever the other rows hold."""
    x, w = random_int8(rng, (r, k)), random_int8(rng, (n, k))
    s_x = rng.uniform(1e-4, 1e-1, r).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    y = run_on(device, ops.int8_gemm, x, s_x, w, s_w, out_dtype=out_dtype, rows=rows)
    want = run_on(device, ops.int8_gemm, x[:rows], s_x[:rows], w, s_w, out_dtype=out_dtype)
    assert y.shape == (rows, n)
    assert_bitwise_equal(y, want, "int8_gemm rows= vs the sliced rows")
    expected = epilogue(x[:rows].astype(np.int64) @ w.astype(np.int64).T, s_x[:rows], s_w)
    expected = np.asarray(jnp.asarray(expected).astype(out_dtype))
    assert_bitwise_equal(y, expected, "int8_gemm rows= vs numpy")
    # The jnp reference's rows= on the CPU only: on the H200 the reference (XLA's own int8 dot)
    # differed from numpy in all 99 elements at (9, 37, 11), the first 130 against 65.
    if device.platform == "cpu":
        ref = run_on(
            device, ops.int8_gemm, x, s_x, w, s_w, out_dtype=out_dtype, rows=rows, impl="reference"
        )
        assert_bitwise_equal(ref, expected, "int8_gemm reference rows= vs numpy")


@pytest.mark.gpu
@pytest.mark.parametrize(
    "m,k,n",
    [
        (9, 64, 16400),
        (16, 8208, 136),
        (12, 8192, 16384),
        (14, 1040, 520),
        (15, 528, 8200),
        (31, 2064, 16392),
        (32, 8208, 264),
    ],
)
def test_dispatch_streams_small_m_exactly(gpu, rng, m, k, n):
    """The dispatch at 8 < M <= 32 around its TMA buckets (N >= 16384 and K >= 8192 up to
    M = 32, the rest at M <= 16, with the rule's stages or twelve), unforced."""
    x, w = random_int8(rng, (m, k), extreme=True), random_int8(rng, (n, k), extreme=True)
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    expected = epilogue(x.astype(np.int64) @ w.astype(np.int64).T, s_x, s_w)
    assert_bitwise_equal(run_on(gpu, ops.int8_gemm, x, s_x, w, s_w), expected, f"{(m, k, n)}")


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["tma64", "tma128k2", "tmawg128", "tmawg64k2", "decode32k2"])
def test_leading_rows_with_streaming_kernels(gpu, rng, monkeypatch, kernel):
    """The streaming kernels read x through its first M rows only (the TMA's tensor map has M
    rows, so a box past them is zeros, not the second digit's rows)."""
    monkeypatch.setenv("PRISM_INT8_GEMM_KERNEL", kernel)
    r, rows, k, n = 64, 27, 2064, 200
    x, w = random_int8(rng, (r, k), extreme=True), random_int8(rng, (n, k), extreme=True)
    s_x = rng.uniform(1e-4, 1e-1, r).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    y = run_on(gpu, ops.int8_gemm, x, s_x, w, s_w, rows=rows)
    expected = epilogue(x[:rows].astype(np.int64) @ w.astype(np.int64).T, s_x[:rows], s_w)
    assert_bitwise_equal(y, expected, f"{kernel}: rows= vs numpy")


@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_row_invariance(device, rng, out_dtype):
    k, n = 300, 77
    w = random_int8(rng, (n, k))
    s_w = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    row = (random_int8(rng, (k,)), np.float32(rng.uniform(1e-3, 1e-2)))

    def others(count):
        return random_int8(rng, (count, k)), rng.uniform(1e-3, 1e-2, count).astype(np.float32)

    def gemm(x, s_x, w, s_w):
        return ops.int8_gemm(x, s_x, w, s_w, out_dtype=out_dtype)

    check_row_invariance(device, gemm, [row[0], np.asarray(row[1])], others, [w, s_w])


def test_cuda_matches_cpu(gpu, rng):
    m, k, n = 40, 517, 300
    x, w = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    s_x, s_w = rng.random(m).astype(np.float32), rng.random(n).astype(np.float32)
    import jax

    cpu = run_on(jax.devices("cpu")[0], ops.int8_gemm, x, s_x, w, s_w)
    assert_bitwise_equal(run_on(gpu, ops.int8_gemm, x, s_x, w, s_w), cpu, "CUDA vs CPU")


# Every CUDA kernel of the dispatch, forced by name (PRISM_INT8_GEMM_KERNEL), on shapes that meet
# its alignment (K % 16 == 0, N * 4 % 16 == 0) but are no multiple of its tiles. A kernel that
# does not apply (decode at M > 64, a bf16 tile not built) falls back, which must be exact too.
CUDA_KERNELS = [
    "simt",
    "decode16",
    "decode32",
    "decode64",
    # clusters of 2-8 blocks splitting K (FORCED_SHAPES' K = 272 has 5 chunks: with 8 blocks,
    # three sum nothing; K = 1040 ends inside a chunk)
    "decode16k2",
    "decode16k8",
    "decode32k2",
    "decode32k4",
    "decode32k8",
    # the TMA-fed streaming kernel (M <= 64): blocks of 64 or 128 weight rows, clusters of 2 or 4
    # (K = 272 has 3 chunks of 128 bytes: with 4 blocks, one sums nothing)
    "tma64",
    "tma128",
    "tma64k2",
    "tma128k2",
    "tma64k4",
    "tma128k4",
    # the same with wgmma consumers (float32 output; bf16 falls back to the CUTLASS tile)
    "tmawg64",
    "tmawg128",
    "tmawg64k2",
    "tmawg128k2",
    "tmawg128k4",
    # a forced ring of two stages (the fewest; every stage reused many times) and of eight
    "tmawg128s2",
    "tma64s2",
    "tmawg64k2s8",
    "tmawg64s24",  # more stages than the launch rule's cap (clamped to the shared memory)
    "sm90_coop_128x256x128_c2x1",
    "sm90_ping_64x256x128_c2x1",
    "sm90_coop_128x128x128_c2x1",
    "sm90_swap_ping_128x64x128_c2x1",
    "sm90_streamk_128x128x128_c2x1",
    "sm90_streamk_128x256x128_c2x1",
    "sm90_coop_128x192x128_c2x1",
    "sm90_swap_ping_64x32x128_c2x1",
    "sm90_swap_ping_64x64x128_c2x1",
]
FORCED_SHAPES = [(1, 272, 200), (13, 1040, 136), (27, 2064, 72), (64, 5376, 264), (300, 528, 392)]


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", CUDA_KERNELS)
@pytest.mark.parametrize("m,k,n", FORCED_SHAPES)
@pytest.mark.parametrize("out_dtype", [jnp.float32, jnp.bfloat16])
def test_each_cuda_kernel_exact(gpu, rng, monkeypatch, kernel, m, k, n, out_dtype):
    monkeypatch.setenv("PRISM_INT8_GEMM_KERNEL", kernel)
    x, w = random_int8(rng, (m, k), extreme=True), random_int8(rng, (n, k), extreme=True)
    ones_m, ones_n = np.ones(m, np.float32), np.ones(n, np.float32)
    acc64 = x.astype(np.int64) @ w.astype(np.int64).T
    y = run_on(gpu, ops.int8_gemm, x, ones_m, w, ones_n)
    assert_bitwise_equal(y, acc64.astype(np.float32), f"{kernel}: integer part")
    x, w = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    y = run_on(gpu, ops.int8_gemm, x, s_x, w, s_w, out_dtype=out_dtype)
    expected = epilogue(x.astype(np.int64) @ w.astype(np.int64).T, s_x, s_w)
    assert_bitwise_equal(y, np.asarray(jnp.asarray(expected).astype(out_dtype)), kernel)


# The persistent schedulers' tile order (PRISM_INT8_GEMM_RASTER / _SWIZZLE, benchmarks only)
# decides which tiles share the L2, never a result: each order gives the dispatch's bits.
@pytest.mark.gpu
@pytest.mark.parametrize(
    "kernel",
    ["sm90_coop_128x256x128_c2x1", "sm90_streamk_128x256x128_c2x1", "sm90_coop_128x192x128_c2x1"],
)
@pytest.mark.parametrize("raster,swizzle", [("m", "1"), ("n", "2"), ("m", "8")])
def test_tile_order_keeps_bits(gpu, rng, monkeypatch, kernel, raster, swizzle):
    m, k, n = 600, 1040, 2064
    x, w = random_int8(rng, (m, k)), random_int8(rng, (n, k))
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    expected = epilogue(x.astype(np.int64) @ w.astype(np.int64).T, s_x, s_w)
    monkeypatch.setenv("PRISM_INT8_GEMM_KERNEL", kernel)
    monkeypatch.setenv("PRISM_INT8_GEMM_RASTER", raster)
    monkeypatch.setenv("PRISM_INT8_GEMM_SWIZZLE", swizzle)
    y = run_on(gpu, ops.int8_gemm, x, s_x, w, s_w)
    assert_bitwise_equal(y, expected, f"{kernel} raster {raster} swizzle {swizzle}")


# Shapes where the stream-K tiles really split K across CTAs (fewer output tiles than SMs, many
# k-tiles each; K no multiple of 128, so a peer's share can end on the ragged last k-tile).
# Each with CUTLASS's heuristic ("") and forced decompositions (PRISM_INT8_GEMM_DECOMP):
# stream-K, split-K into 3 or 2 shares.
STREAMK_KERNELS = [
    ("sm90_streamk_128x128x128_c2x1", ""),
    ("sm90_streamk_128x128x128_c2x1", "s"),
    ("sm90_streamk_128x128x128_c2x1", "k3"),
    ("sm90_streamk_128x256x128_c2x1", ""),
    ("sm90_streamk_128x256x128_c2x1", "s"),
    ("sm90_streamk_128x256x128_c2x1", "k2"),
]
STREAMK_SHAPES = [(256, 4112, 392), (130, 21504, 264), (40, 5392, 1032)]


@pytest.mark.gpu
@pytest.mark.parametrize("barrier", ["", "memset"])  # PRISM_INT8_GEMM_BARRIER: who zeroes flags
@pytest.mark.parametrize("kernel,decomposition", STREAMK_KERNELS)
@pytest.mark.parametrize("m,k,n", STREAMK_SHAPES)
def test_stream_k_partial_sums_exact(
    gpu, rng, monkeypatch, kernel, decomposition, m, k, n, barrier
):
    monkeypatch.setenv("PRISM_INT8_GEMM_KERNEL", kernel)
    monkeypatch.setenv("PRISM_INT8_GEMM_DECOMP", decomposition)
    monkeypatch.setenv("PRISM_INT8_GEMM_BARRIER", barrier)
    kernel += f"+{decomposition}" if decomposition else ""
    kernel += f", barrier flags by {barrier}" if barrier else ""
    needed = workspace_bytes(m, k, n, jnp.float32)
    assert needed > 1, f"{kernel} at {(m, k, n)} wants no workspace: stream-K would not split"
    x, w = random_int8(rng, (m, k), extreme=True), random_int8(rng, (n, k), extreme=True)
    acc64 = x.astype(np.int64) @ w.astype(np.int64).T
    y = run_on(gpu, ops.int8_gemm, x, np.ones(m, np.float32), w, np.ones(n, np.float32))
    assert_bitwise_equal(y, acc64.astype(np.float32), f"{kernel}: integer part")
    s_x = rng.uniform(1e-4, 1e-1, m).astype(np.float32)
    s_w = rng.uniform(1e-4, 1e-1, n).astype(np.float32)
    y = run_on(gpu, ops.int8_gemm, x, s_x, w, s_w)
    assert_bitwise_equal(y, epilogue(acc64, s_x, s_w), f"{kernel}: epilogue")


@pytest.mark.gpu
def test_row_invariance_across_kernels(gpu, rng):
    """K % 16 == 0: the row alone runs the decode kernel, among 300 rows a CUTLASS one."""
    k, n = 320, 200
    w = random_int8(rng, (n, k))
    s_w = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
    row = (random_int8(rng, (k,)), np.float32(rng.uniform(1e-3, 1e-2)))

    def others(count):
        return random_int8(rng, (count, k)), rng.uniform(1e-3, 1e-2, count).astype(np.float32)

    check_row_invariance(gpu, ops.int8_gemm, [row[0], np.asarray(row[1])], others, [w, s_w])
