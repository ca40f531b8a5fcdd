"""Tree attention in INT8 digits: `tree_attention`'s arguments, results and key semantics, with
arithmetic that runs its dots on INT8 tensor cores (cc/ops/attention_digits.h).

Every q, k and v row (token or key, head) is written as two INT8 digits with per-row scales
(the two-digit GEMM path's rule); scores are exact int32 digit dots times the scales; per
64-position key tile the softmax weights times the value scales are cut into digits again and
the weighted values are exact int32 dots; tiles merge in increasing order. Integer sums are
exact in any order and the float work is per element, with an exp built from correctly rounded
operations, so the CPU and CUDA kernels give the same bits, whatever the batch, the pages, the
segment split or the step a prefix was written in. Precision: each row to ~1 / (127 * 254) of
its max (bf16: 1 / 256 of each element); pools and q share one dtype (f32 or bf16); H <= 256.

The pure-jnp reference attends the digits' values with a plain masked softmax: equal within
the weights' rounding (a few 1e-5 of the output's scale), not bitwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.quantize import dequantize_rows, quantize_remainder, quantize_rows
from prism_jax.ops.tree_attention import _check, tree_attention_reference

OP = "tree_attention_digits"
TARGET = "prism_tree_attention_digits"
MAX_HEAD_DIM = 256  # cc/ops/attention_digits.h kDigitMaxHeadDim
CUDA_HEAD_DIMS = (32, 64, 128, 256)  # the CUDA kernel's instantiations


def digit_rows(x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """x [..., H] -> the values of its two INT8 digits per row of H, (c1 * s1, c2 * s2), f32."""
    shape = x.shape
    rows = x.reshape(-1, shape[-1]).astype(jnp.float32)  # (M, H)
    c1, s1 = quantize_rows(rows)
    c2, s2 = quantize_remainder(rows, c1, s1)
    return dequantize_rows(c1, s1).reshape(shape), dequantize_rows(c2, s2).reshape(shape)


def _score_operands(x: jax.Array, role: str) -> jax.Array:
    """[..., H] -> [..., 3H] whose dot products are the kernels' three digit dots:
    [q1 | q1 | q2] . [k1 | k2 | k1] = q1.k1 + q1.k2 + q2.k1 (the q2.k2 term is dropped);
    values [v1 + v2 | 0 | 0] keep the output in the first H."""
    a, b = digit_rows(x)
    if role == "q":
        return jnp.concatenate([a, a, b], axis=-1)
    if role == "k":
        return jnp.concatenate([a, b, a], axis=-1)
    return jnp.concatenate([a + b, jnp.zeros_like(a), jnp.zeros_like(a)], axis=-1)


def tree_attention_digits_reference(
    q, k_new, v_new, k_pages, v_pages, slot, positions, chain_of, chain_segments, pages_flat,
    *, scale: float, window: int = 0,
):  # fmt: skip
    """Plain masked softmax (fp32, HIGHEST dots) on the digits' values, with the kernels' three
    digit dots as scores. Differs from the kernels by their per-tile weight digits only."""
    tables = (slot, positions, chain_of, chain_segments, pages_flat)
    _, k_out, v_out = tree_attention_reference(
        q, k_new, v_new, k_pages, v_pages, *tables, scale=scale, window=window
    )
    out, _, _ = tree_attention_reference(
        _score_operands(q, "q"),
        _score_operands(k_new, "k"),
        _score_operands(v_new, "v"),
        _score_operands(k_pages, "k"),
        _score_operands(v_pages, "v"),
        *tables, scale=scale, window=window,
    )  # fmt: skip
    return out[..., : q.shape[-1]].astype(q.dtype), k_out, v_out


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
    """Writes this step's k/v into the paged pools, then attends each query's chain in digits.

    Args and returns: as `prism_jax.ops.tree_attention`, except that q and the pools must
    share one dtype (float32 or bfloat16) and H <= 256 (32, 64, 128 or 256 on CUDA).
    """
    arrays = (q, k_new, v_new, k_pages, v_pages)
    tables = (slot, positions, chain_of, chain_segments, pages_flat)
    _check(*arrays, *tables, window)
    if q.dtype != k_pages.dtype:
        raise ValueError(
            f"{OP}: q and the pools must share a dtype, got q {_checks.describe(q)} and "
            f"k_pages {_checks.describe(k_pages)}; cast q to the pools' dtype"
        )
    if q.shape[2] > MAX_HEAD_DIM:
        raise ValueError(
            f"{OP}: head dim H must be <= {MAX_HEAD_DIM}, got {_checks.describe(q)}; use "
            "ops.tree_attention (canonical numerics) for larger heads"
        )
    args = (*arrays, *tables)
    if resolve_impl(impl) == "reference":
        return tree_attention_digits_reference(*args, scale=scale, window=int(window))
    require_target(TARGET)
    outs = (
        jax.ShapeDtypeStruct(q.shape, q.dtype),
        jax.ShapeDtypeStruct(k_pages.shape, k_pages.dtype),
        jax.ShapeDtypeStruct(v_pages.shape, v_pages.dtype),
    )
    aliases = {3: 1, 4: 2}  # the pools are updated in place
    call = jax.ffi.ffi_call(TARGET, outs, input_output_aliases=aliases, vmap_method="sequential")
    return tuple(call(*args, scale=np.float32(scale), window=np.int32(window)))
