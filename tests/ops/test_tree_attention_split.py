"""tree_attention's split kernel (cc/ops/tree_attention_split.cuh: tile partials in parallel,
merged in order by a second pass, in rounds of PRISM_TREE_ATTENTION_SPLIT_TILES tiles) against
the warp kernel, BIT FOR BIT: forests, GQA ratios, f32/bf16 pools, windows, a short step of one
chain on a long prefix (several rounds), decode-like steps of one-token chains, padding, queries
that see nothing, and chains past the pool's capacity (the fallback). GPU only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax.ops.tree_attention import (
    SPLIT_BUDGET_BYTES,
    SPLIT_RECORD_TAIL,
    SPLIT_TABLE_FLOATS,
    split_workspace_floats,
)
from tests.ops.tree_attention_world import (
    L,
    P,
    Pool,
    assert_same_kernels,
    forced_runs,
    forest_runs,
    good_args,
    long_state_runs,
    make_world,
    run_step,
)

DTYPES = [(jnp.float32,) * 2, (jnp.bfloat16,) * 2, (jnp.bfloat16, jnp.float32)]  # pool, q


@pytest.fixture
def tiles(request, monkeypatch):
    """The round size: "" = the handler's own choice, else forced (several rounds)."""
    if request.param:
        monkeypatch.setenv("PRISM_TREE_ATTENTION_SPLIT_TILES", request.param)
    else:
        monkeypatch.delenv("PRISM_TREE_ATTENTION_SPLIT_TILES", raising=False)
    return request.param


@pytest.fixture
def batch(request, monkeypatch):
    """Records a merge warp loads at once: "" = the handler's choice (4 above 64 tokens, else
    8), else forced. The merge order is the same either way, so the bits must be too."""
    if request.param:
        monkeypatch.setenv("PRISM_TREE_ATTENTION_MERGE_BATCH", request.param)
    else:
        monkeypatch.delenv("PRISM_TREE_ATTENTION_MERGE_BATCH", raising=False)
    return request.param


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("nh", [2, 4, 8])  # G = 1, 2, 4 with K = 2
@pytest.mark.parametrize("dtype,q_dtype", DTYPES)
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("tiles", ["", "3"], indirect=True)
def test_split_kernel_forest_bitwise(gpu, rng, monkeypatch, h, nh, dtype, q_dtype, window, tiles):
    """Forests (chains interleaved inside a query tile), T not a multiple of the query tile,
    padding tokens: split == warp, pools included; "" also checks the automatic choice."""
    kernels = ("warp", "split", "block")
    results = forest_runs(gpu, rng, monkeypatch, kernels, h, nh, dtype, q_dtype, window, "shuffled")
    assert_same_kernels(results, kernels, f"H={h} G={nh // 2} tiles={tiles!r}")


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 1000])
@pytest.mark.parametrize("tiles", ["", "2", "3"], indirect=True)
@pytest.mark.parametrize("batch", ["", "4"], indirect=True)
def test_split_kernel_short_step_on_long_state_bitwise(
    gpu, rng, monkeypatch, h, dtype, window, tiles, batch
):
    """The follow-up question: a ~2.6K-key state, then 32 tokens of the same chain in a step of
    T = 64 (the rest padding), which the automatic choice ("") gives to the split kernel."""
    kernels = ("warp", "split", "")
    results = long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, 32, 64)
    assert_same_kernels(results, kernels, f"long state H={h} tiles={tiles!r} batch={batch!r}")


@pytest.mark.parametrize("h", [128, 256])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 1000])
@pytest.mark.parametrize("tiles", ["", "2"], indirect=True)
@pytest.mark.parametrize("batch", ["", "8"], indirect=True)
def test_split_kernel_prefix_chunk_on_long_state_bitwise(
    gpu, rng, monkeypatch, h, dtype, window, tiles, batch
):
    """A 200-token chunk after a ~2.4K-key prefix in a step of T = 256 (a forest or prefill
    step after a prefix-cache hit): the split kernel's larger steps, automatic choice included."""
    kernels = ("warp", "split", "")
    results = long_state_runs(gpu, rng, monkeypatch, kernels, h, dtype, window, 200, 256)
    assert_same_kernels(results, kernels, f"chunk of 200 H={h} tiles={tiles!r} batch={batch!r}")


def decode_chains(rng, pool, n_rows, blind):
    """One-token chains (decode rows) of different lengths over a shared root; the first `blind`
    rows sit on chains whose pages are all out of range, so they see no key (exact zeros)."""
    root = pool.segment(0, int(rng.integers(40, 150)))
    chains = []
    for i in range(n_rows):
        if i < blind:
            length = int(rng.integers(1, 100))
            chains.append([(0, length, [-1] * (-(-length // L)))])  # nothing is written either
            continue
        mid = pool.segment(root[1], int(rng.integers(1, 60)))
        chains.append([root, mid, pool.segment(mid[0] + mid[1], 1)])
    return chains


def last_position(chain):
    return chain[-1][0] + chain[-1][1] - 1


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("nh", [2, 8])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize("window", [0, 37])
@pytest.mark.parametrize("tiles", ["", "2"], indirect=True)
def test_split_kernel_decode_rows_bitwise(gpu, rng, monkeypatch, h, nh, dtype, window, tiles):
    """A prefill of a shared root and per-row middles, then a decode-like step: 21 one-token
    chains of different lengths (3 blind: no visible key) padded to T = 32. Windowed blocks that
    mix distant positions span more tiles than the rounds cover and take the fallback."""
    kh, blind = 2, 3
    world = make_world(rng, 300, nh, kh, h, dtype)
    seed = int(rng.integers(1 << 31))
    kernels = ("warp", "split", "")
    chains = {}

    def pool_of():
        pool = Pool(np.random.default_rng(seed), kh, h, dtype)
        chains["c"] = decode_chains(np.random.default_rng(seed + 1), pool, 21, blind)
        return pool

    def prefill(pool):
        real = chains["c"][blind:]
        toks = [(real[0], world, p) for p in range(real[0][0][1])]  # the shared root, once
        for ch in real:
            toks += [(ch, world, p) for p in range(ch[1][0], ch[1][0] + ch[1][1])]
        return run_step(gpu, pool, toks, window=window, pad_to=len(toks) + 5)

    def decode(pool):
        order = np.random.default_rng(seed + 2).permutation(len(chains["c"]))
        toks = [(chains["c"][i], world, last_position(chains["c"][i])) for i in order]
        out = run_step(gpu, pool, toks, window=window, pad_to=32)
        seen_nothing = [j for j, i in enumerate(order) if i < blind]
        assert not np.any(np.asarray(out[seen_nothing], np.float32)), "blind rows: exact zeros"
        return out

    results = forced_runs(gpu, monkeypatch, kernels, pool_of, [prefill, decode])
    assert_same_kernels(results, kernels, f"decode H={h} G={nh // kh} tiles={tiles!r}")


@pytest.mark.parametrize("h", [64, 128, 256])
@pytest.mark.parametrize("window", [0, 45])
@pytest.mark.parametrize("near_tokens,pad_to", [(40, 64), (150, 200)])
def test_split_kernel_positions_past_the_pool_bitwise(
    gpu, rng, monkeypatch, h, window, near_tokens, pad_to
):
    """A chain whose positions start past P * L (legal: positions are logical) spans more tiles
    than the handler's bound: its blocks take the fallback (the lanes warp at T <= 64, the block
    kernel above), next to ordinary chains' blocks that take the split passes, in one step."""
    nh, kh, dtype = 4, 2, jnp.bfloat16
    far = P * L + 77
    world = make_world(rng, far + 20, nh, kh, h, dtype)
    seed = int(rng.integers(1 << 31))
    kernels = ("warp", "split")

    def step(pool):
        near, remote = [pool.segment(0, near_tokens)], [pool.segment(far, 20)]
        tokens = [(near, world, p) for p in range(near_tokens)]
        tokens += [(remote, world, far + p) for p in range(20)]
        order = np.random.default_rng(seed).permutation(len(tokens))
        return run_step(gpu, pool, [tokens[i] for i in order], window=window, pad_to=pad_to)

    results = forced_runs(
        gpu, monkeypatch, kernels, lambda: Pool(np.random.default_rng(seed), kh, h, dtype), [step]
    )
    assert_same_kernels(results, kernels, f"past the pool H={h}")


def test_workspace_holds_the_pool_within_the_budget(monkeypatch):
    """The wrapper sizes the split kernel's workspace: state + one record per (token, head) per
    key tile the pool can hold, capped by the budget, + the span table; 1 float for steps the
    kernel never takes."""
    monkeypatch.delenv("PRISM_TREE_ATTENTION_KERNEL", raising=False)
    table = SPLIT_TABLE_FLOATS
    record = 64 * 32 * (128 + SPLIT_RECORD_TAIL)
    assert split_workspace_floats((64, 32, 128), (320, 16, 16, 128)) == record * (1 + 80) + table
    assert split_workspace_floats((513, 32, 128), (320, 16, 16, 128)) == 1
    record512 = 512 * 32 * (128 + SPLIT_RECORD_TAIL)  # the largest split step: budget-bound
    tiles = SPLIT_BUDGET_BYTES // (4 * record512)
    assert tiles < 80, "the 512-token step is meant to exercise the budget"
    got = split_workspace_floats((512, 32, 128), (320, 16, 16, 128))
    assert got == record512 * (1 + tiles) + table
    big = split_workspace_floats((64, 32, 128), (1 << 20, 16, 16, 128))
    assert big == record * (1 + SPLIT_BUDGET_BYTES // (4 * record)) + table, big
    monkeypatch.setenv("PRISM_TREE_ATTENTION_KERNEL", "split")
    assert split_workspace_floats((600, 2, 64), (8, 16, 2, 64)) == 600 * 2 * 68 * (1 + 2) + table


def test_unknown_merge_batch_is_an_error(gpu, monkeypatch):
    """PRISM_TREE_ATTENTION_MERGE_BATCH takes 4 or 8; anything else must fail the call and say
    what it takes, not run a kernel that was never built."""
    monkeypatch.setenv("PRISM_TREE_ATTENTION_KERNEL", "split")
    monkeypatch.setenv("PRISM_TREE_ATTENTION_MERGE_BATCH", "16")
    a = good_args()
    floats = split_workspace_floats(a["q"].shape, a["k_pages"].shape)  # a round fits
    out = jax.ShapeDtypeStruct(a["q"].shape, jnp.float32)
    pools = jax.ShapeDtypeStruct(a["k_pages"].shape, jnp.float32)
    workspace = jax.ShapeDtypeStruct((floats,), jnp.float32)
    call = jax.ffi.ffi_call("prism_tree_attention", (out, pools, pools, workspace))
    placed = [jax.device_put(x, gpu) for x in a.values()]
    with pytest.raises(Exception, match="PRISM_TREE_ATTENTION_MERGE_BATCH must be 4 or 8"):
        jax.block_until_ready(call(*placed, scale=np.float32(1), window=np.int32(0)))


def test_forced_split_without_workspace_is_an_error(gpu, monkeypatch):
    """A split kernel that cannot run must say so when it was asked for, never fall back
    silently (a silent fallback once hid that it never ran)."""
    monkeypatch.setenv("PRISM_TREE_ATTENTION_KERNEL", "split")
    a = good_args()
    out = jax.ShapeDtypeStruct(a["q"].shape, jnp.float32)
    pools = jax.ShapeDtypeStruct(a["k_pages"].shape, jnp.float32)
    workspace = jax.ShapeDtypeStruct((1,), jnp.float32)
    call = jax.ffi.ffi_call("prism_tree_attention", (out, pools, pools, workspace))
    placed = [jax.device_put(x, gpu) for x in a.values()]
    with pytest.raises(Exception, match="workspace holds no round"):
        jax.block_until_ready(call(*placed, scale=np.float32(1), window=np.int32(0)))
