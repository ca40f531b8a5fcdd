"""tree_attention: kernel vs the pure-jnp reference and a float64 dense attention, written pools
bitwise, and BITWISE invariance of a query's output to everything but its own keys: the rest of
the step, the pages, the segment split, prefix caching (earlier call) and padding.

Pools start filled with NaN, so a kernel that reads an absent or masked key fails every test.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on

P, L = 96, 16  # pool pages (page 0 = dummy), page size
CONFIGS = [(4, 4, 64), (8, 2, 80), (4, 1, 256)]  # (N, K, H): MHA, GQA with partial lanes, Gemma


@dataclasses.dataclass
class World:
    """Fixed q/k/v per absolute position of one logical sequence."""

    q: np.ndarray  # (n, N, H)
    k: np.ndarray  # (n, K, H)
    v: np.ndarray  # (n, K, H)


def cast(x, dtype):
    return np.array(jnp.asarray(x.astype(np.float32)).astype(dtype))  # writable copy


def make_world(rng, n, nh, kh, h, dtype=jnp.bfloat16, q_dtype=None):
    q, k, v = (cast(rng.normal(0, 1, (n, heads, h)), dtype) for heads in (nh, kh, kh))
    return World(q if q_dtype is None else cast(np.float32(q), q_dtype), k, v)


class Pool:
    """KV pools (NaN garbage) and a shuffled free list of pages 1..P-1."""

    def __init__(self, rng, kh, h, dtype, taken=0, pages=P):
        self.rng = rng
        self.k = cast(np.full((pages, L, kh, h), np.nan), dtype)
        self.v = self.k.copy()
        self.free = [int(p) for p in rng.permutation(np.arange(1, pages))][taken:]

    def segment(self, start, length):
        pages = [self.free.pop() for _ in range(-(-length // L))]
        return (start, length, pages)


def slot_of(chain, pos):
    for start, length, pages in chain:
        if start <= pos < start + length:
            return pages[(pos - start) // L] * L + (pos - start) % L
    raise AssertionError(f"position {pos} not in chain")


def run_step(
    device,
    pool,
    tokens,
    window=0,
    pad_to=0,
    pad_chains=0,
    pad_segments=0,
    pad_pages=0,
    impl="ffi",
    op=ops.tree_attention,
):
    """tokens: (chain, world, pos) each writing and querying pos; padding tokens appended up to
    pad_to at random indices. Updates pool; returns outputs of the real tokens in order. op:
    ops.tree_attention or another op of its signature (ops.tree_attention_digits)."""
    chains = list({id(ch): ch for ch, _, _ in tokens}.values())
    cid = {id(ch): i for i, ch in enumerate(chains)}
    s = max(len(ch) for ch in chains) + pad_segments
    segs, flat = ops.pack_chains(chains, num_chains=len(chains) + pad_chains, max_segments=s)
    flat = np.concatenate([flat, pool.rng.integers(0, P, pad_pages).astype(np.int32)])
    t = max(pad_to, len(tokens))
    index = np.sort(pool.rng.permutation(t)[: len(tokens)])  # where real tokens sit
    w0 = tokens[0][1]
    q = cast(pool.rng.normal(0, 1, (t, *w0.q.shape[1:])), w0.q.dtype)
    k_new = cast(pool.rng.normal(0, 1, (t, *w0.k.shape[1:])), w0.k.dtype)
    v_new = k_new.copy()
    slot = pool.rng.integers(0, L, t).astype(np.int32)  # padding writes into page 0
    pos, chain_of = np.full(t, -1, np.int32), np.full(t, -1, np.int32)
    for i, (ch, w, p) in zip(index, tokens, strict=True):
        q[i], k_new[i], v_new[i] = w.q[p], w.k[p], w.v[p]
        slot[i], pos[i], chain_of[i] = slot_of(ch, p), p, cid[id(ch)]
    out, pool.k, pool.v = run_on(
        device,
        op,
        q,
        k_new,
        v_new,
        pool.k,
        pool.v,
        slot,
        pos,
        chain_of,
        segs,
        flat,
        scale=0.125,
        window=window,
        impl=impl,
    )
    pad = np.setdiff1d(np.arange(t), index)
    assert not np.any(np.asarray(out[pad], np.float32)), "padding rows must be exact zeros"
    return out[index]


def forest_tokens(rng, pool, world_of, n_branches=3):
    """A root + trunk + branches forest with random lengths, tokens in random order."""
    root = pool.segment(0, int(rng.integers(1, 90)))
    trunk = pool.segment(root[1], int(rng.integers(0, 50)) or 1)
    tokens = []
    for b in range(n_branches):
        branch = pool.segment(trunk[0] + trunk[1], int(rng.integers(1, 40)))
        chain = [root, trunk, branch]
        w = world_of(b, branch[0] + branch[1])
        tokens += [(chain, w, p) for p in range(branch[0], branch[0] + branch[1])]
        if b == 0:  # the shared root and trunk are written once, by branch 0's chain
            tokens += [(chain, w, p) for p in range(trunk[0] + trunk[1])]
    return [tokens[i] for i in rng.permutation(len(tokens))]


@pytest.mark.parametrize("nh,kh,h", CONFIGS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
def test_matches_reference(device, rng, nh, kh, h, dtype, window):
    shared = make_world(rng, 256, nh, kh, h, dtype)

    def world_of(b, n):  # branch 0 writes the shared root and trunk too
        return (
            World(shared.q[:n], shared.k[:n], shared.v[:n])
            if b == 0
            else make_world(rng, n, nh, kh, h, dtype)
        )

    pools = [Pool(np.random.default_rng(1), kh, h, dtype) for _ in range(2)]
    tokens = forest_tokens(rng, pools[0], world_of)
    pools[1].free = list(pools[0].free)
    outs = []
    for pool, impl, dev in (
        (pools[0], "ffi", device),
        (pools[1], "reference", jax.devices("cpu")[0]),
    ):
        pool.rng = np.random.default_rng(7)
        outs.append(run_step(dev, pool, tokens, window=window, pad_to=len(tokens) + 5, impl=impl))
    tol = 2e-5 if dtype == jnp.float32 else 2e-2
    np.testing.assert_allclose(np.float32(outs[0]), np.float32(outs[1]), rtol=tol, atol=tol)
    for a, b in ((pools[0].k, pools[1].k), (pools[0].v, pools[1].v)):
        assert_bitwise_equal(a[1:], b[1:], "pools written like the reference")
    # M = 1: one decode token on the cached forest.
    ch, w, p = max(tokens, key=lambda tok: tok[2])
    w.q, w.k, w.v = (np.concatenate([a, a[-1:]]) for a in (w.q, w.k, w.v))
    ch[-1] = (ch[-1][0], ch[-1][1] + 1, ch[-1][2] + [pools[0].free[-1]])
    single = [
        run_step(dev, pool, [(ch, w, p + 1)], window=window, impl=impl)
        for pool, impl, dev in (
            (pools[0], "ffi", device),
            (pools[1], "reference", jax.devices("cpu")[0]),
        )
    ]
    np.testing.assert_allclose(np.float32(single[0]), np.float32(single[1]), rtol=tol, atol=tol)


@pytest.mark.parametrize("window", [0, 50])
def test_dense_causal_float64(device, rng, window):
    """One chain, one segment, pages in random order == plain causal softmax attention."""
    nh, kh, h, n = 8, 2, 64, 200
    w = make_world(rng, n, nh, kh, h, jnp.float32)
    pool = Pool(rng, kh, h, jnp.float32)
    chain = [pool.segment(0, n)]
    out = run_step(device, pool, [(chain, w, p) for p in range(n)], window=window)
    q = w.q.astype(np.float64).reshape(n, kh, nh // kh, h)  # (T, K, G, H)
    s = np.einsum("tkgh,skh->tkgs", q, w.k.astype(np.float64)) * 0.125
    dist = np.arange(n)[:, None] - np.arange(n)[None, :]  # query - key
    allowed = (dist >= 0) & ((dist < window) if window else True)
    s = np.where(allowed[:, None, None, :], s, -np.inf)
    prob = np.exp(s - s.max(-1, keepdims=True))
    prob /= prob.sum(-1, keepdims=True)
    ref = np.einsum("tkgs,skh->tkgh", prob, w.v.astype(np.float64)).reshape(n, nh, h)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# --- bitwise invariance -------------------------------------------------------------------------
# The query set under test: every position of one 150-token sequence (tiles 0, 1 and 2), bf16,
# GQA with H = 96 (partially used lanes). Each variant must reproduce the base outputs' bits.
INV = dict(nh=4, kh=2, h=96, n=150)


def inv_world(rng):
    return make_world(rng, INV["n"], INV["nh"], INV["kh"], INV["h"])


def base_outputs(device, w, window):
    pool = Pool(np.random.default_rng(3), INV["kh"], INV["h"], jnp.bfloat16)
    chain = [pool.segment(0, INV["n"])]
    return run_step(device, pool, [(chain, w, p) for p in range(INV["n"])], window=window)


def split_chain(rng, pool, n, pieces):
    cuts = np.sort(rng.choice(np.arange(1, n), pieces - 1, replace=False)) if pieces > 1 else []
    bounds = [0, *[int(c) for c in cuts], n]
    return [pool.segment(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


@pytest.mark.parametrize("n_others", [7, 100])
@pytest.mark.parametrize("window", [0, 45])
def test_invariant_to_other_queries(device, rng, n_others, window):
    """(a) A forest: siblings sharing a root, unrelated chains, tokens interleaved at random."""
    w = inv_world(rng)
    base = base_outputs(device, w, window)
    # Pages for the worst case: the own chain's 10 and one for each other token.
    pool = Pool(rng, INV["kh"], INV["h"], jnp.bfloat16, pages=P + n_others)
    tokens = tokens_among_others(rng, pool, w, INV["n"], n_others, lambda n: make_world(
        rng, n, INV["nh"], INV["kh"], INV["h"]))  # fmt: skip
    order = rng.permutation(len(tokens))
    out = run_step(device, pool, [tokens[i] for i in order], window=window)
    where = np.argsort(order)[: INV["n"]]
    assert_bitwise_equal(out[where], base, f"alone vs among {len(tokens) - INV['n']} others")


def tokens_among_others(rng, pool, w, n_own, n_others, world):
    """The n_own positions of world w on a chain (root of 40 + the rest), first, then n_others
    tokens of sibling branches under the same root (they read the root's keys) and unrelated
    sequences; world(n) makes an n-position world for them."""
    root = pool.segment(0, 40)
    chain = [root, pool.segment(40, n_own - 40)]
    tokens = [(chain, w, p) for p in range(n_own)]
    while len(tokens) < n_own + n_others:
        n = int(rng.integers(1, min(12, n_own + n_others - len(tokens)) + 1))
        if rng.integers(2):  # a sibling branch under the same root
            own, own_world = [root, pool.segment(40, n)], world(40 + n)
            tokens += [(own, own_world, p) for p in range(40, 40 + n)]
        else:  # an unrelated sequence: one chain and one world for its n tokens
            other, other_world = [pool.segment(0, n)], world(n)
            tokens += [(other, other_world, p) for p in range(n)]
    return tokens


def test_invariant_to_pages(device, rng):
    """(b) The same keys in other physical pages (other pages already taken)."""
    w = inv_world(rng)
    base = base_outputs(device, w, 0)
    pool = Pool(rng, INV["kh"], INV["h"], jnp.bfloat16, taken=int(rng.integers(1, 30)))
    chain = [pool.segment(0, INV["n"])]
    out = run_step(device, pool, [(chain, w, p) for p in range(INV["n"])])
    assert_bitwise_equal(out, base, "other pages")


@pytest.mark.parametrize("own_segment", [False, True])
@pytest.mark.parametrize("window", [0, 45])
def test_invariant_to_prefix_cache(device, rng, own_segment, window):
    """(c) Prefix written in earlier calls (cached), then the rest, then one decode token.
    own_segment: the cached prefix is its own segment (prefix-cache hit); else one segment
    is filled chunk by chunk (chunked prefill)."""
    w, n = inv_world(rng), INV["n"]
    base = base_outputs(device, w, window)
    pool = Pool(rng, INV["kh"], INV["h"], jnp.bfloat16)
    m = int(rng.integers(1, n - 2))
    if own_segment:
        first = [pool.segment(0, m)]
        chains = (first, first + [pool.segment(m, n - m)])
    else:
        chains = ([pool.segment(0, n)],) * 2
    out1 = run_step(device, pool, [(chains[0], w, p) for p in range(m)], window=window)
    out2 = run_step(
        device, pool, [(chains[1], w, p) for p in range(m, n - 1)], window=window, pad_to=n
    )
    out3 = run_step(device, pool, [(chains[1], w, n - 1)], window=window)
    assert_bitwise_equal(np.concatenate([out1, out2, out3]), base, f"cached prefix of {m}")


@pytest.mark.parametrize("pieces", [2, 5])
def test_invariant_to_segment_split(device, rng, pieces):
    """(d) The chain cut into segments at arbitrary (not page-aligned) boundaries."""
    w = inv_world(rng)
    base = base_outputs(device, w, 45)
    pool = Pool(rng, INV["kh"], INV["h"], jnp.bfloat16)
    chain = split_chain(rng, pool, INV["n"], pieces)
    out = run_step(device, pool, [(chain, w, p) for p in range(INV["n"])], window=45)
    assert_bitwise_equal(out, base, f"split at {[s[0] for s in chain]}")


def test_invariant_to_padding(device, rng):
    """(e) A larger padded T (padding at random indices), padded chains, segments, page list."""
    w = inv_world(rng)
    base = base_outputs(device, w, 0)
    pool = Pool(rng, INV["kh"], INV["h"], jnp.bfloat16)
    chain = [pool.segment(0, INV["n"])]
    out = run_step(
        device,
        pool,
        [(chain, w, p) for p in range(INV["n"])],
        pad_to=512,
        pad_chains=3,
        pad_segments=2,
        pad_pages=40,
    )
    assert_bitwise_equal(out, base, "padded step")


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_cuda_matches_cpu(gpu, rng, dtype):
    """CUDA fuses the dots' multiply-adds, the CPU rounds twice, and expf differs (CUDA's vs
    libm's): the outputs agree to ulps, not bits (tree_attention.h)."""
    nh, kh, h, n = 8, 2, 256, 300
    w = make_world(rng, n, nh, kh, h, dtype)
    outs = []
    for dev in (gpu, jax.devices("cpu")[0]):
        pool = Pool(np.random.default_rng(5), kh, h, dtype)
        chain = split_chain(np.random.default_rng(6), pool, n, 3)
        outs.append(np.float32(run_step(dev, pool, [(chain, w, p) for p in range(n)], window=100)))
    # bf16 outputs may round the ulp-level fp32 difference to neighbouring bf16 values.
    tol = 1e-5 if dtype == jnp.float32 else 2**-7
    np.testing.assert_allclose(outs[0], outs[1], rtol=tol, atol=tol)


def forced_runs(gpu, monkeypatch, kernels, pool_of, steps):
    """Runs the same steps once per forced kernel (fresh pool each time); returns per kernel the
    outputs of every step and the final pools."""
    results = []
    for forced in kernels:
        monkeypatch.setenv("PRISM_TREE_ATTENTION_KERNEL", forced)
        pool = pool_of()
        outs = [step(pool) for step in steps]
        results.append((outs, pool))
    return results


def assert_same_kernels(results, kernels, what):
    (ref_outs, ref_pool), *rest = results
    for name, (outs, pool) in zip(kernels[1:], rest, strict=True):
        for i, (a, b) in enumerate(zip(outs, ref_outs, strict=True)):
            assert_bitwise_equal(a, b, f"{name} vs {kernels[0]} kernel, {what}, step {i}")
        # Page 0 takes the padding tokens' colliding writes: excluded, as everywhere here.
        assert_bitwise_equal(pool.k[1:], ref_pool.k[1:], f"{name}: same pool writes")
        assert_bitwise_equal(pool.v[1:], ref_pool.v[1:], f"{name}: same pool writes")


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


def forest_runs(gpu, rng, monkeypatch, kernels, h, nh, dtype, q_dtype, window, order):
    """Per forced kernel: one step of a 4-question forest (K = 2 kv heads) whose chains
    interleave ("shuffled") or are contiguous in position order ("sorted", how the engine
    steps), T not a multiple of the query tile, 13 padding tokens."""
    kh = 2
    world = make_world(rng, 200, nh, kh, h, dtype, q_dtype)
    seed = int(rng.integers(1 << 31))

    def step(pool):
        tokens = forest_tokens(np.random.default_rng(seed), pool, lambda b, n: world, 4)
        if order == "sorted":
            tokens.sort(key=lambda tk: (tk[0][-1][2][0], tk[2]))  # branch's first page
        return run_step(gpu, pool, tokens, window=window, pad_to=len(tokens) + 13)

    return forced_runs(
        gpu, monkeypatch, kernels, lambda: Pool(np.random.default_rng(seed), kh, h, dtype), [step]
    )


@pytest.mark.parametrize("h", [128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 1000])
def test_block_kernel_long_state_bitwise(gpu, rng, monkeypatch, h, dtype, window):
    """A ~2.5K-key state prefilled in one step, then a 40-token chunk after it (a prefix-cache
    hit): block kernel == warp kernel bit for bit, pools included."""
    kernels = ("warp", "block")
    results = long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, 40, 40 + 9)
    assert_same_kernels(results, kernels, f"H={h}")


def long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, chunk, tail_pad):
    """Per forced kernel: a ~2.6K-key state (one chain over 3 segments, G = 2) prefilled in one
    step, then its last `chunk` tokens in a step padded to `tail_pad` (a prefix-cache hit)."""
    nh, kh, n = 4, 2, 2600
    world = make_world(rng, n, nh, kh, h, dtype)
    seed = int(rng.integers(1 << 31))
    chains = {}

    def pool_of():
        pool = Pool(np.random.default_rng(seed), kh, h, dtype, pages=n // L + 8)
        chains["c"] = split_chain(np.random.default_rng(seed + 1), pool, n, 3)
        return pool

    def prefill(pool):
        toks = [(chains["c"], world, p) for p in range(n - chunk)]
        return run_step(gpu, pool, toks, window=window, pad_to=n - chunk + 5)

    def tail(pool):
        toks = [(chains["c"], world, p) for p in range(n - chunk, n)]
        return run_step(gpu, pool, toks, window=window, pad_to=tail_pad)

    return forced_runs(gpu, monkeypatch, kernels, pool_of, [prefill, tail])


def _fma32(a, b, c) -> np.float32:
    """float32 fused multiply-add, exactly (CUDA's __fmaf_rn): a * b + c rounded once, to
    nearest even, with gradual underflow; an exact zero is -0 only for (-0 product) + -0."""
    a, b, c = (float(np.float32(x)) for x in (a, b, c))
    if not all(map(math.isfinite, (a, b, c))):
        return np.float32(a * b + c)  # inf and NaN cases: float64 gives the same
    x = Fraction(a) * Fraction(b) + Fraction(c)
    if x == 0:
        product_neg = math.copysign(1.0, a) * math.copysign(1.0, b) < 0
        return np.float32(-0.0 if product_neg and math.copysign(1.0, c) < 0 else 0.0)
    mag = abs(x)
    e = mag.numerator.bit_length() - mag.denominator.bit_length()  # 2^e <= mag < 2^(e+2)
    if Fraction(2) ** e > mag:
        e -= 1
    quantum = Fraction(2) ** max(e - 23, -149)  # 24 significant bits, or the denormal step
    n = round(mag / quantum)  # Fraction.__round__ rounds half to even
    y = float(n * quantum)  # exact in float64
    with np.errstate(over="ignore"):
        return np.float32(math.copysign(y, x))  # rounds to inf past the float32 range


def _butterfly_dot(q, k):
    """The attention dot as a CUDA warp computes it (tree_attention.h): lane l sums elements
    l*8 .. l*8+7 from +0 by fused multiply-add, then for off in 16, 8, 4, 2, 1 every lane adds
    lane l ^ off (lanes without elements hold +0)."""
    lanes = np.zeros(32, np.float32)
    for d in range(len(q)):
        lanes[d // 8] = _fma32(q[d], k[d], lanes[d // 8])
    for off in (16, 8, 4, 2, 1):
        lanes = np.float32(lanes + lanes[np.arange(32) ^ off])
    return lanes[0]


def _block_dot(q, k):
    """tree_attention_block_tile.cuh's serial form: fused partials in bit-reversed lane order,
    the levels with off >= H / 8 as one `+ 0`, then a binary-counter stack (PushLeaf)."""
    parts = len(q) // 8
    log = parts.bit_length() - 1
    stack = [np.float32(0)] * (log + 1)
    for seq in range(parts):
        lane = int(format(seq, f"0{log}b")[::-1], 2) if log else 0
        acc = np.float32(0)
        for d in range(lane * 8, lane * 8 + 8):
            acc = _fma32(q[d], k[d], acc)
        if log < 5:
            acc = np.float32(acc + np.float32(0))
        for b in range(log + 1):
            if b == log or not (seq >> b) & 1:
                stack[b] = acc
                break
            acc = np.float32(stack[b] + acc)
    return stack[log]


def test_fma32_is_one_rounding():
    """The emulation rounds once: cases where multiply-then-add rounds differently, signed
    zeros, and a negative product below the smallest denormal (-0)."""
    one_ulp = np.float32(2.0**-23)
    a = np.float32(1) + one_ulp
    exact = _fma32(a, a, -(np.float32(1) + 2 * one_ulp))  # (1+u)^2 - (1+2u) = u^2, exactly
    assert exact == np.float32(2.0**-46) and np.float32(a * a) - (1 + 2 * one_ulp) == 0
    assert math.copysign(1, _fma32(-0.0, 1.0, -0.0)) < 0
    assert math.copysign(1, _fma32(-0.0, 1.0, 0.0)) > 0
    tiny = _fma32(-(2.0**-100), 2.0**-100, 0.0)  # -2^-200 rounds to -0
    assert tiny == 0 and math.copysign(1, tiny) < 0
    assert _fma32(3.0, 5.0, 7.0) == 22.0 and _fma32(2.0**-74, 2.0**-75, 0.0) == 2.0**-149
    assert _fma32(2.0**-75, 2.0**-75, 0.0) == 0, "half the smallest denormal: ties to even"


@pytest.mark.parametrize("h", [64, 128, 256])
def test_block_dot_order_matches_butterfly(rng, h):
    """CPU emulation of the block kernel's one-thread dot against the warp's butterfly, bit for
    bit, on inputs that make the order visible: wide magnitudes, -0.0, denormals, cancellation,
    and products below the smallest denormal (fused partials of -0)."""
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        for trial in range(30):
            scale = np.float32(10.0) ** rng.integers(-30, 30, h)
            q = np.float32(rng.normal(0, 1, h) * scale)
            k = np.float32(rng.normal(0, 1, h))
            if trial % 3 == 0:  # signed zeros and denormals
                q[rng.random(h) < 0.5] = np.float32(-0.0)
                k[rng.random(h) < 0.2] = np.float32(1e-41)
            if trial % 5 == 0:
                q[:] = np.float32(-0.0)
            if trial % 4 == 1:  # negative products too small for a denormal: -0 partials
                q[:] = np.float32(-1e-30)
                k[:] = np.float32(1e-30)
            a, b = _butterfly_dot(q, k), _block_dot(q, k)
            assert_bitwise_equal(np.array([b]), np.array([a]), f"H={h} trial {trial}")


def test_pools_updated_in_place_when_donated(rng):
    kh, h = 2, 64
    pool = Pool(rng, kh, h, jnp.float32)
    w = make_world(rng, 20, 4, kh, h, jnp.float32)
    chain = [pool.segment(0, 20)]
    segs, flat = ops.pack_chains([chain])
    slot = np.array([slot_of(chain, p) for p in range(20)], np.int32)
    pos, cid = np.arange(20, dtype=np.int32), np.zeros(20, np.int32)
    step = jax.jit(
        lambda q, k, v, kp, vp: ops.tree_attention(
            q, k, v, kp, vp, slot, pos, cid, segs, flat, scale=0.125
        ),
        donate_argnums=(3, 4),
    )
    kp, vp = jnp.asarray(pool.k), jnp.asarray(pool.v)
    hlo = step.lower(w.q, w.k, w.v, kp, vp).compile().as_text()
    assert " copy(" not in hlo, "donated pools must be updated in place, not copied"
    _, k2, v2 = step(w.q, w.k, w.v, kp, vp)
    assert kp.is_deleted() and vp.is_deleted(), "pools were not donated"
    np.testing.assert_array_equal(np.asarray(k2).reshape(P * L, kh, h)[slot], w.k)
    np.testing.assert_array_equal(np.asarray(v2).reshape(P * L, kh, h)[slot], w.v)


# --- bad inputs ---------------------------------------------------------------------------------


def good_args(t=5, n=4, k=2, h=64, dtype=np.float32):
    """Valid arguments: one chain of t tokens in pages 1.. of a 4-page pool."""
    z = np.zeros
    chain = [(0, t, [1 + i for i in range(-(-t // L))])]
    segs, flat = ops.pack_chains([chain])
    slot = np.array([slot_of(chain, p) for p in range(t)], np.int32)
    return dict(
        q=z((t, n, h), dtype),
        k_new=z((t, k, h), dtype),
        v_new=z((t, k, h), dtype),
        k_pages=z((4, L, k, h), dtype),
        v_pages=z((4, L, k, h), dtype),
        slot=slot,
        positions=np.arange(t, dtype=np.int32),
        chain_of=z(t, np.int32),
        chain_segments=segs,
        pages_flat=flat,
    )


BAD = [  # (changes to good_args, argument named, text expected in the message)
    (dict(q=np.zeros((5, 64), np.float32)), "q", "[T, N, H]"),
    (dict(k_pages=np.zeros((4, L, 2, 32), np.float32)), "k_pages", "H = 64"),
    (dict(k_pages=np.zeros((4, L, 3, 64), np.float32)), "k_pages", "dividing N = 4"),
    (dict(v_pages=np.zeros((5, L, 2, 64), np.float32)), "v_pages", "[4, 16, 2, 64]"),
    (dict(k_new=np.zeros((5, 2, 64), jnp.bfloat16)), "k_new", "the pool's dtype"),
    (dict(v_new=np.zeros((4, 2, 64), np.float32)), "v_new", "[5, 2, 64]"),
    (dict(slot=np.zeros(4, np.int32)), "slot", "T = 5"),
    (dict(positions=np.arange(5)), "positions", "int32 [T]"),
    (dict(chain_of=np.zeros((5, 1), np.int32)), "chain_of", "int32 [T]"),
    (dict(chain_segments=np.zeros((1, 1, 2), np.int32)), "chain_segments", "[C, S, 3]"),
    (dict(chain_segments=np.zeros((0, 1, 3), np.int32)), "chain_segments", "C, S >= 1"),
    (dict(pages_flat=np.zeros(0, np.int32)), "pages_flat", "non-empty"),
    (dict(slot=np.full(5, 4 * L, np.int32)), "slot", "[0, P * L = 64)"),
    (dict(chain_of=np.full(5, 1, np.int32)), "chain_of", "[0, C = 1)"),
    (dict(pages_flat=np.array([4], np.int32)), "pages_flat", "[0, P = 4)"),
    (dict(chain_segments=np.array([[[0, 17, 0]]], np.int32)), "chain_segments", "ceil(length / L)"),
]


@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_inputs_name_the_argument(case):
    changes, argument, expected = BAD[case]
    with pytest.raises(ValueError, match=rf"\b{argument}\b") as info:
        ops.tree_attention(**{**good_args(), **changes}, scale=1.0)
    assert expected in str(info.value), f"{expected!r} not in: {info.value}"


def test_bad_attributes():
    with pytest.raises(ValueError, match=r"window must be an int >= 0"):
        ops.tree_attention(**good_args(), scale=1.0, window=-1)
    with pytest.raises(ValueError, match=r"\bq\b.*H <= 512"):
        ops.tree_attention(**good_args(h=520), scale=1.0)
    ops.tree_attention(**good_args(h=520), scale=1.0, impl="reference")  # no limit there


def test_handler_rejects_bad_shapes_directly():
    a = good_args()
    out = jax.ShapeDtypeStruct(a["q"].shape, jnp.float32)
    pools = jax.ShapeDtypeStruct(a["k_pages"].shape, jnp.float32)
    workspace = jax.ShapeDtypeStruct((1,), jnp.float32)
    call = jax.ffi.ffi_call("prism_tree_attention", (out, pools, pools, workspace))
    a["v_new"] = np.zeros((5, 2, 63), np.float32)
    with pytest.raises(Exception, match=r"k_new and v_new must be \[5, 2, 64\]"):
        jax.block_until_ready(call(*a.values(), scale=np.float32(1), window=np.int32(0)))
