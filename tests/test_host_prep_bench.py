"""benchmarks/host_prep.py on this machine (a smoke test: its times here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_scenario_prints_a_row(tmp_path):
    proc = subprocess.run(
        [sys.executable, "host_prep.py", "--runs", "3", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "benchmarks",
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert [r["scenario"] for r in rows] == ["one_question", "state_3_questions", "follow_up_4k"]
    # one step each: the prompt, the forest padded to its bucket, the follow-up's branch
    assert [r["step_tokens"] for r in rows] == [[256], [448], [32]]
    assert all(0 < r["min_ms"] <= r["median_ms"] <= r["max_ms"] and r["runs"] == 3 for r in rows)
    saved = [json.loads(x) for x in (tmp_path / "host_prep.jsonl").read_text().splitlines()]
    assert saved == rows
