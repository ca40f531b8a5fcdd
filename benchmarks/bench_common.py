"""Helpers the benchmark scripts share: wall-clock timing of repeated runs, their summary, a
JSON-lines emitter and the commit a result belongs to. benchmarks/ is sys.path[0] when a
script runs, so scripts import this as `bench_common`."""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def timed(fn, runs: int, before=None) -> tuple[list[float], object]:
    """Seconds of each of `runs` calls of fn (before() runs untimed ahead of each); fn's last
    result."""
    assert runs >= 1, "time at least one run"
    times, out = [], None
    for _ in range(runs):
        if before:
            before()
        start = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - start)
    return times, out


def stats(times: list[float]) -> dict:
    """Median and spread of run times (seconds) in milliseconds."""
    return {
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "max_ms": 1e3 * max(times),
        "runs": len(times),
    }


def jsonl_emitter(sink, device: str, rows: list):
    """emit(row): adds the device, prints the row, appends it to sink (flushed) and rows."""

    def emit(row: dict) -> None:
        row = {**row, "device": device}
        print(json.dumps(row), flush=True)
        sink.write(json.dumps(row) + "\n")
        sink.flush()
        rows.append(row)

    return emit


def commit() -> str:
    """PRISM_COMMIT (a tree exported without .git, e.g. by git archive), else the checkout's
    short HEAD with "+dirty" when tracked files differ from it."""
    if os.environ.get("PRISM_COMMIT"):
        return os.environ["PRISM_COMMIT"]
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], text=True, capture_output=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], text=True, capture_output=True
    )
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")
