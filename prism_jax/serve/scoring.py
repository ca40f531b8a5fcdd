"""Plain-prompt scoring and greedy continuation for /v1/completions.

The decision path never materialises [T, V] logits; this generic path does, a chunk of rows at
a time. There is no KV cache here: each generated token reruns the whole (bucketed) prefix, so
it suits scoring and short continuations, not long generation.
Letters: T tokens (bucketed), D model dim, V vocab, K top logprobs (<= 5).
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import model

ROW_CHUNK = 64  # logits rows per pass: 64 x 262K fp32 = 64 MiB, never [T, V]
TOP_K = 5


def buckets(limit: int) -> tuple[int, ...]:
    out, t = [], 16
    while t < limit:
        out.append(t)
        t *= 2
    return (*out, limit)


@dataclasses.dataclass(frozen=True)
class TokenScores:
    token_logprobs: list[float]  # log P(ids[i] | ids[:i]) for i >= 1
    top: list[list[tuple[int, float]]]  # per position i >= 1: the K likeliest ids at that slot


class Scorer:
    """Jitted scoring over one engine's params (call only from the engine thread)."""

    def __init__(self, engine: Any, max_tokens: int) -> None:
        self.params = engine.params
        self.config = engine.config
        self.buckets = buckets(max_tokens)
        config = engine.config

        @jax.jit
        def hidden(params, tokens, positions, mask):
            return model.forward(params, config, tokens, positions, mask)  # (T, D)

        @functools.partial(jax.jit, static_argnames=("k",))
        def rows(params, h, targets, k):
            logp = jax.nn.log_softmax(model.full_logits(params, config, h), axis=-1)  # (R, V)
            picked = jnp.take_along_axis(logp, targets[:, None], axis=-1)[:, 0]  # (R,)
            top_lp, top_ids = jax.lax.top_k(logp, k)  # (R, K)
            return picked, top_lp, top_ids

        self._hidden, self._rows = hidden, rows

    def _forward(self, ids: list[int]) -> jax.Array:
        t = self.buckets[bisect.bisect_left(self.buckets, len(ids))]
        tokens = np.zeros(t, np.int32)
        tokens[: len(ids)] = ids
        idx = np.arange(t)
        mask = idx[None, :] <= idx[:, None]  # causal; padding rows are ignored
        return self._hidden(self.params, tokens, idx.astype(np.int32), mask)

    def score(self, ids: list[int], k: int) -> TokenScores:
        """Log-probabilities of ids[1:] given their prefixes, and the top-k at each slot."""
        h = self._forward(ids)
        n = len(ids) - 1
        logprobs: list[float] = []
        top: list[list[tuple[int, float]]] = []
        for start in range(0, n, ROW_CHUNK):
            rows = np.arange(start, start + ROW_CHUNK)
            targets = np.asarray([ids[i + 1] if i < n else 0 for i in rows], np.int32)
            picked, top_lp, top_ids = self._rows(self.params, h[rows], targets, k=max(k, 1))
            m = min(ROW_CHUNK, n - start)
            logprobs += [float(x) for x in np.asarray(picked)[:m]]
            top += [
                list(zip(map(int, i), map(float, lp), strict=True))
                for i, lp in zip(np.asarray(top_ids)[:m], np.asarray(top_lp)[:m], strict=True)
            ]
        return TokenScores(logprobs, top)

    def next_token(self, ids: list[int], k: int) -> tuple[int, float, list[tuple[int, float]]]:
        """Greedy next token after ids: (id, its logprob, top-k)."""
        h = self._forward(ids)
        row = np.asarray([len(ids) - 1], np.int32)
        _, top_lp, top_ids = self._rows(self.params, h[row], np.zeros(1, np.int32), k=max(k, 1))
        ids_k, lp_k = np.asarray(top_ids)[0], np.asarray(top_lp)[0]
        top = list(zip(map(int, ids_k), map(float, lp_k), strict=True))
        return top[0][0], top[0][1], top
