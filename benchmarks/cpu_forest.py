"""Forest batching and the prefix cache on CPU, default model (Gemma 3 270M, int8).

    .venv/bin/python benchmarks/cpu_forest.py [--runs 5] [--out benchmarks/results/cpu_forest]

Scenarios, each measured in the same process (CPU timings swing with load: read the ratios):
  - one state + N questions (N = 3, 10, 50) as ONE forest (cold prefix cache) vs the same
    questions as N separate requests with a cold cache each (what an engine without forest
    batching or prefix caching computes): wall time and tokens computed;
  - a follow-up question on a cached ~2,000-token state vs the same request on a cold cache.
Prints one JSON line per measurement; writes results.jsonl and RESULTS.md under --out.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import time

from bench_common import stats, timed  # benchmarks/ is sys.path[0] as a script
from cpu_decide import STATE  # the same ticket as the HF comparison

from prism_jax.engine import Engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOPICS = [
    "billing",
    "login",
    "refunds",
    "shipping",
    "privacy",
    "pricing",
    "outage",
    "fraud",
    "cancellation",
    "upgrade",
]


def questions(n: int) -> dict:
    """n distinct questions of all three types about the ticket."""
    out = {}
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        kind = ("choice", "noul", "score")[i % 3]
        text = f"Regarding {topic} (check {i}), what applies to this ticket?"
        if kind == "choice":
            q = {
                "type": "choice",
                "instructions": text,
                "criteria": {"yes": None, "no": None, "unclear": None},
            }
        elif kind == "noul":
            q = {"type": "noul", "instructions": f"Is the ticket about {topic}? (check {i})"}
        else:
            q = {"type": "score", "instructions": text, "criteria": ["low", "medium", "high"]}
        out[f"q{i}"] = q
    return out


def long_state(engine: Engine, target_tokens: int) -> str:
    lines, i = [], 0
    while len(engine.tokenizer.encode(" ".join(lines), add_bos=False)) < target_tokens:
        lines.append(
            f"[{i // 60:02d}:{i % 60:02d}] worker-{i % 7} processed batch {i} "
            f"({(i * 37) % 900} ms, {(i * 13) % 50} retries)."
        )
        i += 1
    return " ".join(lines)


def forest_vs_separate(engine: Engine, n: int, runs: int) -> dict:
    qs = questions(n)

    def forest():
        engine.cache.clear()
        rendered = [engine.renderer.render(STATE, q) for q in engine_parse(qs)]
        return engine.run(rendered)

    def separate():
        computed = 0
        for q in engine_parse(qs):
            engine.cache.clear()
            computed += engine.run([engine.renderer.render(STATE, q)]).computed_tokens
        return computed

    forest()  # warm-up
    t_forest, result = timed(forest, runs)
    t_sep, sep_tokens = timed(separate, max(1, runs // 2) if n >= 50 else runs)
    return {
        "scenario": f"one state + {n} questions",
        "forest": stats(t_forest),
        "forest_tokens": result.computed_tokens,
        "forest_steps": result.steps,
        "separate": stats(t_sep),
        "separate_tokens": sep_tokens,
        "speedup": statistics.median(t_sep) / statistics.median(t_forest),
    }


def engine_parse(qs: dict):
    from prism_jax.questions import parse_questions

    return list(parse_questions(qs).values())


def follow_up(engine: Engine, runs: int) -> dict:
    state = long_state(engine, 2000)
    first, follow = {"a": questions(1)["q0"]}, {"b": questions(2)["q1"]}
    engine.cache.clear()
    engine.decide(state, first)  # warm-up + fills the cache

    def cached():
        return engine.decide(state, follow)

    def cold():
        engine.cache.clear()
        return engine.decide(state, follow)

    t_cached, r = timed(cached, runs)
    t_cold, r_cold = timed(cold, runs)
    assert r["answers"] == r_cold["answers"], "cache hit and cold run must agree bit for bit"
    return {
        "scenario": "follow-up question on a cached state",
        "state_tokens": r["x_cached_tokens"],
        "input_tokens": r["usage"]["input_tokens"],
        "cached": stats(t_cached),
        "cold": stats(t_cold),
        "speedup": statistics.median(t_cold) / statistics.median(t_cached),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=str(ROOT / "benchmarks/results/cpu_forest"))
    args = parser.parse_args()
    engine = Engine.from_pretrained("default", precision="int8", warmup=True)
    rows = [forest_vs_separate(engine, n, args.runs) for n in (3, 10, 50)]
    rows.append(follow_up(engine, args.runs))
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    meta = {
        "machine": platform.processor() or platform.machine(),
        "commit": commit,
        "date": time.strftime("%Y-%m-%d"),
        "model": "default (Gemma 3 270M) int8",
    }
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for row in rows:
            line = json.dumps({**meta, **row})
            print(line)
            f.write(line + "\n")
    write_markdown(out / "RESULTS.md", rows, meta)


def write_markdown(path: pathlib.Path, rows: list[dict], meta: dict) -> None:
    lines = [
        f"# CPU forest and prefix-cache results ({meta['model']})",
        "",
        f"`benchmarks/cpu_forest.py`, commit {meta['commit']}, {meta['date']}, "
        f"{meta['machine']} (2 cores, shared: read the ratios).",
        "",
        "| scenario | prism_jax | tokens computed | baseline | tokens computed | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "forest" in r:
            lines.append(
                f"| {r['scenario']} | one forest: {r['forest']['median_ms']:.0f} ms "
                f"({r['forest']['min_ms']:.0f}-{r['forest']['max_ms']:.0f}) | "
                f"{r['forest_tokens']} | separate requests: "
                f"{r['separate']['median_ms']:.0f} ms | {r['separate_tokens']} | "
                f"{r['speedup']:.1f}x |"
            )
        else:
            lines.append(
                f"| {r['scenario']} ({r['state_tokens']} cached tokens) | cache hit: "
                f"{r['cached']['median_ms']:.0f} ms ({r['cached']['min_ms']:.0f}-"
                f"{r['cached']['max_ms']:.0f}) | {r['input_tokens'] - r['state_tokens']}"
                f" | cold: {r['cold']['median_ms']:.0f} ms | {r['input_tokens']} | "
                f"{r['speedup']:.1f}x |"
            )
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
