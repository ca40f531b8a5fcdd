"""tree_attention_digits: the kernels against the pure-jnp reference and a float64 dense
attention, CUDA against the CPU BITWISE (the digits arithmetic is the same function on both),
and BITWISE invariance of a query's output to everything but its own keys: the rest of the
step, the pages, the segment split, prefix caching and padding.

Pools are int8 packed digit rows and start filled with random bytes (NaN and inf scales
among them), so a kernel that lets an absent or masked key reach a visible output fails.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.tree_attention_digits import (
    KERNEL_ENV,
    SLOTS_ENV,
    digits_split_workspace_floats,
    pack_digit_rows,
    packed_row_bytes,
    unpack_digit_rows,
)
from tests.conftest import assert_bitwise_equal
from tests.ops.tree_attention_world import (
    L,
    P,
    Pool,
    World,
    forest_tokens,
    make_world,
    run_step,
    split_chain,
    tokens_among_others,
)

OP = ops.tree_attention_digits


class DigitPool(Pool):
    """test_tree_attention.Pool with packed digit pools of random garbage bytes."""

    def __init__(self, rng, kh, h, dtype, taken=0, pages=P):
        super().__init__(rng, kh, h, dtype, taken, pages)
        shape = (pages, L, kh, packed_row_bytes(h))
        self.k = rng.integers(-128, 128, shape).astype(np.int8)
        self.v = rng.integers(-128, 128, shape).astype(np.int8)


# (N, K, H): MHA, GQA 2 (the 27B's), Gemma 3 270M (G = 4, H = 256), SmolLM2 (G = 3), Qwen (G = 7)
CONFIGS = [(4, 4, 64), (8, 4, 128), (4, 1, 256), (9, 3, 64), (14, 2, 64)]


def step(device, pool, tokens, **kw):
    return run_step(device, pool, tokens, op=OP, **kw)


def forest(rng, nh, kh, h, dtype, seed=1):
    shared = make_world(rng, 256, nh, kh, h, dtype, q_dtype=dtype)

    def world_of(b, n):  # branch 0 writes the shared root and trunk too
        if b == 0:
            return World(shared.q[:n], shared.k[:n], shared.v[:n])
        return make_world(rng, n, nh, kh, h, dtype, q_dtype=dtype)

    pool = DigitPool(np.random.default_rng(seed), kh, h, dtype)
    return pool, forest_tokens(rng, pool, world_of)


@pytest.mark.parametrize("nh,kh,h", CONFIGS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
def test_matches_reference(device, rng, nh, kh, h, dtype, window):
    pool, tokens = forest(rng, nh, kh, h, dtype)
    ref_pool = DigitPool(np.random.default_rng(1), kh, h, dtype)
    ref_pool.free = list(pool.free)
    out = np.float32(step(device, pool, tokens, window=window, pad_to=len(tokens) + 5))
    ref = np.float32(step(jax.devices("cpu")[0], ref_pool, tokens, window=window, impl="reference"))
    # The reference has the kernels' scores; the weights' fixed point (~2^-24 of the tile's
    # largest), DigitExp (< 2e-7) and the float sums' order remain. bf16 outputs round to 2^-9.
    atol, rtol = (2e-5, 1e-4) if dtype == jnp.float32 else (1e-2, 1e-2)
    np.testing.assert_allclose(out, ref, atol=atol, rtol=rtol)
    # Pages 1.. hold the real tokens' k/v (padding writes only page 0, the dummy page).
    np.testing.assert_array_equal(pool.k[1:], ref_pool.k[1:], "packed k rows")
    np.testing.assert_array_equal(pool.v[1:], ref_pool.v[1:], "packed v rows")


def test_dense_causal_float64(device, rng):
    """Against plain float64 attention: the digits' own error is that of ~15-bit rows."""
    nh, kh, h, n = 8, 4, 128, 200
    w = make_world(rng, n, nh, kh, h, jnp.float32, q_dtype=jnp.float32)
    pool = DigitPool(rng, kh, h, jnp.float32)
    chain = [pool.segment(0, n)]
    out = step(device, pool, [(chain, w, p) for p in range(n)])
    q, k, v = (np.float64(x) for x in (w.q, w.k, w.v))
    g = nh // kh
    s = np.einsum("tnh,snh->nts", q, np.repeat(k, g, axis=1)) * 0.125
    s = np.where(np.tril(np.ones((n, n), bool))[None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    ref = np.einsum("nts,snh->tnh", p, np.repeat(v, g, axis=1))
    # Over 12 seeds the largest error was 2.0e-4 to 3.4e-4 (3e-4 failed once): 6e-4 leaves room
    # and still fails a bf16 attention (~4e-3 here) or a wrong tile merge.
    np.testing.assert_allclose(out, ref, atol=6e-4)


@pytest.mark.parametrize("nh,kh,h", [(8, 4, 128), (4, 1, 256), (9, 3, 64), (14, 2, 64)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
def test_cuda_matches_cpu_bitwise(gpu, rng, nh, kh, h, dtype, window):
    """Integer dots, exact maxima and per-element float operations: the same bits on both."""
    pool, tokens = forest(rng, nh, kh, h, dtype, seed=5)
    cpu_pool = DigitPool(np.random.default_rng(5), kh, h, dtype)
    cpu_pool.free = list(pool.free)
    out_gpu = step(gpu, pool, tokens, window=window, pad_to=len(tokens) + 9)
    out_cpu = step(jax.devices("cpu")[0], cpu_pool, tokens, window=window)
    assert_bitwise_equal(out_gpu, out_cpu, "CUDA vs CPU")


def test_cuda_matches_cpu_on_a_long_state(gpu, rng):
    """A 1,500-position chain over many tiles and chunks, a sliding window and decode rows."""
    nh, kh, h, n = 8, 4, 128, 1500
    w = make_world(rng, n, nh, kh, h, jnp.float32, q_dtype=jnp.float32)
    outs = []
    for dev in (gpu, jax.devices("cpu")[0]):
        pool = DigitPool(np.random.default_rng(7), kh, h, jnp.float32, pages=128)
        chain = [pool.segment(0, n)]
        out = [step(dev, pool, [(chain, w, p) for p in range(a, min(n, a + 512))], window=1000)
               for a in range(0, n, 512)]  # fmt: skip
        outs.append(np.concatenate(out))
    assert_bitwise_equal(outs[0], outs[1], "CUDA vs CPU, long state")


# (forced kernel, a round's tile slots): fused; the split in one round, in rounds of 1 and 3.
KERNEL_RUNS = [("fused", None), ("split", None), ("split", "1"), ("split", "3")]


@pytest.mark.parametrize("window", [0, 37])
def test_split_and_fused_kernels_match_cpu_bitwise(gpu, rng, monkeypatch, window):
    """The split over key tiles, in one round or many, and the fused kernel: the CPU's bits."""
    nh, kh, h = 8, 4, 128
    pool, tokens = forest(rng, nh, kh, h, jnp.float32, seed=9)
    free = list(pool.free)

    def fresh():
        fresh_pool = DigitPool(np.random.default_rng(9), kh, h, jnp.float32)
        fresh_pool.free = list(free)
        return fresh_pool

    ref = step(jax.devices("cpu")[0], fresh(), tokens, window=window, pad_to=len(tokens) + 3)
    for kernel, slots in KERNEL_RUNS:
        monkeypatch.setenv(KERNEL_ENV, kernel)
        if slots is None:
            monkeypatch.delenv(SLOTS_ENV, raising=False)
        else:
            monkeypatch.setenv(SLOTS_ENV, slots)
        out = step(gpu, fresh(), tokens, window=window, pad_to=len(tokens) + 3)
        assert_bitwise_equal(out, ref, f"CUDA {kernel} (slots {slots}) vs CPU")


@pytest.mark.parametrize("window", [0, 37])
def test_split_fallback_for_rows_past_the_pool(gpu, rng, window):
    """A hand-made chain repeating its pages sees more tiles than the pool holds, which the
    split's rounds cannot cover: those blocks take the fused fallback, with the CPU's bits."""
    nh, kh, h, n = 8, 4, 128, 128
    w = make_world(rng, n, nh, kh, h, jnp.float32, q_dtype=jnp.float32)
    outs = []
    for dev in (gpu, jax.devices("cpu")[0]):
        pool = DigitPool(np.random.default_rng(3), kh, h, jnp.float32, pages=3)
        chain = [(0, n, [1, 2] * 4)]  # 128 positions on 32 pool rows: 2 tiles, pool 1
        tokens = [(chain, w, p) for p in range(96, n)]  # write every row the chain reads
        outs.append(step(dev, pool, tokens, window=window, pad_to=40))
    assert_bitwise_equal(outs[0], outs[1], "CUDA fallback vs CPU")


def test_split_workspace_size(monkeypatch):
    """State + one record per (token, head) and pool tile; capped rounds; none for big steps."""
    monkeypatch.delenv(KERNEL_ENV, raising=False)
    monkeypatch.delenv(SLOTS_ENV, raising=False)
    record, queries = 64 * 32 * (128 + 4), 64 * 32 * 272 // 4
    assert digits_split_workspace_floats((64, 32, 128), (320, 16, 16, 272)) == record * 81 + queries
    monkeypatch.setenv(SLOTS_ENV, "3")
    assert digits_split_workspace_floats((64, 32, 128), (320, 16, 16, 272)) == record * 4 + queries
    assert digits_split_workspace_floats((2048, 32, 128), (320, 16, 16, 272)) == 1
    monkeypatch.setenv(KERNEL_ENV, "fused")
    assert digits_split_workspace_floats((64, 32, 128), (320, 16, 16, 272)) == 1


INV = dict(nh=8, kh=4, h=64, n=150)


def inv_world(rng):
    return make_world(rng, INV["n"], INV["nh"], INV["kh"], INV["h"], jnp.float32, jnp.float32)


def inv_pool(rng, **kw):
    return DigitPool(rng, INV["kh"], INV["h"], jnp.float32, **kw)


def base_outputs(device, w, window):
    pool = inv_pool(np.random.default_rng(3))
    chain = [pool.segment(0, INV["n"])]
    return step(device, pool, [(chain, w, p) for p in range(INV["n"])], window=window)


@pytest.mark.parametrize("n_others", [7, 100])
@pytest.mark.parametrize("window", [0, 45])
def test_invariant_to_other_queries(device, rng, n_others, window):
    """Siblings sharing a root and unrelated chains, tokens interleaved at random: a block of
    the CUDA kernel then holds rows of several chains (one pass each)."""
    w = inv_world(rng)
    base = base_outputs(device, w, window)
    pool = inv_pool(rng, pages=P + n_others)  # the own chain's 10 pages + one an other token
    tokens = tokens_among_others(rng, pool, w, INV["n"], n_others, lambda n: make_world(
        rng, n, INV["nh"], INV["kh"], INV["h"], jnp.float32))  # fmt: skip
    order = rng.permutation(len(tokens))
    out = step(device, pool, [tokens[i] for i in order], window=window)
    where = np.argsort(order)[: INV["n"]]
    assert_bitwise_equal(out[where], base, f"alone vs among {len(tokens) - INV['n']} others")


@pytest.mark.parametrize("own_segment", [False, True])
@pytest.mark.parametrize("window", [0, 45])
def test_invariant_to_prefix_cache_and_pages(device, rng, own_segment, window):
    """Prefix written in an earlier call, then the rest, then one decode token, on other pages;
    own_segment: the cached prefix is its own segment (a prefix-cache hit)."""
    w, n = inv_world(rng), INV["n"]
    base = base_outputs(device, w, window)
    pool = inv_pool(rng, taken=int(rng.integers(1, 30)))
    m = int(rng.integers(1, n - 2))
    if own_segment:
        first = [pool.segment(0, m)]
        chains = (first, first + [pool.segment(m, n - m)])
    else:
        chains = ([pool.segment(0, n)],) * 2
    out1 = step(device, pool, [(chains[0], w, p) for p in range(m)], window=window)
    out2 = step(device, pool, [(chains[1], w, p) for p in range(m, n - 1)], window=window,
                pad_to=n)  # fmt: skip
    out3 = step(device, pool, [(chains[1], w, n - 1)], window=window)
    assert_bitwise_equal(np.concatenate([out1, out2, out3]), base, f"cached prefix of {m}")


def test_invariant_to_segment_split_and_padding(device, rng):
    """The chain cut at arbitrary boundaries, in a padded step with padded tables."""
    w = inv_world(rng)
    base = base_outputs(device, w, 45)
    pool = inv_pool(rng)
    chain = split_chain(rng, pool, INV["n"], int(rng.integers(2, 6)))
    out = step(device, pool, [(chain, w, p) for p in range(INV["n"])], window=45, pad_to=300,
               pad_chains=3, pad_segments=2, pad_pages=40)  # fmt: skip
    assert_bitwise_equal(out, base, f"split at {[s[0] for s in chain]}, padded")


def test_rejects_float_pools_mixed_dtypes_and_bad_heads():
    q = jnp.zeros((2, 2, 64), jnp.float32)
    tables = (jnp.zeros(2, jnp.int32),) * 3 + (jnp.zeros((1, 1, 3), jnp.int32),)
    flat = jnp.zeros(1, jnp.int32)
    pages = jnp.zeros((2, 16, 2, packed_row_bytes(64)), jnp.int8)
    float_pages = jnp.zeros((2, 16, 2, 64), jnp.float32)
    with pytest.raises(ValueError, match="packed digit rows"):
        OP(q, q, q, float_pages, float_pages, *tables, flat, scale=1.0)
    bf = q.astype(jnp.bfloat16)
    with pytest.raises(ValueError, match="k_new must be float32"):
        OP(q, bf, bf, pages, pages, *tables, flat, scale=1.0)
    odd = jnp.zeros((2, 2, 60), jnp.float32)
    with pytest.raises(ValueError, match="multiple of 8"):
        OP(odd, odd, odd, pages, pages, *tables, flat, scale=1.0)


def test_packed_rows_round_trip(rng):
    x = rng.normal(0, 3, (5, 3, 128)).astype(np.float32)
    a, b = unpack_digit_rows(pack_digit_rows(jnp.asarray(x)))
    err = np.abs(np.asarray(a + b) - x) / np.abs(x).max(axis=-1, keepdims=True)
    assert err.max() <= 1 / (127 * 254), "two digits hold a row to ~1 / (127 * 254) of its max"
