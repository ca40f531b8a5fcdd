"""e2e_decide.py --profile: a scenario's run split into host prep (forest, cache, step arrays),
forward steps and readouts, each part synchronised."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING

import jax

if TYPE_CHECKING:
    from e2e_scenarios import Scenario

    from prism_jax.engine import Engine


def split_times(engine: Engine, s: Scenario, runs: int, chunk: int) -> dict:
    """Host prep (forest, cache, step arrays) / forward steps / readouts, each synchronised:
    engine.run's work done by hand, so the parts add up to a little more than a run."""
    from prism_jax.forest import build_forest
    from prism_jax.scheduler import place, plan_steps, release, step_arrays

    parts: dict[str, list[float]] = {"host_ms": [], "forward_ms": [], "readout_ms": []}
    for _ in range(runs):
        if s.cold:
            engine.cache.clear()
        t0 = time.perf_counter()
        forest = build_forest(s.questions, engine.root_len)
        placements = place(forest, engine.cache)
        host, fwd, read = time.perf_counter() - t0, 0.0, 0.0
        for plan in plan_steps(forest, placements, chunk):
            t0 = time.perf_counter()
            arrays = step_arrays(
                forest, placements, plan, engine.engine_config, engine.pool.num_pages
            )
            t1 = time.perf_counter()
            hidden = jax.block_until_ready(engine.runner.forward(arrays))
            t2 = time.perf_counter()
            if plan.rows:
                engine.runner.read(hidden, arrays)
            host, fwd, read = host + t1 - t0, fwd + t2 - t1, read + time.perf_counter() - t2
        release(placements, engine.cache, True)
        for k, v in zip(parts, (host, fwd, read), strict=True):
            parts[k].append(1e3 * v)
    return {k: statistics.median(v) for k, v in parts.items()}
