"""`python -m prism_jax.audit`: replays a decision suite under varied batching and cache states
and checks that every probability vector keeps its exact bits.

    python -m prism_jax.audit --model default [--suite FILE.jsonl] [--out report.json]

Each question is first answered alone on a cold prefix cache (the baseline). Then every
configuration re-asks it: with the other questions of its request, with 2, 7 and 31 other
questions on the same state, next to unrelated requests in one step, after a prefix-cache hit
on its state, with the prefill cut into chunks at odd boundaries, padded into the largest
token bucket, and with other KV pages taken. The table lists configurations x mismatches; the
report holds the SHA-256 of every probability vector (float64 bits). Exit status 1 on any
mismatch. Varying the device count needs several devices and tensor parallelism; with one
device that row says so.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from prism_jax.audit_suite import DEFAULT_SUITE
from prism_jax.config import PRECISIONS
from prism_jax.prompts import RenderedQuestion
from prism_jax.questions import parse_questions

OTHER_COUNTS = (2, 7, 31)
CHUNKS = (29, 61, 250)  # primes: boundaries fall mid-page and mid-tile


@dataclasses.dataclass(frozen=True)
class Case:
    """One suite request, rendered: its questions in order, and their ids."""

    ids: list[str]
    rendered: list[RenderedQuestion]


def vector_hash(probs: list[float]) -> str:
    return hashlib.sha256(np.asarray(probs, np.float64).tobytes()).hexdigest()


def load_suite(path: str | None) -> list[dict]:
    if path is None:
        return DEFAULT_SUITE
    with open(path) as f:
        suite = [json.loads(line) for line in f if line.strip()]
    for i, req in enumerate(suite):
        if not isinstance(req, dict) or "state" not in req or "questions" not in req:
            raise SystemExit(
                f"{path}:{i + 1}: each line must be a System One request with "
                "'state' and 'questions'"
            )
    return suite


def render_suite(engine, suite: list[dict]) -> list[Case]:
    cases = []
    for req in suite:
        parsed = parse_questions(req["questions"])
        rendered = [engine.renderer.render(req["state"], q) for q in parsed.values()]
        cases.append(Case(list(parsed), rendered))
    return cases


def extra_questions(engine, suite: list[dict], state: Any, count: int) -> list[RenderedQuestion]:
    """`count` distinct questions on `state`, drawn from the suite's questions (a numbered
    variant once the pool is used up)."""
    pool = [q for req in suite for q in req["questions"].values()]
    out = []
    for i in range(count):
        q = dict(pool[i % len(pool)])
        if i >= len(pool):
            q["instructions"] = f"{q.get('instructions') or 'Decide.'} (variant {i // len(pool)})"
        (parsed,) = parse_questions({"x": q}).values()
        out.append(engine.renderer.render(state, parsed))
    return out


Runner = Callable[[Any, list[dict], list[Case], int], list[list[float]]]


def _cold(engine, rendered, **kw) -> list[list[float]]:
    engine.cache.clear()
    return engine.run(rendered, **kw).probabilities


def _together(engine, suite, cases, i):
    return _cold(engine, cases[i].rendered)


def _with_others(count: int) -> Runner:
    def run(engine, suite, cases, i):
        extra = extra_questions(engine, suite, suite[i]["state"], count)
        n = len(cases[i].rendered)
        return _cold(engine, extra[: count // 2] + cases[i].rendered + extra[count // 2 :])[
            count // 2 : count // 2 + n
        ]

    return run


def _unrelated(engine, suite, cases, i):
    before = [q for c in cases[:i] for q in c.rendered]
    after = [q for c in cases[i + 1 :] for q in c.rendered]
    n = len(cases[i].rendered)
    return _cold(engine, before + cases[i].rendered + after)[len(before) : len(before) + n]


def _cache_hit(engine, suite, cases, i):
    engine.cache.clear()
    engine.run(cases[i].rendered[:1])  # fills the cache with the state
    out = []
    for q in cases[i].rendered:
        result = engine.run([q])
        assert result.cached_tokens(0) > 0, "the state should have come from the prefix cache"
        out.append(result.probabilities[0])
    return out


def _chunked(chunk: int) -> Runner:
    return lambda engine, suite, cases, i: _cold(engine, cases[i].rendered, chunk=chunk)


def _large_bucket(engine, suite, cases, i):
    return _cold(engine, cases[i].rendered, min_tokens=engine.engine_config.max_step_tokens)


def _pages_taken(engine, suite, cases, i):
    """Takes every third free page (and the first 40) so the request lands elsewhere."""
    engine.cache.clear()
    free = engine.pool.free_page_ids()
    taken = sorted(set(free[:40]) | set(free[::3]))
    taken = taken[: max(len(free) - engine.pool.pages_for(4096), 0)]
    engine.pool.reserve(taken)
    try:
        return engine.run(cases[i].rendered).probabilities
    finally:
        engine.pool.free(taken)


def configurations() -> list[tuple[str, Runner]]:
    out: list[tuple[str, Runner]] = [("all questions of the request together", _together)]
    out += [(f"with {k} other questions on the state", _with_others(k)) for k in OTHER_COUNTS]
    out += [
        ("next to unrelated requests in one step", _unrelated),
        ("after a prefix-cache hit on the state", _cache_hit),
    ]
    out += [(f"prefill in chunks of {c} tokens", _chunked(c)) for c in CHUNKS]
    out += [
        ("padded into the largest token bucket", _large_bucket),
        ("other KV pages taken", _pages_taken),
    ]
    return out


def audit(engine, suite: list[dict], progress: bool = True) -> dict:
    cases = render_suite(engine, suite)
    baseline = [[_cold(engine, [q])[0] for q in c.rendered] for c in cases]
    hashes = {
        f"{i}/{qid}": vector_hash(p)
        for i, c in enumerate(cases)
        for qid, p in zip(c.ids, baseline[i], strict=True)
    }
    rows = []
    for name, run in configurations():
        mismatches = []
        for i, c in enumerate(cases):
            got = run(engine, suite, cases, i)
            for qid, want, have in zip(c.ids, baseline[i], got, strict=True):
                if vector_hash(have) != vector_hash(want):
                    mismatches.append(
                        {
                            "question": f"{i}/{qid}",
                            "hash": vector_hash(have),
                            "max_abs_diff": float(np.max(np.abs(np.subtract(have, want)))),
                        }
                    )
        rows.append({"configuration": name, "checked": len(hashes), "mismatches": mismatches})
        if progress:
            print(f"  {name}: {len(mismatches)} mismatches", file=sys.stderr, flush=True)
    return {
        "model": engine.name,
        "precision": engine.precision,
        "rows": rows,
        "hashes": hashes,
        "ok": all(not r["mismatches"] for r in rows),
    }


def device_row() -> dict:
    import jax

    n = jax.device_count()
    return {
        "configuration": f"device count (available: {n})",
        "checked": 0,
        "mismatches": [],
        "note": "not varied: prism_jax runs one device per engine (tensor parallelism "
        "is not implemented yet)",
    }


def print_table(report: dict) -> None:
    print(f"model {report['model']} ({report['precision']})")
    print(f"{'configuration':46s} {'checked':>8s} {'mismatches':>11s}")
    for r in report["rows"]:
        note = f"  ({r['note']})" if r.get("note") else ""
        print(f"{r['configuration']:46s} {r['checked']:8d} {len(r['mismatches']):11d}{note}")
    print("probability vector hashes (sha256 of float64 bits):")
    for k, h in report["hashes"].items():
        print(f"  {k:24s} {h}")
    print(
        "OK: every configuration reproduced every vector bit for bit"
        if report["ok"]
        else "MISMATCH: see the rows above"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m prism_jax.audit",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--model",
        default="default",
        help="'default', a registered name, an HF safetensors directory or a .gguf file",
    )
    parser.add_argument("--precision", default="int8", choices=PRECISIONS)
    parser.add_argument("--suite", help="JSONL of System One requests (default: built-in suite)")
    parser.add_argument("--out", help="write the JSON report here")
    args = parser.parse_args(argv)
    suite = load_suite(args.suite)
    from prism_jax.engine import Engine

    engine = Engine.from_pretrained(args.model, precision=args.precision)
    report = audit(engine, suite)
    report["rows"].append(device_row())
    print_table(report)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
