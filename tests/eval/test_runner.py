"""The runner and the report against a fake engine (no model): grouping by state, packing
into steps, streaming and resuming, refused requests, and the summary's numbers."""

import json

import numpy as np
import pytest

from prism_jax.decide import answer
from prism_jax.eval import report
from prism_jax.eval.items import Item
from prism_jax.eval.runner import Runner, Variant, group_by_state, paired, plan_steps
from prism_jax.prompts import PromptRenderer, RenderStyle
from prism_jax.questions import DecisionRequestError, parse_questions


class CharTokenizer:
    bos_id = None
    adds_bos = False

    def encode(self, text, add_bos=False):
        return [ord(c) for c in text]


class FakeEngine:
    """Puts probability 0.7 (int8) or 0.6 (other precisions) on option 0, the rest spread
    evenly; refuses a state that says "refuse". Records each decide_many call."""

    def __init__(self, precision):
        self.precision = precision
        self.tokenizer = CharTokenizer()
        self.renderer = PromptRenderer(self.tokenizer, None)
        self.calls = []

    def decide_many(self, requests):
        self.calls.append((self.renderer.style, [len(q) for _, q in requests]))
        if any(s == "too long" for s, _ in requests):
            raise DecisionRequestError("step too long")
        out = []
        for state, questions in requests:
            if state == "refuse":
                out.append(DecisionRequestError("refused"))
                continue
            answers = {}
            for qid, q in parse_questions(questions).items():
                top = 0.7 if self.precision == "int8" else 0.6
                rest = (1 - top) / (len(q.keys) - 1)
                answers[qid] = answer(q, np.array([top] + [rest] * (len(q.keys) - 1)))
            out.append({"answers": answers})
        return out


def _item(i, state, gold=0, kind="choice"):
    q = {"type": "choice", "criteria": {"a": None, "b": None, "c": None}}
    if kind == "noul":
        q = {"type": "noul", "instructions": "Is it?"}
    return Item(f"x/{i}", "s1" if i % 2 else "s2", "s", state, q, gold)


def test_plan_steps_packs_greedily():
    assert plan_steps([3, 3, 3, 9, 1], budget=6) == [[0, 1], [2], [3], [4]]


def test_group_by_state_keeps_first_appearance_order():
    items = [_item(0, "a"), _item(1, "b"), _item(2, "a")]
    assert [[it.id for it in g] for g in group_by_state(items)] == [["x/0", "x/2"], ["x/1"]]


def test_run_decides_every_variant_streams_and_resumes(tmp_path):
    items = [
        _item(0, "a"),
        _item(1, "a", gold=1),
        _item(2, "b", kind="noul"),
        _item(3, "refuse"),
        _item(4, "too long"),
    ]
    engines = {"int8": FakeEngine("int8"), "bf16": FakeEngine("bf16")}
    variants = [Variant("int8"), Variant("bf16"), Variant("int8", RenderStyle("letters"))]
    runner = Runner(engines, variants, budget_tokens=10**6)
    result = runner.run(items, tmp_path, progress=False)
    # one step for everything, then one request at a time after the step was refused
    assert engines["int8"].calls[0][1] == [2, 1, 1, 1]
    assert set(result.failed) == {"x/3", "x/4"}
    assert result.probs["int8"]["x/0"] == pytest.approx([0.7, 0.15, 0.15])
    assert result.probs["bf16"]["x/2"] == pytest.approx([0.6, 0.4])  # noul: [P(true), P(false)]
    assert {c[0].options for c in engines["int8"].calls} == {"keys", "letters"}
    assert engines["int8"].renderer.style == RenderStyle()  # restored after each call
    lines = (tmp_path / "predictions-int8_letters.jsonl").read_text().splitlines()
    assert {json.loads(x)["id"] for x in lines} == {"x/0", "x/1", "x/2"}

    decided = paired(items, result)
    summary = report.summarize(decided, variants, result, {"model": "fake"})
    assert summary["overall"]["int8"]["correct"] == 2 and summary["overall"]["int8"]["n"] == 3
    # (0.3^2 + 2 * 0.15^2) + (0.7^2 + 0.85^2 + 0.15^2) + (0.3^2 + 0.3^2), over 3
    assert summary["overall"]["int8"]["brier"] == pytest.approx((0.135 + 1.235 + 0.18) / 3)
    pair = summary["pairs"]["int8 vs bf16"]["overall"]
    assert pair["flips"] == 0 and abs(pair["max_dp"] - 0.1) < 1e-12
    assert "int8/letters vs int8" in summary["pairs"]
    text = report.markdown(summary)
    assert "| **overall** | 3 |" in text and "int8 vs bf16" in text

    again = Runner(engines, variants).run(items, tmp_path, progress=False)
    assert again.items == 0 and again.probs["int8"]["x/1"] == pytest.approx([0.7, 0.15, 0.15])
    assert again.failed.keys() == {"x/3", "x/4"}  # refused ones are asked again


def test_targets_in_the_summary():
    items = [_item(i, f"s{i}") for i in range(4)]
    probs = {
        "fp32": [[0.6, 0.3, 0.1]] * 4,
        "bf16": [[0.6, 0.3, 0.1]] * 3 + [[0.3, 0.6, 0.1]],
        "int8": [[0.6, 0.3, 0.1]] * 4,
    }
    from prism_jax.eval.runner import RunResult

    result = RunResult(
        {k: {it.id: p for it, p in zip(items, v, strict=True)} for k, v in probs.items()}, {}, {}, 4
    )
    variants = [Variant("int8"), Variant("bf16"), Variant("fp32")]
    summary = report.summarize(items, variants, result, {})
    (t,) = summary["targets"]
    assert t["accuracy_gap_points"] == 25.0 and not t["accuracy_gap_holds"]
    assert (t["flip_int8_vs_fp32"], t["flip_bf16_vs_fp32"], t["flip_holds"]) == (0.0, 0.25, True)
    assert list(summary["pairs"]) == ["bf16 vs fp32", "int8 vs fp32", "int8 vs bf16"]


def test_targets_judge_every_int8_variant():
    """int8 (two digits) and int8-1digit are each judged against bf16 and fp32."""
    items = [_item(i, f"s{i}") for i in range(4)]
    same, flipped = [0.6, 0.3, 0.1], [0.3, 0.6, 0.1]
    probs = {
        "fp32": [same] * 4,
        "bf16": [same] * 3 + [flipped],
        "int8": [same] * 4,
        "int8-1digit": [same] * 2 + [flipped] * 2,
    }
    from prism_jax.eval.runner import RunResult

    result = RunResult(
        {k: {it.id: p for it, p in zip(items, v, strict=True)} for k, v in probs.items()}, {}, {}, 4
    )
    variants = [Variant(p) for p in ("int8", "int8-1digit", "bf16", "fp32")]
    summary = report.summarize(items, variants, result, {})
    by = {t["int8"]: t for t in summary["targets"]}
    assert list(by) == ["int8", "int8-1digit"]
    assert by["int8"]["flip_holds"] and by["int8"]["flip_int8_vs_fp32"] == 0.0
    assert not by["int8-1digit"]["flip_holds"] and by["int8-1digit"]["flip_int8_vs_fp32"] == 0.5
    assert "| keys | int8-1digit |" in report.markdown(summary)
