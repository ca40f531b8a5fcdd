"""benchmarks/args_ab_summary.py: the A/B table lists runs in run order and averages each
variant's medians; a cut-short run shows dashes."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from args_ab_summary import runs, table  # noqa: E402


def _run(root: Path, folder: str, medians: dict[str, float] | None) -> None:
    d = root / folder
    d.mkdir()
    if medians is None:
        return  # cut short: no e2e.jsonl
    rows = [
        {"scenario": s, "prism": {"median_ms": m, "min_ms": m - 1, "max_ms": m + 1}}
        for s, m in medians.items()
    ]
    (d / "e2e.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_rows_in_run_order_and_means_per_variant(tmp_path):
    _run(tmp_path, "10_old", {"one": 23.0, "fu": 18.0})  # sorts after 2, not after 1
    _run(tmp_path, "1_old", {"one": 21.0, "fu": 18.5})
    _run(tmp_path, "2_new", {"one": 20.0, "fu": 17.0})
    _run(tmp_path, "3_new", None)
    (tmp_path / "summary.md").write_text("not a run")
    found = runs(tmp_path)
    assert [(i, n) for i, n, _ in found] == [(1, "old"), (2, "new"), (3, "new"), (10, "old")]
    text = table(found).splitlines()
    assert text[2] == "| 1 | old | 21.00 (20.00-22.00) | 18.50 (17.50-19.50) |"
    assert text[4] == "| 3 | new | - | - |"
    assert "| old (mean of medians) | 22.00 | 18.25 |" in text
    assert "| new (mean of medians) | 20.00 | 17.00 |" in text


def test_an_empty_directory_is_refused(tmp_path):
    with pytest.raises(AssertionError, match="no <run index>_<name>/ folders"):
        table(runs(tmp_path))
