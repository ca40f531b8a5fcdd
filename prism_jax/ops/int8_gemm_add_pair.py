"""int8_gemm_add_pair: y = pair[:M] + (pair[M:] + int8_gemm(x_q, s_x, w_q, s_w)), all fp32.

The two-digit projection's last GEMM with its partial-sum adds fused into the epilogue. A
two-digit Linear computes pair = [x1; x2] W1 (one GEMM over both activation digits, 2M rows),
then x1 W2, and adds them as pair[:M] + (pair[M:] + x1 W2). XLA would read the three [M, N]
partials back and write the sum; here the GEMM's epilogue reads the two halves of `pair` and
writes the sum once. The association is the same, so the bits are too.

Shapes: x_q int8 [M, K], s_x f32 [M], w_q int8 [N, K], s_w f32 [N], pair f32 [2M, N].
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.int8_gemm import int8_gemm_reference

OP = "int8_gemm_add_pair"


def _check(x_q, s_x, w_q, s_w, pair) -> None:
    _checks.require(OP, "x_q", x_q, rank=2, dtypes=[jnp.int8], expected="int8 [M, K]")
    _checks.require(OP, "w_q", w_q, rank=2, dtypes=[jnp.int8], expected="int8 [N, K]")
    (m, k), n = x_q.shape, w_q.shape[0]
    _checks.require_dim(OP, "w_q", w_q, 1, k, f"int8 [N, {k}] (x_q's K)")
    _checks.require(OP, "s_x", s_x, rank=1, dtypes=[jnp.float32], expected=f"float32 [{m}]")
    _checks.require_dim(OP, "s_x", s_x, 0, m, f"float32 [{m}] (one scale per row of x_q)")
    _checks.require(OP, "s_w", s_w, rank=1, dtypes=[jnp.float32], expected=f"float32 [{n}]")
    _checks.require_dim(OP, "s_w", s_w, 0, n, f"float32 [{n}] (one scale per row of w_q)")
    expected = f"float32 [{2 * m}, {n}] (two [M, N] partials stacked)"
    _checks.require(OP, "pair", pair, rank=2, dtypes=[jnp.float32], expected=expected)
    if pair.shape != (2 * m, n):
        raise ValueError(f"{OP}: pair must be {expected}, got {_checks.describe(pair)}")


def int8_gemm_add_pair_reference(x_q, s_x, w_q, s_w, pair) -> jax.Array:
    """Pure-jnp reference: the GEMM's reference, then the two adds in the contract's order."""
    m = x_q.shape[0]
    # The barrier keeps XLA from fusing the epilogue's multiplies with the adds, where its CPU
    # backend contracts them into FMAs (one rounding instead of two: other bits).
    y = jax.lax.optimization_barrier(int8_gemm_reference(x_q, s_x, w_q, s_w, jnp.float32))
    return pair[:m] + (pair[m:] + y)


def _int8_gemm_add_pair_ffi(x_q, s_x, w_q, s_w, pair) -> jax.Array:
    require_target("prism_int8_gemm_add_pair")
    call = jax.ffi.ffi_call(
        "prism_int8_gemm_add_pair",
        jax.ShapeDtypeStruct((x_q.shape[0], w_q.shape[0]), jnp.float32),
        vmap_method="sequential",
    )
    return call(x_q, s_x, w_q, s_w, pair)


def int8_gemm_add_pair(x_q, s_x, w_q, s_w, pair, *, impl: Impl | None = None) -> jax.Array:
    """pair[:M] + (pair[M:] + int8_gemm(x_q, s_x, w_q, s_w)) in fp32, one custom call.

    Args:
      x_q: int8 [M, K] quantised activations.
      s_x: float32 [M] per-row activation scales.
      w_q: int8 [N, K] quantised weights.
      s_w: float32 [N] per-output-channel weight scales.
      pair: float32 [2M, N], the two partial outputs to add, stacked.
      impl: "ffi" (custom call) or "reference"; default from `use_impl`.

    Returns:
      float32 [M, N].
    """
    _check(x_q, s_x, w_q, s_w, pair)
    if resolve_impl(impl) == "reference":
        return int8_gemm_add_pair_reference(x_q, s_x, w_q, s_w, pair)
    return _int8_gemm_add_pair_ffi(x_q, s_x, w_q, s_w, pair)
