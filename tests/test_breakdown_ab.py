"""benchmarks/breakdown_ab.py: two breakdown.jsonl files side by side, per scenario and op group,
with kernels renamed between the runs on lines of their own."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import breakdown_ab  # noqa: E402


def _write(path, scenario, groups, kernels, busy, idle):
    rows = [{"meta": "ignored"}]
    rows += [
        {"scenario": scenario, "kind": "group", "group": g, "ms_per_run": v}
        for g, v in groups.items()
    ]
    rows += [
        {"scenario": scenario, "kind": "kernel", "group": "x", "kernel": k, "ms_per_run": v}
        for k, v in kernels.items()
    ]
    rows.append(
        {
            "scenario": scenario,
            "kind": "gaps",
            "busy_ms": busy,
            "idle_ms": idle,
            "span_ms": busy + idle,
        }
    )
    rows.append({"scenario": scenario, "kind": "gap_pair", "ms_per_run": 0.1})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_groups_kernels_and_step_side_by_side(tmp_path, capsys):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, "follow_up_4k", {"glu_quant": 0.66, "tree_attention": 4.5},
           {"Glu<false>": 0.66, "Partial<false>": 3.9}, 13.9, 1.2)  # fmt: skip
    _write(b, "follow_up_4k", {"glu_quant": 0.33, "tree_attention": 4.5},
           {"Glu<true>": 0.33, "Partial<false>": 3.9}, 13.6, 1.2)  # fmt: skip
    assert breakdown_ab.main([str(a), str(b), "--names", "main,opt"]) == 0
    out = capsys.readouterr().out
    assert "A = main, B = opt" in out and "## follow_up_4k" in out
    assert "| glu_quant | 0.660 | 0.330 | -0.330 | -50.0 % |" in out
    assert "| tree_attention | 4.500 | 4.500 | +0.000 | +0.0 % |" in out
    assert "| busy | 13.900 | 13.600 | -0.300 | -2.2 % |" in out
    assert "| Glu<false> | 0.660 | - | - | - |" in out
    assert "| Glu<true> | - | 0.330 | - | - |" in out


def test_scenarios_in_one_run_only_are_named(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    _write(a, "one_question", {"g": 1.0}, {}, 1.0, 0.1)
    _write(b, "state_3_questions", {"g": 1.0}, {}, 1.0, 0.1)
    text = breakdown_ab.markdown(breakdown_ab.load(a), breakdown_ab.load(b), ("A", "B"), 5)
    assert "Scenarios in one run only: one_question, state_3_questions" in text
