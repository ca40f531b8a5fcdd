"""tree_attention's CUDA kernels against each other, bit for bit (PRISM_TREE_ATTENTION_KERNEL
forces one): the lanes, block and warp kernels on forests, windows, GQA groups, bf16/f32 pools
and a long state with a prefix-cache hit. GPU only; benchmarks/gpu_suite.sh runs them."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from tests.ops.tree_attention_world import (
    Pool,
    assert_same_kernels,
    forced_runs,
    forest_runs,
    forest_tokens,
    long_state_runs,
    make_world,
    run_step,
)


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
def test_lane_kernel_matches_warp_kernel_bitwise(gpu, rng, monkeypatch, h, dtype, window):
    """H in {64, 128, 256} has the one-key-per-lane kernel; forcing it and the warp kernel
    (PRISM_TREE_ATTENTION_KERNEL=lanes|warp) must give the same bits: same dots, same expf."""
    world = make_world(rng, 200, 8, 2, h, dtype)
    seed = int(rng.integers(1 << 31))
    kernels = ("warp", "lanes", "")  # "": the default choice

    def step(pool):
        tokens = forest_tokens(np.random.default_rng(seed), pool, lambda b, n: world)
        return run_step(gpu, pool, tokens, window=window, pad_to=len(tokens) + 7)

    results = forced_runs(
        gpu, monkeypatch, kernels, lambda: Pool(np.random.default_rng(seed), 2, h, dtype), [step]
    )
    assert_same_kernels(results, kernels, f"H={h}")


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("nh", [2, 4, 8])  # G = 1, 2, 4 with K = 2
@pytest.mark.parametrize(
    "dtype,q_dtype", [(jnp.float32,) * 2, (jnp.bfloat16,) * 2, (jnp.bfloat16, jnp.float32)]
)
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("order", ["shuffled", "sorted"])
def test_block_kernel_matches_warp_kernel_bitwise(
    gpu, rng, monkeypatch, h, nh, dtype, q_dtype, window, order
):
    """The block kernel (K/V tiles shared by a block's tokens and GQA heads) must give the warp
    kernel's bits: forests whose chains interleave (shuffled) or change inside a query tile
    (sorted), T not a multiple of the query tile, padding tokens, windows, bf16/f32 pools."""
    kernels = ("warp", "block", "lanes")
    results = forest_runs(gpu, rng, monkeypatch, kernels, h, nh, dtype, q_dtype, window, order)
    assert_same_kernels(results, kernels, f"H={h} G={nh // 2} {order}")


@pytest.mark.parametrize("h", [128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 1000])
def test_block_kernel_long_state_bitwise(gpu, rng, monkeypatch, h, dtype, window):
    """A ~2.5K-key state prefilled in one step, then a 40-token chunk after it (a prefix-cache
    hit): block kernel == warp kernel bit for bit, pools included."""
    kernels = ("warp", "block")
    results = long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, 40, 40 + 9)
    assert_same_kernels(results, kernels, f"H={h}")
