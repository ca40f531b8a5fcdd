"""Host work before a step's first kernel, for the end-to-end scenarios: the forest, its
prefix-cache placement, the step plan, the padded step arrays and their packed buffer. No model
and no device: it is pure host code, on the engine's critical path before every forward (the
H200 runs' --profile host_ms, results/e2e_h200_session10/: 0.43 / 0.98 / 1.03 ms).

    python3 benchmarks/host_prep.py [--runs 300] [--out DIR]

The scenarios, buckets and pool are benchmarks/e2e_decide.py's (27B vocabulary; the follow-up
places its 4,096-token prefix once, untimed, so each timed run is a prefix-cache hit). Prints
one JSON line per scenario (median and min-max ms over --runs after 20 warm-up runs) and
appends them to DIR/host_prep.jsonl when --out is given.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import time

from bench_common import commit, stats, timed  # benchmarks/ is sys.path[0] as a script
from e2e_scenarios import ROOT_LEN, TOKEN_BUCKETS, Scenario, scenarios

from prism_jax.config import GEMMA3_27B, EngineConfig
from prism_jax.forest import build_forest
from prism_jax.kv_pages import PagePool
from prism_jax.prefix_cache import PrefixCache
from prism_jax.scheduler import place, plan_steps, release, step_arrays
from prism_jax.step_buffers import forward_layout, pack

WARMUP = 20
# benchmarks/e2e_decide.py build()'s engine configuration
ENGINE = EngineConfig(
    page_size=16,
    kv_pages=320,
    token_buckets=TOKEN_BUCKETS,
    row_buckets=(1, 4),
    candidate_buckets=(4, 256),
)


def prepare(cache: PrefixCache, questions, chunk: int) -> list[int]:
    """engine.run's host work up to each step's packed buffer: the steps' token buckets."""
    forest = build_forest(questions, ROOT_LEN)
    placements = place(forest, cache)
    buckets = []
    for plan in plan_steps(forest, placements, chunk):
        arrays = step_arrays(forest, placements, plan, ENGINE, cache.pool.num_pages)
        t = arrays["tokens"].shape[0]
        pack(arrays, forward_layout(t, ENGINE))
        buckets.append(t)
    release(placements, cache, completed=True)
    return buckets


def measure(s: Scenario, runs: int, chunk: int) -> dict:
    cache = PrefixCache(PagePool(ENGINE.kv_pages, ENGINE.page_size))
    for q in s.prefill:  # the follow-up's state, cached as if computed
        prepare(cache, [q], chunk)
    before = cache.clear if s.cold else None
    timed(lambda: prepare(cache, s.questions, chunk), WARMUP, before)
    times, buckets = timed(lambda: prepare(cache, s.questions, chunk), runs, before)
    return {"scenario": s.name, "step_tokens": buckets, **stats(times)}


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=300)
    p.add_argument("--chunk", type=int, default=2048)
    p.add_argument("--out", help="append the JSON lines to OUT/host_prep.jsonl")
    args = p.parse_args(argv)
    meta = {
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "host": f"{platform.processor() or platform.machine()}, python {platform.python_version()}",
    }
    rows = [meta | measure(s, args.runs, args.chunk) for s in scenarios(GEMMA3_27B.vocab_size)]
    for row in rows:
        print(json.dumps(row), flush=True)
    if args.out:
        out = pathlib.Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        with open(out / "host_prep.jsonl", "a") as f:
            f.writelines(json.dumps(row) + "\n" for row in rows)


if __name__ == "__main__":
    main()
