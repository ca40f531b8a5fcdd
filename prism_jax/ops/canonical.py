"""The canonical reduction order of cc/numerics.h, in pure jnp, for the references.

Element d of a row belongs to lane (d // VEC) % LANES; each lane sums its elements in
increasing d; the 32 lane sums are combined by the butterfly lane[i] += lane[i + off] for
off = 16, 8, 4, 2, 1. The sequential part runs in lax.scan so XLA cannot reorder it, which
makes these references bit-identical to the kernels, not merely close.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

LANES = 32
VEC = 8
STRIDE = LANES * VEC
VOCAB_TILE = 2048  # cc/numerics.h kVocabTile: vocab rows per vocab_logsumexp partial


def canonical_sum(terms: jax.Array) -> jax.Array:
    """Sums float32 `terms` [..., D] over the last axis in the canonical order -> [...]."""
    assert terms.dtype == jnp.float32, f"canonical_sum takes float32 terms, got {terms.dtype}"
    d = terms.shape[-1]
    blocks = -(-d // STRIDE)
    # Zero padding is exact: a lane starts at +0.0 and x + 0.0 == x for every x it can hold.
    padded = jnp.pad(terms, [(0, 0)] * (terms.ndim - 1) + [(0, blocks * STRIDE - d)])
    lanes = padded.reshape(*terms.shape[:-1], blocks, LANES, VEC)  # (..., B, 32, 8)
    steps = jnp.moveaxis(lanes, -1, -2)  # (..., B, 8, 32): step order is (block, v)
    steps = steps.reshape(*terms.shape[:-1], blocks * VEC, LANES)  # (..., B*8, 32)
    steps = jnp.moveaxis(steps, -2, 0)  # (B*8, ..., 32)

    def add(acc, x):
        return acc + x, None

    acc, _ = jax.lax.scan(add, jnp.zeros(steps.shape[1:], jnp.float32), steps)
    off = LANES // 2
    while off > 0:
        acc = acc[..., :off] + acc[..., off : 2 * off]
        off //= 2
    return acc[..., 0]


def canonical_dot(a: jax.Array, b: jax.Array) -> jax.Array:
    """Canonical-order dot product over the last axis (products rounded before the add)."""
    return canonical_sum(a.astype(jnp.float32) * b.astype(jnp.float32))
