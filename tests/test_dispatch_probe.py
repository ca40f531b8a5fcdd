"""benchmarks/dispatch_probe.py at the tiny preset on the CPU (a smoke test of the probe the
H200 runs; the times it prints here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_tiny_probe_prints_every_row():
    runs = 2
    proc = subprocess.run(
        [sys.executable, "dispatch_probe.py", "--preset", "tiny", "--runs", str(runs),
         "--engine-runs", "one_question,follow_up_4k"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "benchmarks",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    probes = [r["probe"] for r in rows]
    calls = ["null_one_arg", "null_all_weights", "null_weights_kv", "forward", "forward_held"]
    reads = ["readout_split", "readout_after_forward"]
    assert probes == [*calls, *reads, "engine_runs", "engine_runs", "info"]
    for r in rows[: len(calls)]:
        assert 0 < r["return_ms"] <= r["done_ms"], r
    assert rows[1]["args"] > 1 and rows[2]["kv"] > 1 and rows[3]["tokens"] == 256
    split, after = rows[5], rows[6]
    # The one question's readout: its row's hidden only (readout_only_last_layer).
    assert split["key"] == after["key"] == ["readout", 1, 1, 4], (split, after)
    assert all(split[f"{k}_ms"] > 0 for k in ("pack", "call", "ready", "get", "read")), split
    assert after["both_ms"] > 0 and after["forward_ms"] > 0 and after["after_ready_ms"] > 0, after
    assert [r["scenario"] for r in rows[7:9]] == ["one_question", "follow_up_4k"]
    for r in rows[7:9]:
        assert len(r["wall_ms"]) == len(r["hidden_kv"]) == runs, r
        steps = [step for run in r["hidden_kv"] for step in run]
        assert steps and all(len(step) == 2 for step in steps), r
        # The pool is donated into every forward and updated in place: one address throughout.
        assert len({kv for _, kv in steps}) == 1, r
    assert rows[-1]["command_buffers"] == "xla"
