"""What a step's final-normed hidden states are scored against: the full vocabulary's logits
(tests and the generic baseline), the candidate head (each readout row's options, renormalised)
and the streamed vocabulary log-sum-exp (multi-token options' full-vocabulary normalisation)."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from prism_jax import ops
from prism_jax.config import ModelConfig
from prism_jax.model.layers import dot_precision
from prism_jax.model.transformer import Params, bind


def _softcap(logits: jax.Array, cap: float) -> jax.Array:
    return jnp.float32(cap) * jnp.tanh(logits / jnp.float32(cap)) if cap > 0 else logits


def full_logits(params: Params, config: ModelConfig, hidden: jax.Array) -> jax.Array:
    """Logits over the whole vocabulary, fp32 [T, V] (tests and the generic baseline)."""
    emb = bind(params, config).output_embedding()
    dtype = jnp.promote_types(hidden.dtype, emb.dtype)
    logits = jax.lax.dot_general(
        hidden.astype(dtype),
        emb.astype(dtype),
        (((1,), (1,)), ((), ())),
        precision=dot_precision(dtype),
        preferred_element_type=jnp.float32,
    )  # (T, V)
    return _softcap(logits, config.final_logit_softcap)


def output_embedding(params: Params, config: ModelConfig) -> jax.Array:
    """The [V, D] table the readouts score against (the LM head, or the tied embedding)."""
    return bind(params, config).output_embedding()


def candidate_head(
    emb: jax.Array, config: ModelConfig, hidden_rows: jax.Array, ids: jax.Array, counts: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """Candidate logits and log-probabilities renormalised over each row's candidates.

    Args:
      emb: [V, D] output embedding (`output_embedding`).
      hidden_rows: [R, D] final-normed hidden states at the answer slots.
      ids: int32 [R, C] candidate token ids (padded); counts: int32 [R] valid per row.

    Returns:
      (logits f32 [R, C], logprobs f32 [R, C]); padding entries are -inf.
    """
    return ops.candidate_head(hidden_rows, emb, ids, counts, softcap=config.final_logit_softcap)


def candidate_readout(
    params: Params, config: ModelConfig, hidden_rows: jax.Array, ids: jax.Array, counts: jax.Array
) -> tuple[jax.Array, jax.Array]:
    """`candidate_head` on the model's output embedding."""
    return candidate_head(output_embedding(params, config), config, hidden_rows, ids, counts)


def embedding_logsumexp(emb: jax.Array, config: ModelConfig, hidden_rows: jax.Array) -> jax.Array:
    """log sum_v exp(logit_v) over the full vocabulary of emb [V, D], f32 [R], streamed."""
    return ops.vocab_logsumexp(hidden_rows, emb, softcap=config.final_logit_softcap)


def vocab_logsumexp(params: Params, config: ModelConfig, hidden_rows: jax.Array) -> jax.Array:
    """log sum_v exp(logit_v) over the full vocabulary, f32 [R], streamed (no [R, V])."""
    return embedding_logsumexp(output_embedding(params, config), config, hidden_rows)
