"""benchmarks/host_after_forward.py at the tiny preset on the CPU (a smoke test of the probe
the H200 runs; the times it prints here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONDITIONS = [
    "after_forward",
    "read_again",
    "idle_5ms_after_read",
    "5ms_after_forward",
    "after_forward_and_tiny_get",
]


def test_tiny_probe_prints_every_condition():
    proc = subprocess.run(
        [sys.executable, "host_after_forward.py", "--preset", "tiny", "--runs", "2",
         "--idle-ms", "5"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "benchmarks",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert [r["condition"] for r in rows] == CONDITIONS
    for r in rows:
        assert r["runs"] == 2, r
        assert all(r[f"{k}_ms"] > 0 for k in ("py_loop", "np_copy", "read")), r
        assert r["thread_cpu_ms"] and all(ms >= 0 for ms in r["thread_cpu_ms"].values()), r
    # The window from the forward call to the read's end includes the main thread's own work.
    assert max(rows[0]["thread_cpu_ms"].values()) > 0, rows[0]
