"""e2e_decide.py's generic baseline: the same model in BF16 through XLA, one request per
question, full causal prompt, full-vocabulary softmax of the last token (DESIGN.md
"Performance targets"), compiled ahead of time and timed like the engine."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from bench_common import stats, timed  # benchmarks/ is sys.path[0] as a script

from prism_jax import model
from prism_jax.config import ModelConfig

if TYPE_CHECKING:
    from e2e_scenarios import Scenario


class Baseline:
    """One request: causal forward over the full prompt, full-vocabulary softmax of the last
    token, the options' probabilities renormalised; compiled ahead of time per prompt length."""

    def __init__(self, params: model.Params, config: ModelConfig) -> None:
        def fn(params, tokens, options):
            t = tokens.shape[0]
            positions = jnp.arange(t, dtype=jnp.int32)
            mask = jnp.tril(jnp.ones((t, t), jnp.bool_))  # (T, T)
            hidden = model.forward(params, config, tokens, positions, mask)  # (T, D)
            logits = model.full_logits(params, config, hidden[-1:])[0]  # (V,)
            return jax.nn.softmax(jax.nn.log_softmax(logits)[options])

        self.params, self._jit, self._compiled = params, jax.jit(fn), {}

    def compile(self, t: int, o: int) -> None:
        spec = jax.ShapeDtypeStruct
        lowered = self._jit.lower(self.params, spec((t,), jnp.int32), spec((o,), jnp.int32))
        self._compiled[(t, o)] = lowered.compile()

    def __call__(self, tokens: np.ndarray, options: np.ndarray) -> np.ndarray:
        """Host probabilities [O] (synchronous)."""
        run = self._compiled[(len(tokens), len(options))]
        return np.asarray(run(self.params, tokens, options))


def baseline_requests(s: Scenario) -> list[tuple[np.ndarray, np.ndarray]]:
    return [
        (np.asarray(q.prefix + q.branch, np.int32), np.asarray([o[0] for o in q.options], np.int32))
        for q in s.questions
    ]


def measure_baseline(baseline: Baseline, s: Scenario, runs: int, result) -> dict:
    requests = baseline_requests(s)
    for tokens, options in requests:  # warm-up
        baseline(tokens, options)
    t_base, base_probs = timed(lambda: [baseline(t, o) for t, o in requests], runs)
    diff = max(
        float(np.max(np.abs(np.asarray(p) - b)))
        for p, b in zip(result.probabilities, base_probs, strict=True)
    )
    return {"stats": stats(t_base), "tokens": [len(t) for t, _ in requests], "diff": diff}
