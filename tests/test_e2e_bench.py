"""benchmarks/e2e_decide.py end to end on the CPU at its tiny preset (a smoke test of the
script the H200 runs; the timings it prints here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "e2e_decide.py"
FIELDS = set(
    "scenario title shapes prism baseline ratio target_ms prism_published_ms computed_tokens "
    "cached_tokens steps baseline_tokens card platform commit date preset smoke".split()
)


def _run_tiny(out, *extra: str) -> subprocess.CompletedProcess:
    """e2e_decide.py at its tiny preset, 2 timed runs, into out, with extra arguments."""
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--preset", "tiny", "--runs", "2", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )


def test_tiny_run_writes_one_line_per_scenario(tmp_path):
    proc = _run_tiny(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    rows = [json.loads(x) for x in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    assert printed == rows
    assert [r["scenario"] for r in rows] == ["one_question", "state_3_questions", "follow_up_4k"]
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["smoke"] and r["preset"] == "tiny"
        for side in ("prism", "baseline"):
            s = r[side]
            assert s["runs"] == 2 and 0 < s["min_ms"] <= s["median_ms"] <= s["max_ms"], s
        assert r["ratio"] > 0 and r["steps"] == 1
        # Both paths answer the same question: int8 engine vs bf16 baseline probabilities.
        assert r["prob_max_abs_diff_vs_bf16"] < 0.05, r
    one, three, follow = rows
    assert one["computed_tokens"] == 256 and one["baseline_tokens"] == [256]
    assert three["computed_tokens"] == 64 + 256 + 3 * 32 and three["baseline_tokens"] == [352] * 3
    assert follow["cached_tokens"] == 4096 and follow["computed_tokens"] == 32
    assert follow["baseline_tokens"] == [4128]
    assert (one["target_ms"], three["target_ms"], follow["target_ms"]) == (12, 15, 7)
    compiled = json.loads((tmp_path / "compile.json").read_text())["compile_s"]
    # Default buckets (e2e_decide.TOKEN_BUCKETS): the 416-token forest pads to 448, the 32-token
    # follow-up runs as 32, its 4K prefill in 2048-token chunks; no other forward is compiled.
    forwards = {k for k in compiled if k.startswith("forward/")}
    assert forwards == {"forward/32", "forward/256", "forward/448", "forward/2048"}, forwards
    table = (tmp_path / "E2E.md").read_text()
    assert "SMOKE RUN" in table and "| 19 |" in table and "<= 7 |" in table
    assert (tmp_path / "e2e.png").stat().st_size > 0


def _trace_probe(out) -> subprocess.CompletedProcess:
    return _run_tiny(
        out,
        "--scenarios",
        "one_question",
        "--no-baseline",
        "--trace",
        # More than one warm-up run of a cold scenario: each starts from an empty cache
        # (a hit would run, and compile, another step; the H100 caught this in session 33).
        "--warmup",
        "3",
    )


def _launches(out) -> dict:
    rows = [json.loads(x) for x in (out / "breakdown.jsonl").read_text().splitlines()]
    return {r["group"]: r["launches_per_run"] for r in rows if r["kind"] == "group"}


def test_no_baseline_trace_probe(tmp_path):
    """--no-baseline (XLA flag and trace probes): no bf16 model, smoke rows, a gap analysis;
    a second run into the same folder counts its own trace only; --warmup 3 compiles nothing
    more."""
    proc = _trace_probe(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    first = _launches(tmp_path)
    assert first and all(n > 0 for n in first.values()), first
    proc = _trace_probe(tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # Launch counts move by a launch or so between runs on the CPU (97.7 against 98 seen); a
    # breakdown that also read the first run's trace would count every launch twice.
    second = _launches(tmp_path)
    assert second.keys() == first.keys(), (first, second)
    ratios = {g: second[g] / first[g] for g in first}
    assert all(0.8 < r < 1.25 for r in ratios.values()), (
        f"the second run's breakdown counted the first's trace too: {ratios}"
    )
    (row,) = [json.loads(x) for x in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    assert row["smoke"] and row["baseline"] is None and row["ratio"] is None
    assert row["prism"]["runs"] == 2 and row["warmup_runs"] == 3
    compiled = json.loads((tmp_path / "compile.json").read_text())["compile_s"]
    assert not any(k.startswith("baseline/") for k in compiled), compiled
    kinds = {json.loads(x)["kind"] for x in (tmp_path / "breakdown.jsonl").read_text().splitlines()}
    assert {"group", "total", "gaps", "host"} <= kinds, kinds
    assert not (tmp_path / "E2E.md").exists()


def test_baseline_after_measures_the_bf16_model_once_the_engine_is_gone(tmp_path):
    """--baseline-after (the 27B on a card that cannot hold both models): every engine step is
    compiled and timed before the bf16 model exists, then every row gets its baseline."""
    proc = _run_tiny(tmp_path, "--scenarios", "one_question,state_3_questions", "--baseline-after")
    assert proc.returncode == 0, proc.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "e2e.jsonl").read_text().splitlines()]
    assert [r["scenario"] for r in rows] == ["one_question", "state_3_questions"]
    for r in rows:
        assert FIELDS <= set(r), FIELDS - set(r)
        assert r["baseline_after"] and r["baseline"]["runs"] == 2 and r["ratio"] > 0, r
        assert r["prob_max_abs_diff_vs_bf16"] < 0.05, r
    assert rows[1]["baseline_tokens"] == [352] * 3
    # Printed twice: each engine row as it is measured (no baseline yet), then the full rows.
    printed = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    assert [p["baseline"] for p in printed[:2]] == [None, None] and printed[2:] == rows
    # compile.json keeps insertion order: no baseline length compiled before the last step.
    compiled = list(json.loads((tmp_path / "compile.json").read_text())["compile_s"])
    kinds = [k.split("/")[0] for k in compiled]
    assert "baseline" in kinds and "forward" in kinds, compiled
    assert max(i for i, k in enumerate(kinds) if k != "baseline") < kinds.index("baseline"), (
        compiled
    )
    assert "int8 engine released" in proc.stderr
    assert "SMOKE RUN" in (tmp_path / "E2E.md").read_text()
