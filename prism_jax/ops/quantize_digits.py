"""quantize_digits: per-row symmetric INT8 quantisation of float32 activations in one custom
call, one digit (codes, scales) or two (plus the remainder's codes and scales).

The two-digit INT8 path (ModelConfig.int8_two_digit_rows) quantises the inputs of qkv, o and
gate/up this way. In XLA that was a row max, the codes, the dequantised first digit, the
remainder's max and codes, and the concatenation of both digits for the GEMM: about six fusions
per projection input. The custom call computes the same formulas (numerics.h; the remainder as
glu_quant.h's QuantRemainder, two rounded operations) and writes both digits stacked, [2M, D]
codes and [2M] scales, as Linear's two-digit GEMM takes them. Its results are the reference's
(ops.quantize_rows, then ops.quantize_remainder) bit for bit, on either device.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.dispatch import Impl, resolve_impl
from prism_jax.ops.quantize import quantize_remainder, quantize_rows

OP = "quantize_digits"


def quantize_digits_reference(y, digits: int):
    q, s = quantize_rows(y)
    return (q, s) if digits == 1 else (q, s, *quantize_remainder(y, q, s))


def quantize_digits(y, *, digits: int, impl: Impl | None = None):
    """Rows y float32 [M, D] -> (q1 int8 [M, D], s1 float32 [M]) for one digit, plus
    (q2 int8 [M, D], s2 float32 [M]) for two: q1 * s1 + q2 * s2 reproduces y to about
    1 / (127 * 254) of the row's max. With two digits the halves are slices of the custom
    call's stacked [2M, D] output, so the GEMM that concatenates them again gets that buffer
    itself (XLA folds a concatenate of adjacent slices)."""
    assert digits in (1, 2), f"{OP}: digits must be 1 or 2, got {digits}"
    _checks.require(OP, "y", y, rank=2, dtypes=[jnp.float32], expected="float32 [M, D]")
    if resolve_impl(impl) == "reference":
        return quantize_digits_reference(y, digits)
    require_target("prism_quantize_rows")
    m, d = y.shape
    codes = jax.ShapeDtypeStruct((digits * m, d), jnp.int8)
    scales = jax.ShapeDtypeStruct((digits * m,), jnp.float32)
    call = jax.ffi.ffi_call("prism_quantize_rows", (codes, scales), vmap_method="sequential")
    q, s = call(y, digits=np.int32(digits))
    return (q, s) if digits == 1 else (q[:m], s[:m], q[m:], s[m:])
