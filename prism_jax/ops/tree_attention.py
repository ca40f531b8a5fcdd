"""Tree attention over a paged KV pool: the forest and prefix-cache core (one call per layer).

Letters: T tokens of the step, N query heads, K kv heads (query head n uses kv head n // (N/K)),
H head dim, P pages (page 0 is the dummy page padding writes go to), L page size, C chains,
S segments per chain, Pt entries of the flat page list.

  tree_attention(q [T, N, H], k_new, v_new [T, K, H], k_pages, v_pages [P, L, K, H],
                 slot, positions, chain_of int32 [T], chain_segments int32 [C, S, 3],
                 pages_flat int32 [Pt], *, scale, window=0)
      -> (out [T, N, H] in q's dtype, k_pages, v_pages)

Token t's k/v are written at row slot[t] = page * L + offset of the pools (the returned pools;
donate them through jit and XLA updates them in place; k_new = v_new = None: qkv_rope wrote them
already, with pools=...), then query t attends every key of chain
chain_of[t] at positions p <= positions[t] (and p > positions[t] - window when window > 0).
A chain is up to S segments (start, length, first), ancestors first, unused ones with length 0;
segment position p lives in page pages_flat[first + (p - start) // L] at offset
(p - start) % L. Padding tokens: slot in page 0, chain_of = -1 (or positions = -1): zero output.
`pack_chains` builds the two tables from per-segment page lists.

Numerics (cc/ops/tree_attention.h): canonical-order dots, online softmax over tiles of 64
absolute key positions in increasing order, fp32, exact zeros for absent keys. A query's output
bits depend only on its q and the k/v it sees, never on the rest of the step, the pages, the
segment split or whether its prefix was written in an earlier call. The pure-jnp reference is
a plain masked softmax (equal within rounding, not bitwise).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl

OP = "tree_attention"
ATTN_TILE = 64  # cc/ops/tree_attention.h kAttnTile: keys per softmax tile
MAX_HEAD_DIM = 512  # cc/ops/tree_attention.h kMaxAttnHeadDim (the CUDA kernel's limit)
Segment = tuple[int, int, Sequence[int]]  # (start position, length, physical pages)


def pack_chains(
    chains: Sequence[Sequence[Segment]],
    *,
    num_chains: int | None = None,
    max_segments: int | None = None,
    num_pages: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Host-side tables for `tree_attention` from chains of (start, length, pages) segments.

    A segment shared by several chains (same start, length and pages) is listed once in
    pages_flat. Padding: unused chains and segments get length 0, pages_flat is padded with 0.

    Returns:
      (chain_segments int32 [C, S, 3], pages_flat int32 [Pt]).
    """
    c = len(chains) if num_chains is None else num_chains
    s = max([len(ch) for ch in chains] + [1]) if max_segments is None else max_segments
    if len(chains) > c or any(len(ch) > s for ch in chains):
        raise ValueError(f"pack_chains: more than {c} chains or {s} segments per chain")
    table = np.zeros((c, s, 3), np.int32)
    flat: list[int] = []
    first_of: dict[tuple, int] = {}
    for i, chain in enumerate(chains):
        for j, (start, length, pages) in enumerate(chain):
            key = (int(start), int(length), tuple(map(int, pages)))
            if key not in first_of:
                first_of[key] = len(flat)
                flat.extend(key[2])
            table[i, j] = (start, length, first_of[key])
    pt = max(len(flat), 1) if num_pages is None else num_pages
    if len(flat) > pt:
        raise ValueError(f"pack_chains: {len(flat)} page entries exceed num_pages = {pt}")
    return table, np.array(flat + [0] * (pt - len(flat)), np.int32)


def _check(
    q, k_new, v_new, k_pages, v_pages, slot, positions, chain_of, segs, pages_flat, window
) -> None:
    _check_arrays(q, k_new, v_new, k_pages, v_pages)
    _check_tables(q.shape[0], slot, positions, chain_of, segs, pages_flat)
    if not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"{OP}: window must be an int >= 0 (0 = full causal), got {window!r}")
    p, page_size = k_pages.shape[:2]
    _check_values(p * page_size, page_size, slot, chain_of, segs, pages_flat, p)


def _check_arrays(q, k_new, v_new, k_pages, v_pages) -> None:
    _checks.require(OP, "q", q, rank=3, dtypes=_checks.FLOAT_ACTIVATIONS, expected="[T, N, H]")
    t, n, h = q.shape
    _checks.require(
        OP,
        "k_pages",
        k_pages,
        rank=4,
        dtypes=_checks.FLOAT_ACTIVATIONS,
        expected=f"[P, L, K, H] with H = {h}",
    )
    _checks.require_dim(OP, "k_pages", k_pages, 3, h, f"[P, L, K, H] with H = {h} (q's H)")
    p, page_size, k, _ = k_pages.shape
    if k == 0 or n % k or page_size == 0 or p == 0:
        raise ValueError(
            f"{OP}: k_pages must be [P, L, K, H] with P, L >= 1 and K dividing "
            f"N = {n}, got {_checks.describe(k_pages)}"
        )
    if (k_new is None) != (v_new is None):
        raise ValueError(f"{OP}: pass both k_new and v_new, or neither (already in the pools)")
    news = () if k_new is None else (("k_new", k_new, (t, k, h)), ("v_new", v_new, (t, k, h)))
    for name, x, shape in (("v_pages", v_pages, k_pages.shape), *news):
        if not hasattr(x, "shape") or x.shape != shape or x.dtype != k_pages.dtype:
            got = _checks.describe(x) if hasattr(x, "shape") else type(x).__name__
            raise ValueError(
                f"{OP}: {name} must be {np.dtype(k_pages.dtype).name} "
                f"{list(shape)} (the pool's dtype), got {got}"
            )


def _check_tables(t: int, slot, positions, chain_of, segs, pages_flat) -> None:
    for name, x in (("slot", slot), ("positions", positions), ("chain_of", chain_of)):
        _checks.require(OP, name, x, rank=1, dtypes=[jnp.int32], expected=f"int32 [T] with T = {t}")
        _checks.require_dim(OP, name, x, 0, t, f"int32 [T] with T = {t} (one per token of q)")
    _checks.require(
        OP,
        "chain_segments",
        segs,
        rank=3,
        dtypes=[jnp.int32],
        expected="int32 [C, S, 3] of (start, length, first)",
    )
    _checks.require_dim(
        OP, "chain_segments", segs, 2, 3, "int32 [C, S, 3] of (start, length, first)"
    )
    _checks.require_nonempty(OP, "chain_segments", segs, "int32 [C, S, 3] (C, S >= 1)")
    _checks.require(OP, "pages_flat", pages_flat, rank=1, dtypes=[jnp.int32], expected="int32 [Pt]")
    _checks.require_nonempty(OP, "pages_flat", pages_flat, "int32 [Pt] (pad with page 0)")


def _check_values(rows: int, page_size: int, slot, chain_of, segs, pages_flat, p: int) -> None:
    """Value checks where the tables are concrete (the kernel itself never reads out of bounds:
    it skips bad slots and treats bad pages as absent keys)."""
    if any(isinstance(x, jax.core.Tracer) for x in (slot, chain_of, segs, pages_flat)):
        return
    slot, chain_of, segs, pages = map(np.asarray, (slot, chain_of, segs, pages_flat))
    if np.any((slot < 0) | (slot >= rows)):
        raise ValueError(
            f"{OP}: slot must be page * L + offset in [0, P * L = {rows}) "
            "(padding tokens write to page 0)"
        )
    if np.any(chain_of >= segs.shape[0]) or np.any(chain_of < -1):
        raise ValueError(
            f"{OP}: chain_of must be a chain in [0, C = {segs.shape[0]}) or -1 for padding"
        )
    if np.any((pages < 0) | (pages >= p)):
        raise ValueError(f"{OP}: pages_flat must hold page ids in [0, P = {p})")
    used = segs[..., 1] > 0
    end = segs[..., 2] + -(-segs[..., 1] // page_size)
    if np.any(used & ((segs[..., 2] < 0) | (end > pages.shape[0]) | (segs[..., 0] < 0))):
        raise ValueError(
            f"{OP}: chain_segments entries (start >= 0, length, first) must index "
            f"their ceil(length / L) pages inside pages_flat [{pages.shape[0]}]"
        )


def write_pool_rows(pages, new, slot):
    """pages [P, L, K, H] with token t's row new[t] at pool row slot[t] (out of range: dropped)."""
    p, page_size, k, h = pages.shape
    rows = jnp.where(
        (slot >= 0) & (slot < p * page_size), slot, p * page_size
    )  # out of range: dropped
    flat = jnp.asarray(pages).reshape(p * page_size, k, h)  # (P*L, K, H)
    return flat.at[rows].set(new, mode="drop").reshape(pages.shape)


def _chain_keys(segs, pages_flat, p: int, page_size: int):
    """Per chain, which (segment, flat entry f, offset o) hold a key and at which position:
    (valid bool [C, S, Pt, L], position int32 [C, S, Pt, L]). First covering segment wins."""
    start, length, first = (segs[..., i][..., None, None] for i in range(3))  # (C, S, 1, 1)
    pt = pages_flat.shape[0]
    rel = (jnp.arange(pt)[:, None] - first) * page_size + jnp.arange(page_size)[
        None, :
    ]  # (C, S, Pt, L)
    pos = start + rel
    page = pages_flat[:, None]  # (Pt, 1)
    valid = (length > 0) & (rel >= 0) & (rel < length) & (pos >= 0) & (page >= 0) & (page < p)
    s_lo, s_len = segs[..., 0], segs[..., 1]  # (C, S')
    covers = (
        (s_len[:, None, :, None, None] > 0)
        & (s_lo[:, None, :, None, None] <= pos[:, :, None])
        & (pos[:, :, None] < (s_lo + s_len)[:, None, :, None, None])
    )  # (C, S, S', Pt, L)
    s = segs.shape[1]
    earlier = jnp.arange(s)[None, :] < jnp.arange(s)[:, None]  # (S, S'): s' < s
    shadowed = jnp.any(covers & earlier[None, :, :, None, None], axis=2)
    return valid & ~shadowed, pos


def tree_attention_reference(
    q,
    k_new,
    v_new,
    k_pages,
    v_pages,
    slot,
    positions,
    chain_of,
    chain_segments,
    pages_flat,
    *,
    scale: float,
    window: int = 0,
):
    """Plain masked softmax attention over the same key sets, fp32 (HIGHEST precision dots)."""
    if k_new is not None:  # None: the rows are in the pools already
        k_pages, v_pages = (
            write_pool_rows(k_pages, k_new, slot),
            write_pool_rows(v_pages, v_new, slot),
        )
    p, page_size, kh, h = k_pages.shape
    t, n, _ = q.shape
    c = chain_segments.shape[0]
    valid, pos = _chain_keys(chain_segments, pages_flat, p, page_size)  # (C, S, Pt, L)
    chain = jnp.clip(chain_of, 0, max(c - 1, 0))
    qpos = positions[:, None, None, None]
    mask = valid[chain] & (pos[chain] <= qpos)  # (T, S, Pt, L)
    if window > 0:
        mask &= pos[chain] > qpos - window
    mask &= ((chain_of >= 0) & (chain_of < c) & (positions >= 0))[:, None, None, None]
    rows = (
        jnp.clip(pages_flat, 0, p - 1)[:, None] * page_size + jnp.arange(page_size)[None, :]
    )  # (Pt, L)
    # Zero the values no query sees (0 * garbage would be NaN in the einsum).
    held = jnp.any(mask, axis=(0, 1))[:, :, None, None]  # (Pt, L, 1, 1)
    keys = k_pages.reshape(p * page_size, kh, h)[rows].astype(jnp.float32)  # (Pt, L, K, H)
    vals = jnp.where(held, v_pages.reshape(p * page_size, kh, h)[rows].astype(jnp.float32), 0.0)
    qg = q.astype(jnp.float32).reshape(t, kh, n // kh, h)  # (T, K, G, H)
    hi = jax.lax.Precision.HIGHEST
    scores = jnp.einsum("tkgh,fokh->tkgfo", qg, keys, precision=hi) * jnp.float32(scale)
    m5 = mask[:, None, None]  # (T, 1, 1, S, Pt, L)
    s6 = jnp.where(m5, scores[:, :, :, None], -jnp.inf)  # (T, K, G, S, Pt, L)
    mx = jnp.max(s6, axis=(3, 4, 5), keepdims=True)
    e = jnp.where(m5, jnp.exp(s6 - jnp.where(jnp.isfinite(mx), mx, 0.0)), 0.0)
    denom = jnp.sum(e, axis=(3, 4, 5), keepdims=True)
    probs = jnp.sum(e / jnp.where(denom > 0, denom, 1.0), axis=3)  # (T, K, G, Pt, L)
    out = jnp.einsum("tkgfo,fokh->tkgh", probs, vals, precision=hi)  # (T, K, G, H)
    return out.reshape(t, n, h).astype(q.dtype), k_pages, v_pages


def tree_attention(
    q,
    k_new,
    v_new,
    k_pages,
    v_pages,
    slot,
    positions,
    chain_of,
    chain_segments,
    pages_flat,
    *,
    scale: float,
    window: int = 0,
    impl: Impl | None = None,
):
    """Writes this step's k/v into the paged pools, then attends each query's chain.

    Args:
      q: [T, N, H] float32 or bfloat16 queries (roped, normed, not scaled).
      k_new, v_new: [T, K, H] this step's keys (roped) and values, in the pools' dtype; or both
        None when they are in the pools already (qkv_rope with pools=...): no write here.
      k_pages, v_pages: [P, L, K, H] float32 or bfloat16 KV pools (donate them).
      slot: int32 [T] pool row page * L + offset for token t's k/v (padding: page 0).
      positions: int32 [T] absolute position of each token (-1 for padding).
      chain_of: int32 [T] chain of each token (-1 for padding).
      chain_segments: int32 [C, S, 3] (start, length, first) per segment, ancestors first.
      pages_flat: int32 [Pt] physical pages; see `pack_chains`.
      scale: score = dot(q, k) * scale.
      window: sliding window (keys p > position - window); 0 = full causal.

    Returns:
      (out [T, N, H] in q's dtype, k_pages, v_pages) with the new k/v written.
    """
    arrays = (q, k_new, v_new, k_pages, v_pages)
    tables = (slot, positions, chain_of, chain_segments, pages_flat)
    _check(*arrays, *tables, window)
    args = (*arrays, *tables)
    if resolve_impl(impl) == "reference":
        return tree_attention_reference(*args, scale=scale, window=int(window))
    if q.shape[2] > MAX_HEAD_DIM:
        raise ValueError(
            f"{OP}: q must have head dim H <= {MAX_HEAD_DIM} for the kernels, got "
            f"{_checks.describe(q)}; use impl='reference'"
        )
    return _ffi_tree_attention(args, scale, window)


def _ffi_tree_attention(args: tuple, scale: float, window: int):
    """The custom call on checked arguments (tree_attention's order): (out, k_pages, v_pages);
    its split workspace, a fourth result, is dropped."""
    require_target("prism_tree_attention")
    q, k_new, _, k_pages, v_pages = args[:5]
    if k_new is None:  # zero new rows: the handlers skip their write
        none = jnp.zeros((0, *k_pages.shape[2:]), k_pages.dtype)
        args = (q, none, none, *args[3:])
    outs = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
        jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype),
        jax.ShapeDtypeStruct((split_workspace_floats(q.shape, k_pages.shape),), jnp.float32),
    )
    call = jax.ffi.ffi_call(
        "prism_tree_attention", outs, input_output_aliases={3: 1, 4: 2}, vmap_method="sequential"
    )
    return tuple(call(*args, scale=np.float32(scale), window=np.int32(window)))[:3]


# The CUDA split kernel (cc/ops/tree_attention_split.cuh) keeps its tile partials in a workspace
# the step allocates: an XLA result, so XLA plans the memory with the executable's own (reused
# across layers) and the call stays capturable in a CUDA graph, where scratch memory allocated
# inside a handler would not be. Mirrors of its constants:
SPLIT_MAX_TOKENS = 512  # kSplitMaxTokens: steps of up to this many tokens take the split kernel
SPLIT_RECORD_TAIL = 4  # kTail: floats after a record's H accumulators (m, l, seen, padding)
SPLIT_BUDGET_BYTES = 512 << 20  # one round's partials at most (T = 256 on a 5K-key pool: 1 round)
SPLIT_TABLE_FLOATS = 256 * 3  # kTableFloats: the span table at the workspace's end


def split_workspace_floats(q_shape, pool_shape) -> int:
    """f32 elements of the split kernel's workspace for a step of q [T, N, H] on pools
    [P, L, K, H]: the running state per (token, head), then one record per (token, head) and key
    tile for as many tiles as the pool can hold (within the budget), then the query tiles' span
    table. 1 (unused) for bigger steps,
    which never take the split kernel unless PRISM_TREE_ATTENTION_KERNEL=split forces it."""
    t, n, h = q_shape
    forced = os.environ.get("PRISM_TREE_ATTENTION_KERNEL") == "split"
    if t == 0 or (t > SPLIT_MAX_TOKENS and not forced):
        return 1
    record = t * n * (h + SPLIT_RECORD_TAIL)  # floats per key tile (and of the state)
    tiles = -(-pool_shape[0] * pool_shape[1] // ATTN_TILE)
    tiles = max(1, min(tiles, SPLIT_BUDGET_BYTES // (4 * record)))
    return record * (1 + tiles) + SPLIT_TABLE_FLOATS
