"""A fake engine with hand-computable answers, for server tests that need no model.

Every option gets probability proportional to 1, 2, 3, ... in declaration order, so a choice
of n options answers its last option with p = n / (n (n + 1) / 2).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import numpy as np

from prism_jax.decide import answer
from prism_jax.questions import DecisionRequestError, parse_questions


def expected_probs(n: int) -> list[float]:
    w = np.arange(1, n + 1, dtype=np.float64)
    return list(w / w.sum())


class FakeEngine:
    """decide_many / stats like Engine; records the size of every step."""

    name = "fake"

    def __init__(self, step_seconds: float = 0.0, too_long_marker: str = "TOO-LONG") -> None:
        self.step_seconds = step_seconds
        self.too_long_marker = too_long_marker
        self.steps: list[int] = []
        self.gate = threading.Event()
        self.gate.set()  # clear() to hold steps until set() again
        self.pages_used = 0

    def decide_many(self, requests: list[tuple[Any, Mapping[str, Any]]]) -> list[Any]:
        self.gate.wait()
        self.steps.append(len(requests))
        if any(self.too_long_marker in str(state) for state, _ in requests):
            raise DecisionRequestError("prompt too long: the fake's limit is the marker")
        time.sleep(self.step_seconds)
        out: list[Any] = []
        for state, questions in requests:
            try:
                qs = parse_questions(questions)
            except DecisionRequestError as e:
                out.append(e)
                continue
            answers = {
                qid: answer(q, np.asarray(expected_probs(len(q.keys)))) for qid, q in qs.items()
            }
            out.append(
                {
                    "model": self.name,
                    "answers": answers,
                    "usage": {"input_tokens": len(str(state)), "output_tokens": 0},
                    "x_cached_tokens": 0,
                }
            )
        return out

    def stats(self) -> dict[str, float]:
        return {
            "kv_pages_total": 100,
            "kv_pages_used": self.pages_used,
            "kv_cache_usage_perc": self.pages_used / 100,
            "prefix_cache_hits": 3,
            "prefix_cache_queries": 5,
            "shared_prefix_tokens_total": 7,
        }
