"""Server throughput on jevbench-mini: requests/s and p50/p99 latency at several concurrencies.

    python -m prism_jax.serve --model default --port 8000 --api-key KEY &
    JEVBENCH_API_KEY=KEY python benchmarks/serve_throughput.py --url http://127.0.0.1:8000 \
        --concurrency 1 8 64 --max-requests 300 --out benchmarks/results/serve_cpu

This is `jevbench eval --suite jevbench-mini --concurrency N` through jevbench's Python API
(`jevbench.evaluate`, which the CLI calls), with two differences the CLI cannot express:
  * `per_replica=N`, so N requests really are in flight against one server (the CLI's
    single-URL backend keeps one request per URL in flight whatever --concurrency says);
  * every request is timed on the client (send -> answer parsed), for p50/p99.
No request cache (every request reaches the server). One JSON line per concurrency on stdout;
results.json and summary.md in --out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time
from pathlib import Path

import jevbench as jb


def timed_backend(url: str, model: str, key: str | None, concurrency: int, timeout: float):
    backend = jb.systemone(
        url.rstrip("/") + "/v1/systemone",
        model,
        api_key=key,
        per_replica=concurrency,
        timeout=timeout,
    )
    latencies: list[float] = []
    lock = threading.Lock()
    ask = backend.ask

    def timed(state, questions):
        start = time.perf_counter()
        out = ask(state, questions)
        with lock:
            latencies.append(time.perf_counter() - start)
        return out

    backend.ask = timed
    return backend, latencies


def percentile(xs: list[float], q: float) -> float:
    ordered = sorted(xs)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def measure(args: argparse.Namespace, concurrency: int) -> dict:
    key = os.environ.get(args.key_env)
    backend, latencies = timed_backend(args.url, args.model, key, concurrency, args.timeout)
    load_before = os.getloadavg()
    start = time.perf_counter()
    report = jb.evaluate(
        backend,
        suite=args.suite,
        concurrency=concurrency,
        cache=None,
        max_requests=args.max_requests,
    )
    wall = time.perf_counter() - start
    return {
        "scenario": "serve_jevbench",
        "suite": args.suite,
        "concurrency": concurrency,
        "requests": len(latencies),
        "errors": len(report.errors),
        "seconds": round(wall, 2),
        "requests_per_s": round(len(latencies) / wall, 3),
        "p50_s": round(percentile(latencies, 50), 3),
        "p99_s": round(percentile(latencies, 99), 3),
        "mean_s": round(statistics.fmean(latencies), 3),
        "loadavg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
    }


def summary(rows: list[dict], command: str) -> str:
    base = rows[0]["requests_per_s"]
    lines = [
        "# Server throughput on jevbench-mini (CPU)",
        "",
        f"Command: `{command}`",
        "",
        "| concurrency | requests | errors | req/s | vs first row | p50 s | p99 s | "
        "load avg 1m (before, after) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['requests']} | {r['errors']} | "
            f"{r['requests_per_s']} | {r['requests_per_s'] / base:.2f}x | {r['p50_s']} | "
            f"{r['p99_s']} | {r['loadavg_1m_before_after']} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--url", default="http://127.0.0.1:8000")
    p.add_argument("--model", default="default")
    p.add_argument("--key-env", default="JEVBENCH_API_KEY")
    p.add_argument("--suite", default="jevbench-mini")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--max-requests", type=int, help="stop each run after this many requests")
    p.add_argument(
        "--timeout",
        type=float,
        default=180.0,
        help="client seconds per request (jevbench's default 180); a request that "
        "times out is sent again, which adds load: set it above the worst latency",
    )
    p.add_argument("--out", default="benchmarks/results/serve_cpu")
    args = p.parse_args()
    rows = []
    for c in args.concurrency:
        rows.append(measure(args, c))
        print(json.dumps(rows[-1]), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python benchmarks/serve_throughput.py " + " ".join(
        f"--{k.replace('_', '-')} {' '.join(map(str, v)) if isinstance(v, list) else v}"
        for k, v in vars(args).items()
        if v is not None
    )
    (out / "results.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
    (out / "summary.md").write_text(summary(rows, command))


if __name__ == "__main__":
    main()
