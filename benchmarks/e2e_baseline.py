"""e2e_decide.py's generic baseline: the same model in BF16 through XLA, one request per
question, full causal prompt, full-vocabulary softmax of the last token (DESIGN.md
"Performance targets"), compiled ahead of time and timed like the engine."""

from __future__ import annotations

import time
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


def build_baseline(config: ModelConfig, seed: int, times: dict) -> Baseline:
    """The bf16 model from the int8 model's seed, its init time in times["init_bf16_s"]."""
    start = time.perf_counter()
    params16 = jax.block_until_ready(model.init_random(config, "bf16", seed))
    times["init_bf16_s"] = round(time.perf_counter() - start, 2)
    return Baseline(params16, config)


def compile_baseline(baseline: Baseline | None, s: Scenario, compile_s: dict, log) -> None:
    """Compiles s's requests' lengths not compiled yet, times in compile_s["baseline/<T>"]."""
    if baseline is None:  # --no-baseline, or --baseline-after before the engine is gone
        return
    for tokens, options in baseline_requests(s):
        key = f"baseline/{len(tokens)}"
        if key not in compile_s:
            start = time.perf_counter()
            baseline.compile(len(tokens), len(options))
            compile_s[key] = round(time.perf_counter() - start, 2)
            log(f"compiled {key} in {compile_s[key]:.1f} s")


def measure_baseline(baseline: Baseline, s: Scenario, runs: int, probabilities: list) -> dict:
    """Times s's requests after one warm-up; diff is the largest |p_engine - p_bf16|."""
    requests = baseline_requests(s)
    for tokens, options in requests:  # warm-up
        baseline(tokens, options)
    t_base, base_probs = timed(lambda: [baseline(t, o) for t, o in requests], runs)
    assert len(probabilities) == len(base_probs), "one engine answer per baseline request"
    diff = max(
        float(np.max(np.abs(np.asarray(p) - b)))
        for p, b in zip(probabilities, base_probs, strict=True)
    )
    return {"stats": stats(t_base), "tokens": [len(t) for t, _ in requests], "diff": diff}


def with_baseline(row: dict, baseline: Baseline | None, s: Scenario, runs: int, probs) -> dict:
    """row plus the baseline's columns (None without a baseline); probs: the engine's answers."""
    base = measure_baseline(baseline, s, runs, probs) if baseline is not None else {}
    ratio = base["stats"]["median_ms"] / row["prism"]["median_ms"] if base else None
    return {
        **row,
        "baseline": base.get("stats"),
        "ratio": ratio,
        "baseline_tokens": base.get("tokens"),
        "prob_max_abs_diff_vs_bf16": base.get("diff"),
    }
