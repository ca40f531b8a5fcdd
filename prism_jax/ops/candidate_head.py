"""Candidate readout (R readout rows, C candidates per row, D model dim, V vocab):

  candidate_head(hidden [R, D], embedding [V, D], ids int32 [R, C], counts int32 [R])
      -> (logits f32 [R, C], logprobs f32 [R, C]) renormalised over each row's first
         counts[r] candidates; padding entries are -inf.
  vocab_logsumexp(hidden [R, D], embedding [V, D]) -> lse f32 [R] over the whole vocabulary,
      streamed in tiles of VOCAB_TILE rows, never materialising [R, V] in the kernel.

Both use the canonical dot, so logits[r, c] - lse[r] is candidate c's full-vocabulary
log-probability. An optional softcap applies cap * tanh(logit / cap) (0 disables).
Rows with counts outside [1, C] and ids outside [0, V) produce NaN (checked here when the
values are concrete).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops import _checks
from prism_jax.ops._registry import require_target
from prism_jax.ops.canonical import VOCAB_TILE, canonical_dot
from prism_jax.ops.dispatch import Impl, resolve_impl


def _check_hidden_embedding(op: str, hidden, embedding) -> None:
    _checks.require(
        op, "hidden", hidden, rank=2, dtypes=_checks.FLOAT_ACTIVATIONS, expected="[R, D]"
    )
    _checks.require(
        op,
        "embedding",
        embedding,
        rank=2,
        dtypes=_checks.FLOAT_ACTIVATIONS,
        expected=f"[V, D] with D = {hidden.shape[1]}",
    )
    _checks.require_dim(
        op,
        "embedding",
        embedding,
        1,
        hidden.shape[1],
        f"[V, D] with D = {hidden.shape[1]} (hidden is {_checks.describe(hidden)})",
    )
    _checks.require_nonempty(op, "embedding", embedding, "[V, D]")


def _check_candidates(hidden, embedding, ids, counts) -> None:
    op = "candidate_head"
    r = hidden.shape[0]
    expected = f"int32 [R, C] with R = {r}"
    _checks.require(op, "ids", ids, rank=2, dtypes=[jnp.int32], expected=expected)
    _checks.require_dim(op, "ids", ids, 0, r, f"int32 [R, C] with R = {r}")
    _checks.require_nonempty(op, "ids", ids, "int32 [R, C] (C >= 1 candidates per row)")
    _checks.require(op, "counts", counts, rank=1, dtypes=[jnp.int32], expected=f"int32 [{r}]")
    _checks.require_dim(op, "counts", counts, 0, r, f"int32 [{r}] (one count per row)")
    if isinstance(counts, jax.core.Tracer) or isinstance(ids, jax.core.Tracer):
        return  # values unknown at trace time; the kernel writes NaN for invalid rows
    counts_np, ids_np = np.asarray(counts), np.asarray(ids)
    bad = np.nonzero((counts_np < 1) | (counts_np > ids.shape[1]))[0]
    if bad.size:
        raise ValueError(
            f"candidate_head: counts must be in [1, C = {ids.shape[1]}] (an empty candidate row "
            f"has no distribution); row {int(bad[0])} has {int(counts_np[bad[0]])}"
        )
    valid = np.arange(ids.shape[1])[None, :] < counts_np[:, None]
    v = embedding.shape[0]
    if np.any(valid & ((ids_np < 0) | (ids_np >= v))):
        raise ValueError(f"candidate_head: ids must be token ids in [0, V = {v})")


def _softcap(logits, softcap: float):
    if softcap > 0:
        return jnp.float32(softcap) * jnp.tanh(logits * (np.float32(1.0) / np.float32(softcap)))
    return logits


def candidate_head_reference(hidden, embedding, ids, counts, softcap: float = 0.0):
    rows = embedding[jnp.clip(ids, 0, embedding.shape[0] - 1)]  # (R, C, D)
    logits = _softcap(canonical_dot(hidden[:, None, :], rows), softcap)  # (R, C)
    valid = jnp.arange(ids.shape[1])[None, :] < counts[:, None]
    logits = jnp.where(valid, logits, -jnp.inf)
    lse = jax.nn.logsumexp(logits, axis=-1, keepdims=True)
    return logits, jnp.where(valid, logits - lse, -jnp.inf)


def candidate_head(
    hidden, embedding, ids, counts, *, softcap: float = 0.0, impl: Impl | None = None
):
    """Scores each row's candidate tokens and renormalises over them.

    Args:
      hidden: [R, D] final-normed hidden states at the readout positions.
      embedding: [V, D] output embedding (tied input embedding for Gemma).
      ids: int32 [R, C] candidate token ids, padded.
      counts: int32 [R] number of valid candidates per row (1..C).
      softcap: final logit soft-capping (0 = none).

    Returns:
      (logits float32 [R, C], logprobs float32 [R, C]).
    """
    _check_hidden_embedding("candidate_head", hidden, embedding)
    _check_candidates(hidden, embedding, ids, counts)
    if resolve_impl(impl) == "reference":
        return candidate_head_reference(hidden, embedding, ids, counts, softcap)
    require_target("prism_candidate_head")
    out = jax.ShapeDtypeStruct(ids.shape, jnp.float32)
    call = jax.ffi.ffi_call("prism_candidate_head", (out, out), vmap_method="sequential")
    return tuple(call(hidden, embedding, ids, counts, softcap=np.float32(softcap)))


def vocab_logsumexp_reference(hidden, embedding, softcap: float = 0.0):
    logits = jnp.einsum(
        "rd,vd->rv",
        hidden.astype(jnp.float32),
        embedding.astype(jnp.float32),
        precision=jax.lax.Precision.HIGHEST,
    )
    return jax.nn.logsumexp(_softcap(logits, softcap), axis=-1)


def vocab_logsumexp(hidden, embedding, *, softcap: float = 0.0, impl: Impl | None = None):
    """log sum_v exp(logit_v) over the whole vocabulary, per row: float32 [R]."""
    _check_hidden_embedding("vocab_logsumexp", hidden, embedding)
    if resolve_impl(impl) == "reference":
        return vocab_logsumexp_reference(hidden, embedding, softcap)
    require_target("prism_vocab_logsumexp")
    r, v = hidden.shape[0], embedding.shape[0]
    tiles = -(-v // VOCAB_TILE)
    outs = (
        jax.ShapeDtypeStruct((r,), jnp.float32),
        jax.ShapeDtypeStruct((r, tiles, 2), jnp.float32),
    )  # scratch: per-tile (max, sum)
    call = jax.ffi.ffi_call("prism_vocab_logsumexp", outs, vmap_method="sequential")
    lse, _ = call(hidden, embedding, softcap=np.float32(softcap))
    return lse
