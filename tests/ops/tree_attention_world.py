"""The tree_attention tests' world: fixed q/k/v per position, NaN-filled pools with a shuffled
free list, forests of chains, and one step of the op on them (run_step). Shared by
test_tree_attention*.py; not a test module."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from prism_jax import ops
from tests.conftest import assert_bitwise_equal, run_on

P, L = 96, 16  # pool pages (page 0 = dummy), page size


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


def token_arrays(pool, tokens, t, index, cid):
    """The step's per-token arrays: the real tokens at index, random padding elsewhere (its
    writes go to page 0, its positions and chains are -1)."""
    w0 = tokens[0][1]
    q = cast(pool.rng.normal(0, 1, (t, *w0.q.shape[1:])), w0.q.dtype)
    k_new = cast(pool.rng.normal(0, 1, (t, *w0.k.shape[1:])), w0.k.dtype)
    v_new = k_new.copy()
    slot = pool.rng.integers(0, L, t).astype(np.int32)  # padding writes into page 0
    pos, chain_of = np.full(t, -1, np.int32), np.full(t, -1, np.int32)
    for i, (ch, w, p) in zip(index, tokens, strict=True):
        q[i], k_new[i], v_new[i] = w.q[p], w.k[p], w.v[p]
        slot[i], pos[i], chain_of[i] = slot_of(ch, p), p, cid[id(ch)]
    return q, k_new, v_new, slot, pos, chain_of


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
    q, k_new, v_new, slot, pos, chain_of = token_arrays(pool, tokens, t, index, cid)
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


def split_chain(rng, pool, n, pieces):
    cuts = np.sort(rng.choice(np.arange(1, n), pieces - 1, replace=False)) if pieces > 1 else []
    bounds = [0, *[int(c) for c in cuts], n]
    return [pool.segment(a, b - a) for a, b in zip(bounds[:-1], bounds[1:], strict=True)]


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
