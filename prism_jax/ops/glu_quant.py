"""glu_quant: a = act(gate) * up, then per-row INT8 quantisation (F ffw dim; rows flattened);
glu_quant2: the same plus the second INT8 digit of each row, in one custom call.
glu_quant2_sum: glu_quant2 of a two-digit projection's partial products, summed in the kernel.

The custom calls read the fused gate/up projection's output [..., 2, F] as it is
(`glu_quant_pair`, `glu_quant2_pair`: what the model calls): slicing gate and up out of it
first cost XLA a copy of both halves, about 20 us per 27B layer at 256 tokens on an H200.
`glu_quant(gate, up)` and `glu_quant2(gate, up)` take the halves apart and stack them.

Activations: "gelu_tanh" (Gemma) and "silu" (Llama, Qwen). The transcendental functions run
inside the custom call so XLA cannot vectorise them differently for different batch shapes;
the reference uses XLA's tanh/exp and therefore matches to rounding, not bitwise.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.quantize import quantize_remainder, quantize_rows

OP = "glu_quant"
ACTIVATIONS = {"gelu_tanh": 0, "silu": 1}


def gelu_tanh(x):
    """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), in numerics.h's operation order."""
    inner = jnp.float32(0.7978845608028654) * (x + jnp.float32(0.044715) * ((x * x) * x))
    return jnp.float32(0.5) * x * (jnp.float32(1.0) + jnp.tanh(inner))


def silu(x):
    return x / (jnp.float32(1.0) + jnp.exp(-x))


def _check_activation(activation: str) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(
            f"{OP}: activation must be one of {sorted(ACTIVATIONS)}, got {activation!r}"
        )


def _check(gate, up, activation: str) -> None:
    _check_activation(activation)
    if gate.ndim < 1:
        raise ValueError(f"{OP}: gate must be float32 or bfloat16 [..., F], got a scalar")
    _checks.require(
        OP, "gate", gate, rank=gate.ndim, dtypes=_checks.FLOAT_ACTIVATIONS, expected="[..., F]"
    )
    if up.shape != gate.shape or up.dtype != gate.dtype:
        raise ValueError(
            f"{OP}: up must match gate ({_checks.describe(gate)}), got {_checks.describe(up)}"
        )


def _check_pair(gate_up, activation: str) -> None:
    if getattr(gate_up, "ndim", 0) < 2 or gate_up.shape[-2] != 2:
        got = _checks.describe(gate_up) if hasattr(gate_up, "shape") else type(gate_up).__name__
        raise ValueError(f"{OP}: gate_up must be [..., 2, F] (gate, then up), got {got}")
    _check_activation(activation)
    _checks.require(
        OP,
        "gate_up",
        gate_up,
        rank=gate_up.ndim,
        dtypes=_checks.FLOAT_ACTIVATIONS,
        expected="[..., 2, F] (gate, then up)",
    )


def _rows(gate_up):
    """[..., 2, F] -> [M, 2F]: a free reshape (each row is gate, then up, in memory)."""
    return gate_up.reshape(-1, 2 * gate_up.shape[-1])


def glu_quant_reference(gate, up, activation: str):
    act = gelu_tanh if activation == "gelu_tanh" else silu
    return quantize_rows(act(gate.astype(jnp.float32)) * up.astype(jnp.float32))


def glu_quant(gate, up, *, activation: str, impl: Impl | None = None):
    """Gated activation with INT8 output.

    Args:
      gate: [..., F] float32 or bfloat16.
      up: [..., F], same dtype.
      activation: "gelu_tanh" or "silu".

    Returns:
      (a_q int8 [..., F], s_a float32 [...]).
    """
    _check(gate, up, activation)
    return glu_quant_pair(jnp.stack([gate, up], axis=-2), activation=activation, impl=impl)


def glu_quant_pair(gate_up, *, activation: str, impl: Impl | None = None):
    """glu_quant of the fused projection output gate_up [..., 2, F] (gate = [..., 0, :])."""
    _check_pair(gate_up, activation)
    if resolve_impl(impl) == "reference":
        return glu_quant_reference(gate_up[..., 0, :], gate_up[..., 1, :], activation)
    require_target("prism_glu_quant")
    rows = _rows(gate_up)  # (M, 2F)
    m, f = rows.shape[0], gate_up.shape[-1]
    outs = (jax.ShapeDtypeStruct((m, f), jnp.int8), jax.ShapeDtypeStruct((m,), jnp.float32))
    call = jax.ffi.ffi_call("prism_glu_quant", outs, vmap_method="sequential")
    q, s = call(rows, activation=np.int32(ACTIVATIONS[activation]))
    lead = gate_up.shape[:-2]
    return q.reshape(*lead, f), s.reshape(lead)


def glu_quant2_reference(gate, up, activation: str):
    act = gelu_tanh if activation == "gelu_tanh" else silu
    a = act(gate.astype(jnp.float32)) * up.astype(jnp.float32)
    q1, s1 = quantize_rows(a)
    return q1, s1, *quantize_remainder(a, q1, s1)


def glu_quant2(gate, up, *, activation: str, impl: Impl | None = None):
    """Gated activation with two INT8 digits per row, in one custom call.

    (q1, s1) are glu_quant's outputs, bit for bit; (q2, s2) quantise the remainder
    act(gate) * up - q1 * s1 per row with the same rule (quantize_rows), so q1 * s1 + q2 * s2
    reproduces the activation to about 1 / (127 * 254) of the row's max. The activation, and
    so the remainder, never leaves the kernel: no XLA tanh/exp on this path (on the GPU they
    are not row-invariant).

    Args:
      gate: [..., F] float32 or bfloat16.
      up: [..., F], same dtype.
      activation: "gelu_tanh" or "silu".

    Returns:
      (q1 int8 [..., F], s1 float32 [...], q2 int8 [..., F], s2 float32 [...]).
    """
    _check(gate, up, activation)
    return glu_quant2_pair(jnp.stack([gate, up], axis=-2), activation=activation, impl=impl)


def glu_quant2_pair(gate_up, *, activation: str, impl: Impl | None = None):
    """glu_quant2 of the fused projection output gate_up [..., 2, F] (gate = [..., 0, :])."""
    _check_pair(gate_up, activation)
    if resolve_impl(impl) == "reference":
        return glu_quant2_reference(gate_up[..., 0, :], gate_up[..., 1, :], activation)
    require_target("prism_glu_quant2")
    rows = _rows(gate_up)  # (M, 2F)
    m, f = rows.shape[0], gate_up.shape[-1]
    codes = jax.ShapeDtypeStruct((m, f), jnp.int8)
    scales = jax.ShapeDtypeStruct((m,), jnp.float32)
    call = jax.ffi.ffi_call(
        "prism_glu_quant2", (codes, scales, codes, scales), vmap_method="sequential"
    )
    q1, s1, q2, s2 = call(rows, activation=np.int32(ACTIVATIONS[activation]))
    lead = gate_up.shape[:-2]
    return q1.reshape(*lead, f), s1.reshape(lead), q2.reshape(*lead, f), s2.reshape(lead)


def _check_sum(y2, y_w2, activation: str) -> None:
    _check_activation(activation)
    _checks.require(OP, "y_w2", y_w2, rank=3, dtypes=[jnp.float32], expected="[M, 2, F]")
    if y_w2.shape[1] != 2:
        raise ValueError(f"{OP}: y_w2 must be [M, 2, F] (gate, then up), got "
                         f"{_checks.describe(y_w2)}")  # fmt: skip
    m = y_w2.shape[0]
    if getattr(y2, "shape", None) != (2 * m, *y_w2.shape[1:]) or y2.dtype != jnp.float32:
        got = _checks.describe(y2) if hasattr(y2, "shape") else type(y2).__name__
        raise ValueError(
            f"{OP}: y2 must be float32 [2M, 2, F] = {[2 * m, *y_w2.shape[1:]]} for y_w2 "
            f"{_checks.describe(y_w2)} (rows x1 W1, then x2 W1), got {got}"
        )


def glu_quant2_sum_reference(y2, y_w2, activation: str):
    m = y_w2.shape[0]
    gate_up = y2[:m] + (y2[m:] + y_w2)  # Int8Linear's order
    return glu_quant2_reference(gate_up[:, 0], gate_up[:, 1], activation)


def glu_quant2_sum(y2, y_w2, *, activation: str, impl: Impl | None = None):
    """glu_quant2 of gate_up = y2[:M] + (y2[M:] + y_w2): a two-digit projection's partial
    products (Int8Linear.int8_partials: x1 W1 and x2 W1 stacked, and x1 W2), added in the
    kernel in Int8Linear's order, so the result is glu_quant2_pair of Int8Linear's output, bit
    for bit, without XLA writing that sum out and the kernel reading it back.

    Args:
      y2: float32 [2M, 2, F].
      y_w2: float32 [M, 2, F].
      activation: "gelu_tanh" or "silu".

    Returns:
      (q1 int8 [M, F], s1 float32 [M], q2 int8 [M, F], s2 float32 [M]). The custom call
      writes them stacked ([2M, F] codes, [2M] scales) and these are its halves: the two-digit
      GEMM that concatenates them again gets the custom call's buffer itself (XLA folds a
      concatenate of adjacent slices), not a copy.
    """
    _check_sum(y2, y_w2, activation)
    if resolve_impl(impl) == "reference":
        return glu_quant2_sum_reference(y2, y_w2, activation)
    require_target("prism_glu_quant2_sum")
    m, f = y_w2.shape[0], y_w2.shape[-1]
    codes = jax.ShapeDtypeStruct((2 * m, f), jnp.int8)
    scales = jax.ShapeDtypeStruct((2 * m,), jnp.float32)
    call = jax.ffi.ffi_call("prism_glu_quant2_sum", (codes, scales), vmap_method="sequential")
    q, s = call(_rows(y2), _rows(y_w2), activation=np.int32(ACTIVATIONS[activation]))
    return q[:m], s[:m], q[m:], s[m:]
