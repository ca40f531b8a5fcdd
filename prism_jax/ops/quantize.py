"""Per-row symmetric INT8 quantisation, exactly as cc/numerics.h: scale = amax * (1/127),
code = round_half_even(y * (127 / amax)), clipped to [-127, 127]; zero rows -> scale 0."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

QMAX = 127.0


def quantize_rows(y: jax.Array) -> tuple[jax.Array, jax.Array]:
    """y float32 [M, D] -> (codes int8 [M, D], scales float32 [M])."""
    amax = jnp.max(jnp.abs(y), axis=-1)  # max is exact in any order
    inverse = jnp.where(amax > 0, jnp.float32(QMAX) / jnp.where(amax > 0, amax, 1.0), 0.0)
    codes = jnp.clip(jnp.round(y * inverse[..., None]), -QMAX, QMAX).astype(jnp.int8)
    return codes, amax * (np.float32(1.0) / np.float32(QMAX))


def dequantize_rows(codes: jax.Array, scales: jax.Array) -> jax.Array:
    return codes.astype(jnp.float32) * scales[..., None]


def quantize_remainder(y: jax.Array, codes: jax.Array, scales: jax.Array):
    """The second INT8 digit of rows y already quantised to (codes, scales): the remainder
    y - codes * scales (at most half a step per element), quantised per row with its own
    scale. codes * scales + digit reproduces y to about 1 / (127 * 254) of the row's max
    instead of 1 / 254. Elementwise and max only: no reduction whose order could vary.

    Returns (codes int8 [M, D], scales float32 [M])."""
    # The barrier keeps XLA from contracting y - codes * scales into an FMA in some fusions
    # (shapes) and not in others: every element is rounded the same way at any batch size.
    y, first = jax.lax.optimization_barrier((y.astype(jnp.float32), dequantize_rows(codes, scales)))
    return quantize_rows(y - first)


def quantize_weight(w: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Weights [N, K] -> (int8 [N, K], per-output-channel scale [N]); same rule as rows."""
    return quantize_rows(w.astype(jnp.float32))
