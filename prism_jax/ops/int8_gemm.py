"""int8_gemm: y = float(x_q @ w_q.T as int32) * s_x[m] * s_w[n], fp32 epilogue in that order.

Shapes: M rows (tokens; leading batch dims are flattened), K input features, N outputs.
x_q int8 [..., K], s_x f32 [...], w_q int8 [N, K] (K contiguous), s_w f32 [N].
`rows=` uses only the first rows of a 2-D x_q (the two-digit model's first digit, read in place
from the buffer that stacks both digits: cc/ops/int8_gemm_shapes.h says why).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from prism_jax.ops import _checks
from prism_jax.ops._registry import extension_module, require_target
from prism_jax.ops.dispatch import Impl, resolve_impl

OP = "int8_gemm"
OUT_DTYPES = (jnp.float32, jnp.bfloat16)


def _check_rows(x_q, rows: int | None) -> None:
    if rows is None:
        return
    if x_q.ndim != 2 or not isinstance(rows, int) or not 0 <= rows <= x_q.shape[0]:
        raise ValueError(
            f"{OP}: rows= takes a leading row count of a 2-D x_q (0 <= rows <= "
            f"{x_q.shape[0] if x_q.ndim == 2 else 'M'}), got rows={rows!r} with "
            f"{_checks.describe(x_q)}"
        )


def _check(x_q, s_x, w_q, s_w, out_dtype) -> None:
    _checks.require(OP, "w_q", w_q, rank=2, dtypes=[jnp.int8], expected="int8 [N, K]")
    n, k = w_q.shape
    if x_q.ndim < 1 or x_q.dtype != jnp.int8 or x_q.shape[-1] != k:
        raise ValueError(
            f"{OP}: x_q must be int8 [..., K] with K = {k} (w_q is {_checks.describe(w_q)}), "
            f"got {_checks.describe(x_q)}"
        )
    if s_x.dtype != jnp.float32 or s_x.shape != x_q.shape[:-1]:
        raise ValueError(
            f"{OP}: s_x must be float32 {list(x_q.shape[:-1])} (one scale per row of x_q), "
            f"got {_checks.describe(s_x)}"
        )
    _checks.require(OP, "s_w", s_w, rank=1, dtypes=[jnp.float32], expected=f"float32 [{n}]")
    _checks.require_dim(OP, "s_w", s_w, 0, n, f"float32 [{n}] (one scale per row of w_q)")
    if jnp.dtype(out_dtype) not in [jnp.dtype(d) for d in OUT_DTYPES]:
        raise ValueError(f"{OP}: out_dtype must be float32 or bfloat16, got {out_dtype}")


def int8_gemm_reference(x_q, s_x, w_q, s_w, out_dtype=jnp.float32) -> jax.Array:
    """Pure-jnp reference: exact int32 dot, then the same fp32 epilogue."""
    acc = jax.lax.dot_general(
        x_q, w_q, (((x_q.ndim - 1,), (1,)), ((), ())), preferred_element_type=jnp.int32
    )
    y = acc.astype(jnp.float32) * s_x[..., None] * s_w
    return y.astype(out_dtype)


def workspace_bytes(m: int, k: int, n: int, out_dtype) -> int:
    """Bytes of the workspace result prism_int8_gemm gets: what the CUDA handler's kernel for
    this shape needs (stream-K partial sums; cc/ops/int8_gemm_sm90.cuh), at least 1. The
    handler picks its kernel from the shape and PRISM_INT8_GEMM_KERNEL, as this asks it at
    trace time; a workspace too small for the kernel in force at run time makes it run the
    kernel's data-parallel twin (same bits). CPU-only builds and machines without a CUDA device
    need none."""
    module = extension_module()
    if module is None or not getattr(module, "with_cuda", False):
        return 1
    f32 = jnp.dtype(out_dtype) == jnp.dtype(jnp.float32)
    return max(1, int(module.int8_gemm_workspace_bytes(m, k, n, f32)))


def _int8_gemm_ffi(x_q, s_x, w_q, s_w, out_dtype, rows: int | None) -> jax.Array:
    require_target("prism_int8_gemm")
    lead = x_q.shape[:-1] if rows is None else (rows,)
    x2 = x_q.reshape(-1, x_q.shape[-1])  # (R, K)
    m, k, n = math.prod(lead), x2.shape[1], w_q.shape[0]
    # y's M rows (at most R) say how many leading rows of x_q the handler uses.
    call = jax.ffi.ffi_call(
        "prism_int8_gemm",
        (
            jax.ShapeDtypeStruct((m, n), out_dtype),
            jax.ShapeDtypeStruct((workspace_bytes(m, k, n, out_dtype),), jnp.uint8),
        ),
        vmap_method="sequential",
    )
    y, _ = call(x2, s_x.reshape(-1), w_q, s_w)
    return y.reshape(*lead, n)  # (..., N)


def int8_gemm(
    x_q, s_x, w_q, s_w, *, out_dtype=jnp.float32, rows: int | None = None, impl: Impl | None = None
):
    """INT8 x INT8 -> INT32 GEMM with per-row and per-column scales.

    Args:
      x_q: int8 [..., K] quantised activations.
      s_x: float32 [...] per-row activation scales.
      w_q: int8 [N, K] quantised weights (one row per output feature).
      s_w: float32 [N] per-output-channel weight scales.
      out_dtype: float32 or bfloat16.
      rows: with a 2-D x_q [R, K], only its first `rows` rows (and scales): y is [rows, N],
        the same bits as int8_gemm(x_q[:rows], s_x[:rows], ...) without the slice's copy.
      impl: "ffi" (custom call) or "reference"; default from `use_impl`.

    Returns:
      [..., N] array of out_dtype ([rows, N] with rows=).
    """
    _check(x_q, s_x, w_q, s_w, out_dtype)
    _check_rows(x_q, rows)
    if resolve_impl(impl) == "reference":
        if rows is not None:
            x_q, s_x = x_q[:rows], s_x[:rows]
        return int8_gemm_reference(x_q, s_x, w_q, s_w, out_dtype)
    return _int8_gemm_ffi(x_q, s_x, w_q, s_w, out_dtype, rows)
