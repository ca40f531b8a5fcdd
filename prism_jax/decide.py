"""System One semantics: the pure decide function, option probabilities, and answers.

`make_decide_fn(config)` returns `decide(params, batch) -> probabilities [Q, O]` over a padded
forest batch (scheduler.pad): a pure function that notebooks jit, vmap and shard themselves.
Letters: T tokens, R readout rows, C candidates per row, Q questions, O options, L terms.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import model
from prism_jax.config import ModelConfig
from prism_jax.kv_pages import init_kv_pool
from prism_jax.questions import Question


def _sequential_sum(x: jax.Array) -> jax.Array:
    """Sum over the last axis in index order (L is small: an unrolled chain of adds), so an
    option's score never depends on how XLA would tile a reduction."""
    total = x[..., 0]
    for i in range(1, x.shape[-1]):
        total = total + x[..., i]
    return total


def option_probabilities(table: jax.Array, terms: jax.Array) -> jax.Array:
    """table f32 [R, C] log-probabilities; terms int32 [Q, O, L] flat indices (-1 = none).

    Returns [Q, O] probabilities: exp(score - logsumexp over the question's options), with
    scores summed and normalised in a fixed order; absent options get 0.
    """
    flat = table.reshape(-1)
    picked = jnp.where(terms >= 0, flat[jnp.maximum(terms, 0)], 0.0)  # (Q, O, L)
    score = _sequential_sum(picked)  # (Q, O)
    valid = terms[..., 0] >= 0
    score = jnp.where(valid, score, -jnp.inf)
    top = jnp.max(score, axis=-1, keepdims=True)  # max is exact in any order
    weights = jnp.where(valid, jnp.exp(score - top), 0.0)
    return weights / _sequential_sum(weights)[..., None]


def readout(
    params: model.Params,
    config: ModelConfig,
    hidden: jax.Array,
    rows: jax.Array,
    cand_ids: jax.Array,
    cand_counts: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """(logits, log-probabilities renormalised over the candidates), f32 [R, C], at `rows`."""
    return model.candidate_readout(params, config, hidden[rows], cand_ids, cand_counts)


def readout_lse(
    params: model.Params, config: ModelConfig, hidden: jax.Array, rows: jax.Array
) -> jax.Array:
    """Full-vocabulary log-sum-exp f32 [R] at `rows` (streamed: no [R, V] logits)."""
    return model.vocab_logsumexp(params, config, hidden[rows])


def paged_tables(batch: Mapping[str, jax.Array]) -> model.PagedTables:
    return model.PagedTables(
        batch["slot"],
        batch["positions"],
        batch["chain_of"],
        batch["chain_segments"],
        batch["pages_flat"],
    )


def make_table_fn(config: ModelConfig, full_vocab: bool = True, page_size: int = 16):
    """A pure `table(params, batch) -> log-probabilities f32 [R, C]` for one model config.

    `batch` is scheduler.pad's single-step layout on a fresh pool (pages 1..n; the pool is
    made inside). Rows with batch["use_lse"] read full-vocabulary log-probabilities (logit -
    vocab log-sum-exp, for multi-token options); the others read log-probabilities
    renormalised over their candidates. full_vocab=False skips the vocabulary pass (valid when
    no row uses it). Every entry comes out of the custom calls, so it is bitwise independent
    of the batch and equal to what the engine computes for the same question.
    """

    def table(params: model.Params, batch: Mapping[str, jax.Array]) -> jax.Array:
        pool = init_kv_pool(config, batch["pages_flat"].shape[0] + 1, page_size, params.precision)
        # hidden [R, D] at the readout rows: the last layer only for them (the same bits).
        tokens, tables = batch["tokens"], paged_tables(batch)
        hidden, _ = model.forward_paged(params, config, pool, tokens, tables, batch["rows"])
        rows = jnp.arange(hidden.shape[0], dtype=jnp.int32)
        logits, logprobs = readout(
            params, config, hidden, rows, batch["cand_ids"], batch["cand_counts"]
        )
        if not full_vocab:
            return logprobs
        lse = readout_lse(params, config, hidden, rows)  # (R,)
        return jnp.where(batch["use_lse"][:, None], logits - lse[:, None], logprobs)

    return table


def make_decide_fn(
    config: ModelConfig, page_size: int = 16
) -> Callable[[model.Params, Mapping[str, jax.Array]], jax.Array]:
    """A pure `decide(params, batch) -> probabilities f32 [Q, O]` for one model config.

    `batch` holds scheduler.pad's arrays (tokens, positions, slot, chain_of, chain_segments,
    pages_flat, rows, cand_ids, cand_counts, use_lse, terms). Jit, vmap or shard it as you
    like. The engine reports the same numbers computed on the host in float64 from the same
    table (see option_probabilities_host).
    """
    table_fn = make_table_fn(config, page_size=page_size)

    def decide(params: model.Params, batch: Mapping[str, jax.Array]) -> jax.Array:
        return option_probabilities(table_fn(params, batch), batch["terms"])

    return decide


def option_probabilities_host(table: np.ndarray, terms: np.ndarray) -> list[list[float]]:
    """The engine's reading of a table: per question, option probabilities in float64 with
    scalar libm exp and sums in option order, so they depend only on the question's own
    table entries (which the kernels make batch-independent)."""
    flat = np.asarray(table, np.float64).reshape(-1)
    out = []
    for options in np.asarray(terms):
        scores = []
        for option in options:
            if option[0] < 0:
                break
            score = 0.0
            for index in option:
                if index >= 0:
                    score += float(flat[index])
            scores.append(score)
        top = max(scores)
        weights = [math.exp(x - top) for x in scores]
        total = math.fsum(weights)
        out.append([w / total for w in weights])
    return out


def choice_confidence(probs: np.ndarray) -> float:
    """TypeSafe's reference: (m - 1/n) / (1 - 1/n), m the top probability of n options."""
    n = len(probs)
    return 1.0 if n == 1 else float((probs.max() - 1.0 / n) / (1.0 - 1.0 / n))


def score_confidence(probs: np.ndarray) -> float:
    """max(0, 1 - sum_i p_i |i - k| / D), k the likeliest level, D = mean_i |i - (n-1)/2|."""
    n = len(probs)
    idx = np.arange(n)
    spread = float(np.mean(np.abs(idx - (n - 1) / 2)))
    if spread == 0.0:
        return 1.0
    k = int(np.argmax(probs))
    return max(0.0, 1.0 - float(np.sum(probs * np.abs(idx - k))) / spread)


def answer(q: Question, probs: np.ndarray) -> dict[str, Any]:
    """A System One answer object from the question's option probabilities."""
    probs = np.asarray(probs, np.float64)[: len(q.keys)]
    if q.kind == "noul":
        return {"type": "noul", "noul": float(probs[0])}
    if q.kind == "choice":
        return {
            "type": "choice",
            "choice": q.keys[int(np.argmax(probs))],
            "confidence": choice_confidence(probs),
            "probabilities": {k: float(p) for k, p in zip(q.keys, probs, strict=True)},
        }
    return {
        "type": "score",
        "score": float(np.sum(np.arange(len(probs)) * probs)),
        "confidence": score_confidence(probs),
        "legend": {str(i): level for i, level in enumerate(q.descriptions)},
        "probabilities": {str(i): float(p) for i, p in enumerate(probs)},
    }
