"""`python -m prism_jax.eval` end to end on the default model: a few short items, one
precision, two render styles (one engine, so the step compiles once per bucket)."""

import json

import pytest

from prism_jax.eval.__main__ import main

ITEMS = [
    {
        "id": "e/1",
        "source": "test",
        "state": "I was charged twice for my March invoice.",
        "question": {
            "type": "choice",
            "instructions": "Which team should handle this?",
            "criteria": {"billing": "payments", "technical": "bugs"},
        },
        "gold": "billing",
    },
    {
        "id": "e/2",
        "source": "test",
        "state": "I was charged twice for my March invoice.",
        "question": {"type": "noul", "instructions": "Does the customer mention money?"},
        "gold": True,
    },
    {
        "id": "e/3",
        "source": "test",
        "state": "The app crashes when I open settings.",
        "question": {
            "type": "score",
            "instructions": "How urgent is this?",
            "criteria": ["low", "medium", "high"],
        },
        "gold": 1,
    },
]


@pytest.mark.slow
def test_eval_cli_end_to_end(tmp_path, capsys):
    data = tmp_path / "mini.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ITEMS))
    out = tmp_path / "out"
    argv = [
        "--model",
        "default",
        "--data",
        str(data),
        "--precision",
        "int8",
        "--style",
        "keys,letters",
        "--limit",
        "3",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["decisions"] == 3 and summary["variants"] == ["int8", "int8/letters"]
    assert summary["overall"]["int8"]["n"] == 3
    assert "int8/letters vs int8" in summary["pairs"]
    for name in (
        "report.md",
        "reliability.png",
        "confidence_vs_accuracy.png",
        "predictions-int8.jsonl",
        "predictions-int8_letters.jsonl",
    ):
        assert (out / name).stat().st_size > 0, name
    for line in (out / "predictions-int8.jsonl").read_text().splitlines():
        probs = json.loads(line)["probs"]
        assert abs(sum(probs) - 1) < 1e-9
    assert "| **overall** | 3 |" in capsys.readouterr().out
