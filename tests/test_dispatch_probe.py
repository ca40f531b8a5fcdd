"""benchmarks/dispatch_probe.py at the tiny preset on the CPU (a smoke test of the probe the
H200 runs; the times it prints here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tiny_probe_prints_every_row():
    proc = subprocess.run(
        [sys.executable, "dispatch_probe.py", "--preset", "tiny", "--runs", "2"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "benchmarks",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    probes = [r["probe"] for r in rows]
    assert probes == ["null_one_arg", "null_all_weights", "forward", "forward_held", "info"]
    for r in rows[:-1]:
        assert 0 < r["return_ms"] <= r["done_ms"], r
    assert rows[1]["args"] > 1 and rows[2]["tokens"] == 256
