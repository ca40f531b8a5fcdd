"""Tree attention in INT8 digits: `tree_attention`'s key semantics (chains, pages, windows), with
pools of packed digit rows and arithmetic whose dots run on INT8 tensor cores
(cc/ops/attention_digits.h).

  tree_attention_digits(q [T, N, H], k_new, v_new [T, K, H] (q's dtype),
                        k_pages, v_pages int8 [P, L, K, 2H + 16], slot, positions, chain_of,
                        chain_segments, pages_flat, *, scale, window=0)
      -> (out [T, N, H] in q's dtype, k_pages, v_pages)

Every q, k and v row (token or key, head) is two INT8 digits with per-row scales (the
two-digit GEMM path's rule); k and v rows are cut once, when this step writes them, into
packed pool rows `c1 [H] | c2 [H] | s1, s2 (f32) | 8 zero bytes` (half the bytes of an f32
pool; a zero row is a zero vector). Scores are exact int32 digit dots times the scales; per
64-position key tile the softmax weights times the value scales are fixed-point integers and
the weighted values exact integer dots; tiles merge in increasing order. Integer sums are
exact in any order and the float work is per element, with an exp built from correctly rounded
operations, so the CPU and CUDA kernels give the same bits, whatever the batch, the pages, the
segment split or the step a prefix was written in. Precision: each row to ~1 / (127 * 254) of
its max (bf16: 1 / 256 of each element); H <= 256 and a multiple of 8.

The pure-jnp reference attends the digits' values with a plain masked softmax and the kernels'
three digit dots: equal within the weights' fixed point (~1e-6 of the output's scale).

On CUDA, steps of up to DIGITS_SPLIT_MAX_TOKENS tokens split the key tiles over more blocks and
merge the tiles' partials in order in a second pass (cc/ops/tree_attention_digits_split.cuh):
the same bits, with the partials in a workspace that is a result of the call.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.quantize import quantize_remainder, quantize_rows
from prism_jax.ops.tree_attention import _check_tables, _check_values, tree_attention_reference

OP = "tree_attention_digits"
TARGET = "prism_tree_attention_digits"
MAX_HEAD_DIM = 256  # cc/ops/attention_digits.h kDigitMaxHeadDim
PACK_TAIL = 16  # bytes after a row's codes: s1, s2 (f32), 8 zero bytes


ATTN_TILE = 64  # cc/ops/tree_attention.h kAttnTile
# The CUDA split's workspace (cc/ops/tree_attention_digits_split.cuh): an XLA result, so XLA
# plans it with the executable's memory and the call stays capturable in a CUDA graph.
DIGITS_SPLIT_MAX_TOKENS = 512  # kSplitMaxTokens: bigger steps take the fused kernel
DIGITS_RECORD_TAIL = 4  # kRecordTail: floats after a record's H accumulators (m, l, padding)
DIGITS_SPLIT_BUDGET_BYTES = 512 << 20  # the state and one round's records at most
KERNEL_ENV = "PRISM_TREE_ATTENTION_DIGITS_KERNEL"  # "fused" | "split": force one (tests)
SLOTS_ENV = "PRISM_TREE_ATTENTION_DIGITS_SLOTS"  # cap on a round's tiles (tests: many rounds)


def digits_split_workspace_floats(q_shape, pool_shape) -> int:
    """f32 elements of the CUDA split's workspace for q [T, N, H] on pools [P, L, K, 2H + 16]:
    the running state and one record per (token, head) and key tile, for as many tiles as the
    pool holds within the budget (more take several rounds), then the step's query rows as
    packed digit rows; 1 (no split) for steps above
    DIGITS_SPLIT_MAX_TOKENS tokens unless PRISM_TREE_ATTENTION_DIGITS_KERNEL=split."""
    t, n, h = q_shape
    forced = os.environ.get(KERNEL_ENV, "")
    if t == 0 or forced == "fused" or (t > DIGITS_SPLIT_MAX_TOKENS and forced != "split"):
        return 1
    record = t * n * (h + DIGITS_RECORD_TAIL)
    slots = -(-pool_shape[0] * pool_shape[1] // ATTN_TILE)
    slots = min(slots, max(1, DIGITS_SPLIT_BUDGET_BYTES // (4 * record) - 1))
    if os.environ.get(SLOTS_ENV):
        slots = min(slots, max(1, int(os.environ[SLOTS_ENV])))
    return record * (1 + slots) + t * n * packed_row_bytes(h) // 4  # + the packed query rows


def packed_row_bytes(h: int) -> int:
    """Bytes of one packed digit row of H elements (cc/ops/attention_digits.h PackedRowBytes)."""
    return 2 * h + PACK_TAIL


def _digits(x: jax.Array):
    """x [..., H] -> (c1, s1, c2, s2): two INT8 digits per row of H (codes int8, scales f32)."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).astype(jnp.float32)  # (M, H)
    c1, s1 = quantize_rows(rows)
    c2, s2 = quantize_remainder(rows, c1, s1)
    return c1.reshape(shape), s1.reshape(shape[:-1]), c2.reshape(shape), s2.reshape(shape[:-1])


def pack_digit_rows(x: jax.Array) -> jax.Array:
    """Rows x [..., H] (float) as packed digit rows int8 [..., 2H + 16], the pools' layout."""
    c1, s1, c2, s2 = _digits(x)
    scales = jax.lax.bitcast_convert_type(jnp.stack([s1, s2], axis=-1), jnp.int8)  # (..., 2, 4)
    scales = scales.reshape(*x.shape[:-1], 8)
    pad = jnp.zeros((*x.shape[:-1], PACK_TAIL - 8), jnp.int8)
    return jnp.concatenate([c1, c2, scales, pad], axis=-1)


def unpack_digit_rows(packed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Packed rows int8 [..., 2H + 16] -> their digits' values (c1 * s1, c2 * s2) f32 [..., H]."""
    h = (packed.shape[-1] - PACK_TAIL) // 2
    scales = packed[..., 2 * h : 2 * h + 8].reshape(*packed.shape[:-1], 2, 4)
    s = jax.lax.bitcast_convert_type(scales, jnp.float32)  # (..., 2)
    c1, c2 = packed[..., :h].astype(jnp.float32), packed[..., h : 2 * h].astype(jnp.float32)
    return c1 * s[..., :1], c2 * s[..., 1:]


def digit_pool_shape(num_pages: int, page_size: int, num_kv_heads: int, head_dim: int):
    """Shape of one zero-initialised int8 digits pool [P, L, K, 2H + 16]."""
    return (num_pages, page_size, num_kv_heads, packed_row_bytes(head_dim))


def _score_operands(a: jax.Array, b: jax.Array, role: str) -> jax.Array:
    """Digit values (a, b) [..., H] -> [..., 3H] whose dot products are the kernels' three digit
    dots: [q1 | q1 | q2] . [k1 | k2 | k1] (the q2.k2 term is dropped); values [v1 + v2 | 0 | 0]
    keep the output in the first H."""
    if role == "q":
        return jnp.concatenate([a, a, b], axis=-1)
    if role == "k":
        return jnp.concatenate([a, b, a], axis=-1)
    return jnp.concatenate([a + b, jnp.zeros_like(a), jnp.zeros_like(a)], axis=-1)


def _write(pages, rows, slot):
    p, page_size, k, w = pages.shape
    sl = jnp.where((slot >= 0) & (slot < p * page_size), slot, p * page_size)  # out: dropped
    return pages.reshape(p * page_size, k, w).at[sl].set(rows, mode="drop").reshape(pages.shape)


def tree_attention_digits_reference(
    q, k_new, v_new, k_pages, v_pages, slot, positions, chain_of, chain_segments, pages_flat,
    *, scale: float, window: int = 0,
):  # fmt: skip
    """Writes the packed rows as the kernels do, then a plain masked softmax (fp32, HIGHEST dots)
    on the digits' values with the kernels' three digit dots as scores."""
    k_pages = _write(k_pages, pack_digit_rows(k_new), slot)
    v_pages = _write(v_pages, pack_digit_rows(v_new), slot)
    c1, s1, c2, s2 = _digits(q)
    qa, qb = c1 * s1[..., None], c2 * s2[..., None]  # (T, N, H) each
    ka, kb = unpack_digit_rows(k_pages)
    va, vb = unpack_digit_rows(v_pages)
    t, _, h = q.shape
    zeros = jnp.zeros((t, k_pages.shape[2], 3 * h), jnp.float32)
    out, _, _ = tree_attention_reference(
        _score_operands(qa, qb, "q"), zeros, zeros,
        _score_operands(ka, kb, "k"), _score_operands(va, vb, "v"),
        jnp.full_like(slot, -1), positions, chain_of, chain_segments, pages_flat,
        scale=scale, window=window,
    )  # fmt: skip
    return out[..., :h].astype(q.dtype), k_pages, v_pages


def _check(q, k_new, v_new, k_pages, v_pages, tables, window) -> None:
    _checks.require(OP, "q", q, rank=3, dtypes=_checks.FLOAT_ACTIVATIONS, expected="[T, N, H]")
    t, n, h = q.shape
    if h % 8 or h > MAX_HEAD_DIM:
        raise ValueError(
            f"{OP}: head dim H must be a multiple of 8, at most {MAX_HEAD_DIM}, got "
            f"{_checks.describe(q)}; use ops.tree_attention (canonical numerics) for others"
        )
    want = f"int8 [P, L, K, 2H + 16 = {packed_row_bytes(h)}] (packed digit rows)"
    _checks.require(OP, "k_pages", k_pages, rank=4, dtypes=[jnp.int8], expected=want)
    _checks.require_dim(OP, "k_pages", k_pages, 3, packed_row_bytes(h), want)
    p, page_size, k, _ = k_pages.shape
    if k == 0 or n % k or page_size == 0 or p == 0:
        raise ValueError(f"{OP}: k_pages must be {want} with K dividing N = {n}")
    for name, x, shape, dtype in (
        ("v_pages", v_pages, k_pages.shape, jnp.int8),
        ("k_new", k_new, (t, k, h), q.dtype),
        ("v_new", v_new, (t, k, h), q.dtype),
    ):
        if not hasattr(x, "shape") or x.shape != shape or x.dtype != dtype:
            got = _checks.describe(x) if hasattr(x, "shape") else type(x).__name__
            raise ValueError(
                f"{OP}: {name} must be {np.dtype(dtype).name} {list(shape)}, got {got}"
            )
    _check_tables(t, *tables)
    if not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"{OP}: window must be an int >= 0 (0 = full causal), got {window!r}")
    slot, _, chain_of, segs, pages_flat = tables
    _check_values(p * page_size, page_size, slot, chain_of, segs, pages_flat, p)


def tree_attention_digits(
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
    """Cuts this step's k/v into digits and writes them into the packed pools, then attends each
    query's chain in digits.

    Args:
      q: [T, N, H] float32 or bfloat16 queries (roped, normed, not scaled); H % 8 == 0, <= 256.
      k_new, v_new: [T, K, H] this step's keys (roped) and values, in q's dtype.
      k_pages, v_pages: int8 [P, L, K, 2H + 16] packed digit pools (donate them); zeros when
        fresh (`digit_pool_shape`).
      slot, positions, chain_of, chain_segments, pages_flat, scale, window: as
        `ops.tree_attention`.

    Returns:
      (out [T, N, H] in q's dtype, k_pages, v_pages) with the new rows written.
    """
    tables = (slot, positions, chain_of, chain_segments, pages_flat)
    _check(q, k_new, v_new, k_pages, v_pages, tables, window)
    args = (q, k_new, v_new, k_pages, v_pages, *tables)
    if resolve_impl(impl) == "reference":
        return tree_attention_digits_reference(*args, scale=scale, window=int(window))
    require_target(TARGET)
    outs = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
        jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype),
        jax.ShapeDtypeStruct((digits_split_workspace_floats(q.shape, k_pages.shape),), jnp.float32),
    )
    aliases = {3: 1, 4: 2}  # the pools are updated in place
    call = jax.ffi.ffi_call(TARGET, outs, input_output_aliases=aliases, vmap_method="sequential")
    return tuple(call(*args, scale=np.float32(scale), window=np.int32(window)))[:3]
