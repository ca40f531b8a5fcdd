"""qkv_rope(..., pools=, slot=): k and v stored straight into the KV pools, bit for bit what
qkv_rope's k and v results would have put there through tree_attention's write, and
tree_attention called with k_new = v_new = None attends them with the same bits."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from prism_jax.ops.tree_attention import write_pool_rows
from tests.conftest import assert_bitwise_equal, run_on
from tests.ops.test_qkv_rope import inputs

STYLE = dict(eps=1e-6, weight_offset=1.0)


def pools_and_slots(rng, t, k, h, pages=6, page_size=4, dropped=0):
    """Random pools [P, L, K, H] and t distinct slots, the last `dropped` outside the pool."""
    rows = pages * page_size
    pools = tuple(rng.normal(0, 1, (pages, page_size, k, h)).astype(np.float32) for _ in "kv")
    slot = rng.permutation(rows)[:t].astype(np.int32)
    slot[t - dropped :] = rng.choice([-1, rows, rows + 7], dropped)
    return pools, slot


def partials(rng, t, k, g, h):
    y2 = rng.normal(0, 1.0, (2 * t, k, g + 2, h)).astype(np.float32)
    return y2, rng.normal(0, 2.0**-7, (t, k, g + 2, h)).astype(np.float32)


@pytest.mark.parametrize("t,k,g,h", [(1, 1, 1, 16), (5, 4, 2, 128), (9, 2, 4, 80)])
@pytest.mark.parametrize("form", ["plain", "sum"])
@pytest.mark.parametrize("qk_norm", [True, False])
def test_stored_rows_are_the_written_rows(device, rng, t, k, g, h, form, qk_norm):
    """q as qkv_rope returns it; the pools as writing its k and v at slot (out-of-pool slots
    store nothing); every other pool row untouched."""
    qkv, cos, sin, gammas = inputs(rng, t, k, g, h)
    pools, slot = pools_and_slots(rng, t, k, h, dropped=min(2, t - 1))
    g_args = tuple(gammas) if qk_norm else ()
    op, operands = (
        (ops.qkv_rope, (qkv,)) if form == "plain" else (ops.qkv_rope_sum, partials(rng, t, k, g, h))
    )
    q, kp, vp = run_on(device, op, *operands, cos, sin, *g_args, pools=pools, slot=slot, **STYLE)
    q0, k0, v0 = run_on(device, op, *operands, cos, sin, *g_args, **STYLE)
    cpu = jax.devices("cpu")[0]
    assert_bitwise_equal(q, q0, "q")
    assert_bitwise_equal(kp, run_on(cpu, write_pool_rows, pools[0], k0, slot), "k_pages")
    assert_bitwise_equal(vp, run_on(cpu, write_pool_rows, pools[1], v0, slot), "v_pages")
    ref = run_on(
        cpu, op, *operands, cos, sin, *g_args, pools=pools, slot=slot, impl="reference", **STYLE
    )
    for name, a, b in zip(("q", "k_pages", "v_pages"), (q, kp, vp), ref, strict=True):
        assert_bitwise_equal(a, b, f"{name} vs the reference")


def test_shared_slot_keeps_the_last_token_on_the_cpu(rng):
    """Tokens sharing a slot (padding into page 0): the CPU keeps the last one's rows, as
    tree_attention's CPU write does."""
    t, k, g, h = 4, 2, 1, 16
    qkv, cos, sin, _ = inputs(rng, t, k, g, h)
    pools, _ = pools_and_slots(rng, t, k, h)
    slot = np.array([3, 0, 5, 0], np.int32)
    # The CPU alone: CUDA's threads race for a shared slot, and only the junk page 0, which
    # nothing reads, is shared. numpy inputs would otherwise land on a GPU where there is one.
    with jax.default_device(jax.devices("cpu")[0]):
        _, kp, vp = ops.qkv_rope(qkv, cos, sin, pools=pools, slot=slot)
        _, k0, v0 = ops.qkv_rope(qkv, cos, sin)
    flat = (np.asarray(kp).reshape(-1, k, h), np.asarray(vp).reshape(-1, k, h))
    assert_bitwise_equal(flat[0][0], k0[3], "k of the last token with slot 0")
    assert_bitwise_equal(flat[1][0], v0[3], "v of the last token with slot 0")


def _attention_step(q, k, v, pools, positions, page_size):
    """tree_attention of one chain holding positions 0..n-1, pages 1.. in order."""
    p = pools[0].shape[0]
    n = int(positions.max()) + 1
    chain = [(0, n, list(range(1, 1 + -(-n // page_size))))]
    segs, flat = ops.pack_chains([chain], num_pages=p)
    slot = (positions + page_size).astype(np.int32)  # page 1 onwards
    chain_of = np.zeros(len(positions), np.int32)
    tables = (slot, positions, chain_of, segs, flat)
    return ops.tree_attention(q, k, v, *pools, *tables, scale=0.125)


@pytest.mark.parametrize("t,k,g,h", [(7, 2, 2, 64), (40, 4, 2, 128)])
def test_attention_after_the_store_has_the_bits_of_the_unfused_layer(device, rng, t, k, g, h):
    qkv, cos, sin, gammas = inputs(rng, t, k, g, h)
    page_size = 8
    pools = tuple(np.zeros((8, page_size, k, h), np.float32) for _ in "kv")
    positions = np.arange(t, dtype=np.int32)
    slot = (positions + page_size).astype(np.int32)

    def fused(qkv, cos, sin, kp, vp):
        q, kp, vp = ops.qkv_rope(qkv, cos, sin, *gammas, pools=(kp, vp), slot=slot, **STYLE)
        return _attention_step(q, None, None, (kp, vp), positions, page_size)

    def unfused(qkv, cos, sin, kp, vp):
        q, kk, vv = ops.qkv_rope(qkv, cos, sin, *gammas, **STYLE)
        return _attention_step(q, kk, vv, (kp, vp), positions, page_size)

    got = run_on(device, jax.jit(fused), qkv, cos, sin, *pools)
    want = run_on(device, jax.jit(unfused), qkv, cos, sin, *pools)
    for name, a, b in zip(("out", "k_pages", "v_pages"), got, want, strict=True):
        assert_bitwise_equal(a, b, name)


def test_bad_pools_and_slots_say_what_is_expected():
    z = np.zeros
    qkv, cos = z((2, 1, 3, 8), np.float32), z((2, 4), np.float32)
    pools = (z((3, 4, 1, 8), np.float32), z((3, 4, 1, 8), np.float32))
    slot = z(2, np.int32)
    with pytest.raises(ValueError, match="slot is only read with pools"):
        ops.qkv_rope(qkv, cos, cos, slot=slot)
    with pytest.raises(ValueError, match="k_pages must be float32"):
        ops.qkv_rope(qkv, cos, cos, pools=(pools[0].astype(jnp.bfloat16), pools[1]), slot=slot)
    with pytest.raises(ValueError, match="v_pages must be float32 \\[P, L, K, H\\] with K = 1"):
        ops.qkv_rope(qkv, cos, cos, pools=(pools[0], z((3, 4, 2, 8), np.float32)), slot=slot)
    with pytest.raises(ValueError, match="slot must be int32 \\[T\\] with T = 2"):
        ops.qkv_rope(qkv, cos, cos, pools=pools, slot=z(3, np.int32))
    with pytest.raises(ValueError, match="both k_new and v_new, or neither"):
        q = z((2, 1, 8), np.float32)
        ops.tree_attention(
            q, q[:, :1], None, *pools, slot, slot, slot, z((1, 1, 3), np.int32), slot, scale=1.0
        )
