"""RMSNorm custom calls (D model dim; leading dims are rows and are flattened):

  rmsnorm(x, gamma)                      -> y (x's dtype)             post-norms, qk-norm
  rmsnorm_quant(x, gamma)                -> (x_q int8, s_x f32)        before a projection
  add_rmsnorm_quant(x, residual, gamma)  -> (x_q, s_x, h = x + residual in x's dtype)
  add_rmsnorm(x, residual, gamma)        -> (y, h)                      two-digit inputs
  add_rmsnorm_quant_sum(y2, y_w2, residual, gamma): add_rmsnorm_quant of x = y2[:M] + (y2[M:]
                                         + y_w2), a two-digit projection's partial products
  x_gamma= on the add_* forms: h = rmsnorm(x, x_gamma) + residual (Gemma's post-norm, fused)
  digits=2 on the *_quant forms (float32 x): y's second digit too, as quantize_digits(y, 2)

y = (h * 1/sqrt(mean(h^2) + eps)) * (weight_offset + gamma); Gemma uses weight_offset = 1.
The sum of squares follows the canonical order (canonical.py), so the reference is bitwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.canonical import canonical_sum
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.quantize_digits import quantize_digits_reference


def _check(op: str, x, gamma, residual=None, x_gamma=None) -> None:
    if x.ndim < 1:
        raise ValueError(f"{op}: x must be float32 or bfloat16 [..., D], got a scalar")
    _checks.require(op, "x", x, rank=x.ndim, dtypes=_checks.FLOAT_ACTIVATIONS, expected="[..., D]")
    d = x.shape[-1]
    for name, g in (("gamma", gamma), ("x_gamma", x_gamma)):
        if g is None:
            continue
        _checks.require(op, name, g, rank=1, dtypes=[jnp.float32, jnp.bfloat16], expected=f"[{d}]")
        _checks.require_dim(op, name, g, 0, d, f"[D] with D = {d} (x is {_checks.describe(x)})")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"{op}: residual must match x ({_checks.describe(x)}), got {_checks.describe(residual)}"
        )


def _normalize_reference(h, gamma, eps: float, weight_offset: float):
    """h float32 [..., D] -> y float32 [..., D] with the kernels' exact arithmetic."""
    d = h.shape[-1]
    ss = canonical_sum(h * h)
    inv_d = np.float32(1.0) / np.float32(d)  # numerics.h: reciprocal first, then multiply
    # Barriers keep XLA from contracting ss * inv_d + eps into an FMA and from rewriting
    # 1 / sqrt(v) into rsqrt(v); the kernels round the product and use IEEE sqrt and division.
    mean = jax.lax.optimization_barrier(ss * inv_d)
    root = jax.lax.optimization_barrier(jnp.sqrt(mean + jnp.float32(eps)))
    inv = jnp.float32(1.0) / root
    weight = jnp.float32(weight_offset) + gamma.astype(jnp.float32)
    return (h * inv[..., None]) * weight


def _ffi(target: str, outs, *args, eps: float, weight_offset: float, **attrs):
    require_target(target)
    call = jax.ffi.ffi_call(target, outs, vmap_method="sequential")
    return call(*args, eps=np.float32(eps), weight_offset=np.float32(weight_offset), **attrs)


def _check_digits(op: str, x, digits: int) -> None:
    if digits not in (1, 2):
        raise ValueError(f"{op}: digits must be 1 or 2, got {digits!r}")
    if digits == 2 and x.dtype != jnp.float32:
        raise ValueError(
            f"{op}: two digits need float32 rows (the int8 model's activations), got "
            f"{_checks.describe(x)}; cast x to float32 or quantise with one digit"
        )


def _digit_outs(m: int, d: int, digits: int):
    """The quantising calls' codes [digits * M, D] and scales [digits * M]."""
    return (
        jax.ShapeDtypeStruct((digits * m, d), jnp.int8),
        jax.ShapeDtypeStruct((digits * m,), jnp.float32),
    )


def _split_digits(q, s, lead: tuple[int, ...], digits: int):
    """(q1, s1) or (q1, s1, q2, s2) in x's leading shape, from the stacked [digits * M] rows.
    The halves are slices of one buffer, so a GEMM that stacks them again gets it whole."""
    m, d = q.shape[0] // digits, q.shape[1]
    parts = [(q[i * m : (i + 1) * m], s[i * m : (i + 1) * m]) for i in range(digits)]
    return tuple(a for qi, si in parts for a in (qi.reshape(*lead, d), si.reshape(lead)))


def _quantize_reference(y, lead: tuple[int, ...], digits: int):
    out = quantize_digits_reference(y.reshape(-1, y.shape[-1]), digits)
    return tuple(a.reshape(*lead, *a.shape[1:]) for a in out)


def _rows(x):
    return x.reshape(-1, x.shape[-1])  # (M, D)


def rmsnorm(x, gamma, *, eps: float, weight_offset: float = 0.0, impl: Impl | None = None):
    """RMSNorm with float output in x's dtype. Args: x [..., D] f32|bf16, gamma [D]."""
    _check("rmsnorm", x, gamma)
    if resolve_impl(impl) == "reference":
        y = _normalize_reference(x.astype(jnp.float32), gamma, eps, weight_offset)
        return y.astype(x.dtype)
    x2 = _rows(x)
    y = _ffi(
        "prism_rmsnorm",
        jax.ShapeDtypeStruct(x2.shape, x.dtype),
        x2,
        gamma.astype(jnp.float32),
        eps=eps,
        weight_offset=weight_offset,
    )
    return y.reshape(x.shape)


def rmsnorm_quant(
    x,
    gamma,
    *,
    eps: float,
    weight_offset: float = 0.0,
    digits: int = 1,
    impl: Impl | None = None,
):
    """RMSNorm then per-row INT8 quantisation.

    Args:
      x: [..., D] float32 or bfloat16 (float32 for two digits).
      gamma: [D] norm weight.
      eps: the model's epsilon.
      weight_offset: 0 for plain RMSNorm, 1 for Gemma's (1 + gamma).
      digits: 2 also quantises each row's remainder (quantize_digits' second digit).

    Returns:
      (x_q int8 [..., D], s_x float32 [...]), then (x_q2, s_x2) with two digits.
    """
    _check("rmsnorm_quant", x, gamma)
    _check_digits("rmsnorm_quant", x, digits)
    lead = x.shape[:-1]
    if resolve_impl(impl) == "reference":
        y = _normalize_reference(x.astype(jnp.float32), gamma, eps, weight_offset)
        return _quantize_reference(y, lead, digits)
    x2 = _rows(x)
    q, s = _ffi(
        "prism_rmsnorm_quant",
        _digit_outs(*x2.shape, digits),
        x2,
        gamma.astype(jnp.float32),
        eps=eps,
        weight_offset=weight_offset,
        digits=np.int32(digits),
    )
    return _split_digits(q, s, lead, digits)


def _residual_sum_reference(x, residual, x_gamma, eps: float, weight_offset: float):
    """h = [rmsnorm(x, x_gamma) rounded to x's dtype] + residual, rounded to x's dtype."""
    if x_gamma is not None:  # the barrier keeps XLA from fusing its last product into the add
        y = _normalize_reference(x.astype(jnp.float32), x_gamma, eps, weight_offset)
        x = jax.lax.optimization_barrier(y.astype(x.dtype))
    return (x.astype(jnp.float32) + residual.astype(jnp.float32)).astype(x.dtype)


def add_rmsnorm_quant(
    x,
    residual,
    gamma,
    *,
    eps: float,
    weight_offset: float = 0.0,
    x_gamma=None,
    digits: int = 1,
    impl: Impl | None = None,
):
    """h = x + residual (rounded to x's dtype), then rmsnorm_quant(h, digits=digits).

    x_gamma: normalise x first (RMSNorm with this weight, the same eps and offset, rounded to
    x's dtype), all in one custom call: Gemma's post-norm on the block output x, fused.

    Returns:
      (x_q int8 [..., D], s_x float32 [...], [x_q2, s_x2,] h [..., D] in x's dtype).
    """
    _check("add_rmsnorm_quant", x, gamma, residual, x_gamma)
    _check_digits("add_rmsnorm_quant", x, digits)
    lead = x.shape[:-1]
    if resolve_impl(impl) == "reference":
        h = _residual_sum_reference(x, residual, x_gamma, eps, weight_offset)
        y = _normalize_reference(h.astype(jnp.float32), gamma, eps, weight_offset)
        return (*_quantize_reference(y, lead, digits), h)
    m, d = _rows(x).shape
    outs = (*_digit_outs(m, d, digits), jax.ShapeDtypeStruct((m, d), x.dtype))
    q, s, h = _add_ffi(
        "prism_add_rmsnorm_quant",
        outs,
        x,
        residual,
        gamma,
        x_gamma,
        eps,
        weight_offset,
        digits=np.int32(digits),
    )
    return (*_split_digits(q, s, lead, digits), h.reshape(x.shape))


def _check_stacked(op: str, y2, y_w2) -> None:
    """y2 must be the float32 [2M, D] stack (x1 W1 over x2 W1) of y_w2's float32 [M, D]."""
    stacked = (2 * y_w2.shape[0], *y_w2.shape[1:])
    if y_w2.dtype != jnp.float32 or y2.dtype != jnp.float32 or y2.shape != stacked:
        raise ValueError(
            f"{op}: y2 must be float32 [2M, D] = {list(stacked)} for y_w2 float32 "
            f"{_checks.describe(y_w2)} (rows x1 W1, then x2 W1), got {_checks.describe(y2)}"
        )


def add_rmsnorm_quant_sum(
    y2,
    y_w2,
    residual,
    gamma,
    *,
    eps: float,
    weight_offset: float = 0.0,
    x_gamma=None,
    digits: int = 1,
    impl: Impl | None = None,
):
    """add_rmsnorm_quant of x = y2[:M] + (y2[M:] + y_w2): a two-digit projection's partial
    products (Linear.int8_partials: x1 W1 stacked over x2 W1, and x1 W2), added in the kernel
    in Linear's order, so the results are add_rmsnorm_quant's of Linear's own output, bit for
    bit, without XLA writing that sum out and the kernel reading it back.

    Args:
      y2: float32 [2M, D]; y_w2, residual: float32 [M, D]; gamma, x_gamma: [D].

    Returns:
      as add_rmsnorm_quant: (x_q, s_x, [x_q2, s_x2,] h), h [M, D] float32.
    """
    op = "add_rmsnorm_quant_sum"
    _check(op, y_w2, gamma, residual, x_gamma)
    _check_digits(op, y_w2, digits)
    _check_stacked(op, y2, y_w2)
    m = y_w2.shape[0]
    if resolve_impl(impl) == "reference":
        x = y2[:m] + (y2[m:] + y_w2)  # Linear's order
        return add_rmsnorm_quant(
            x, residual, gamma, eps=eps, weight_offset=weight_offset, x_gamma=x_gamma,
            digits=digits, impl="reference",
        )  # fmt: skip
    outs = (*_digit_outs(m, y_w2.shape[1], digits), jax.ShapeDtypeStruct(y_w2.shape, y_w2.dtype))
    q, s, h = _add_ffi(
        "prism_add_rmsnorm_quant_sum",
        outs,
        y2,
        residual,
        gamma,
        x_gamma,
        eps,
        weight_offset,
        parts=(y_w2,),
        digits=np.int32(digits),
    )
    return (*_split_digits(q, s, (m,), digits), h)


def add_rmsnorm(
    x,
    residual,
    gamma,
    *,
    eps: float,
    weight_offset: float = 0.0,
    x_gamma=None,
    impl: Impl | None = None,
):
    """h = x + residual (rounded to x's dtype), then rmsnorm(h) with float output, in one
    custom call (the two-digit INT8 path quantises y itself, ops.quantize_digits). x_gamma:
    as add_rmsnorm_quant's.

    Returns:
      (y [..., D], h [..., D]), both in x's dtype.
    """
    _check("add_rmsnorm", x, gamma, residual, x_gamma)
    if resolve_impl(impl) == "reference":
        h = _residual_sum_reference(x, residual, x_gamma, eps, weight_offset)
        y = _normalize_reference(h.astype(jnp.float32), gamma, eps, weight_offset)
        return y.astype(x.dtype), h
    rows = jax.ShapeDtypeStruct(_rows(x).shape, x.dtype)
    y, h = _add_ffi(
        "prism_add_rmsnorm", (rows, rows), x, residual, gamma, x_gamma, eps, weight_offset
    )
    return y.reshape(x.shape), h.reshape(x.shape)


def _add_ffi(
    target: str,
    outs,
    x,
    residual,
    gamma,
    x_gamma,
    eps: float,
    weight_offset: float,
    parts: tuple = (),
    **attrs,
):
    """The add_* custom call on rows of x (then `parts`, the _sum forms' y_w2) and residual;
    with x_gamma its prism_norm_* form, which takes x_gamma after residual."""
    pre = ()
    if x_gamma is not None:
        target, pre = target.replace("prism_", "prism_norm_", 1), (x_gamma.astype(jnp.float32),)
    args = (_rows(x), *map(_rows, parts), _rows(residual), *pre, gamma.astype(jnp.float32))
    return _ffi(target, outs, *args, eps=eps, weight_offset=weight_offset, **attrs)
