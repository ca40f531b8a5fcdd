"""tree_attention: kernel vs the pure-jnp reference and a float64 dense attention, written pools
bitwise, and BITWISE invariance of a query's output to everything but its own keys: the rest of
the step, the pages, the segment split, prefix caching (earlier call) and padding; then bad
inputs. The CUDA kernels against each other: test_tree_attention_kernels.py; the dot order's
CPU emulation: test_tree_attention_dot_order.py.

Pools start filled with NaN, so a kernel that reads an absent or masked key fails every test.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal
from tests.ops.tree_attention_world import (
    L,
    P,
    Pool,
    World,
    forest_tokens,
    good_args,
    make_world,
    run_step,
    slot_of,
    split_chain,
    tokens_among_others,
)

CONFIGS = [(4, 4, 64), (8, 2, 80), (4, 1, 256)]  # (N, K, H): MHA, GQA with partial lanes, Gemma


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
    with pytest.raises(Exception, match=r"k_new and v_new must both be \[5, 2, 64\]"):
        jax.block_until_ready(call(*a.values(), scale=np.float32(1), window=np.int32(0)))
    # No rows means "qkv_rope stored them", which takes both k_new and v_new empty.
    a["k_new"], a["v_new"] = np.zeros((0, 2, 64), np.float32), np.zeros((5, 2, 64), np.float32)
    with pytest.raises(Exception, match=r"must both be \[5, 2, 64\] \(or \[0, 2, 64\]"):
        jax.block_until_ready(call(*a.values(), scale=np.float32(1), window=np.int32(0)))
