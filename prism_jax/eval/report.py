"""The evaluation summary (JSON) and its markdown report.

Targets (issue 7): |accuracy(int8) - accuracy(bf16)| <= 0.03 percentage points, and
flip rate(int8 vs fp32) <= flip rate(bf16 vs fp32); fp32 is the ground truth of the model's
own arithmetic.
"""

from __future__ import annotations

import itertools
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prism_jax.eval import metrics
from prism_jax.eval.items import Item
from prism_jax.eval.runner import RunResult, Variant

# The reference comes first in a pair.
PRECISION_RANK = {"fp32": 0, "bf16": 1, "int8": 2, "int8-1digit": 3}
INT8_PRECISIONS = ("int8", "int8-1digit", "int8-attn", "int8-1digit-attn")
ACCURACY_GAP_POINTS = 0.03


def _run_stats(probs: list[list[float]], gold: list[int]) -> dict[str, Any]:
    cal = metrics.calibration(probs, gold)
    return {**metrics.accuracy(probs, gold), **cal}


def pairs(variants: Sequence[Variant]) -> list[tuple[Variant, Variant]]:
    """(reference, other): precisions of one style (fp32 before bf16 before int8), then each
    style against the first style at the same precision."""
    out = []
    styles = list(dict.fromkeys(v.style for v in variants))
    for style in styles:
        same = sorted(
            (v for v in variants if v.style == style),
            key=lambda v: PRECISION_RANK.get(v.precision, 9),
        )
        out += list(itertools.combinations(same, 2))
    for precision in dict.fromkeys(v.precision for v in variants):
        same = [v for v in variants if v.precision == precision]
        out += [(same[0], other) for other in same[1:]]
    return out


def summarize(
    items: Sequence[Item], variants: Sequence[Variant], result: RunResult, info: dict[str, Any]
) -> dict[str, Any]:
    """Per-set and overall accuracy/calibration per variant, agreement per pair, targets."""
    by_set: dict[str, list[Item]] = defaultdict(list)
    for it in items:
        by_set[it.set].append(it)
    names = [v.name for v in variants]

    def stats(group: Sequence[Item]) -> dict[str, dict]:
        gold = [it.gold for it in group]
        return {n: _run_stats([result.probs[n][it.id] for it in group], gold) for n in names}

    def agree(group: Sequence[Item], a: Variant, b: Variant) -> dict:
        return metrics.agreement(
            [result.probs[a.name][it.id] for it in group],
            [result.probs[b.name][it.id] for it in group],
            [it.gold for it in group],
        )

    summary: dict[str, Any] = {
        **info,
        "variants": names,
        "decisions": len(items),
        "sample": {s: len(g) for s, g in sorted(by_set.items())},
        "failed": result.failed,
        "overall": stats(items) if items else {},
        "per_set": {s: stats(g) for s, g in sorted(by_set.items())},
        "pairs": {},
        "seconds": result.seconds,
    }
    for a, b in pairs(variants):
        key = f"{b.name} vs {a.name}"
        summary["pairs"][key] = {
            "reference": a.name,
            "other": b.name,
            "overall": agree(items, a, b) if items else {},
            "per_set": {s: agree(g, a, b) for s, g in sorted(by_set.items())},
        }
    summary["targets"] = targets(summary, variants)
    return summary


def targets(summary: dict[str, Any], variants: Sequence[Variant]) -> list[dict[str, Any]]:
    """The two issue-7 targets for every style and every INT8 precision (int8, int8-1digit)
    measured together with bf16 and fp32."""
    out = []
    for style in dict.fromkeys(v.style for v in variants):
        by = {v.precision: v.name for v in variants if v.style == style}
        if not {"bf16", "fp32"} <= set(by):
            continue
        overall = summary["overall"]
        f16 = summary["pairs"][f"{by['bf16']} vs {by['fp32']}"]["overall"]["flip_rate"]
        for int8 in [p for p in INT8_PRECISIONS if p in by]:
            gap = abs(overall[by[int8]]["accuracy"] - overall[by["bf16"]]["accuracy"]) * 100
            f8 = summary["pairs"][f"{by[int8]} vs {by['fp32']}"]["overall"]["flip_rate"]
            out.append(
                {
                    "style": style.name,
                    "int8": int8,
                    "accuracy_gap_points": gap,
                    "accuracy_gap_holds": gap <= ACCURACY_GAP_POINTS,
                    "flip_int8_vs_fp32": f8,
                    "flip_bf16_vs_fp32": f16,
                    "flip_holds": f8 <= f16,
                }
            )
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.2f}"


def _acc(s: dict) -> str:
    return f"{_pct(s['accuracy'])} [{_pct(s['lo'])}, {_pct(s['hi'])}]"


def _table(head: list[str], align: list[str], rows: list[list[Any]]) -> list[str]:
    """Markdown table lines; align holds one "---" or "---:" per column."""
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    return lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]


def _header(summary: dict[str, Any]) -> list[str]:
    cut = summary["decisions"] < summary.get("sampled", 0)
    return [
        f"# Accuracy: {summary.get('model', '?')}",
        "",
        f"Command: `{summary.get('command', '')}`",
        "",
        f"Engine commit {summary.get('commit', '?')}; seed {summary.get('seed')}; "
        f"{summary['decisions']} decisions decided by every variant"
        + (f"; {len(summary['failed'])} refused" if summary["failed"] else "")
        + (
            f"; **only {summary['decisions']} of the {summary['sampled']} sampled items were "
            "decided (run cut short)**"
            if cut
            else ""
        ),
    ]


def _accuracy(summary: dict[str, Any]) -> list[str]:
    names = summary["variants"]
    rows = []
    for name, per in [*summary["per_set"].items(), ("**overall**", summary["overall"])]:
        n = next(iter(per.values()))["n"] if per else 0
        rows.append([name, n, *(_acc(per[v]) for v in names)])
    head = ["set", "n", *names]
    return [
        "## Accuracy (%) with 95 % Wilson intervals",
        "",
        *_table(head, ["---", "---:"] + ["---"] * len(names), rows),
    ]


def _calibration(summary: dict[str, Any]) -> list[str]:
    rows = []
    for v in summary["variants"]:
        s = summary["overall"][v]
        rows.append(
            [
                v,
                f"{s['ece']:.4f}",
                f"{s['brier']:.4f}",
                f"{s['mean_confidence']:.4f}",
                _pct(s["accuracy"]),
            ]
        )
    head = ["variant", "ECE (10 bins)", "Brier", "mean confidence", "accuracy"]
    return [
        "## Calibration (overall; confidence = top option probability)",
        "",
        *_table(head, ["---"] + ["---:"] * 4, rows),
    ]


_AGREEMENT_HEAD = [
    "pair",
    "flips",
    "flip rate % [95 %]",
    "mean abs dp",
    "max abs dp",
    "accuracy delta (points)",
    "fixed / broke",
    "McNemar p",
]


def _agreement_row(key: str, a: dict[str, Any]) -> list[str]:
    """One pair's overall agreement, in _AGREEMENT_HEAD's columns."""
    return [
        key,
        f"{a['flips']}/{a['n']}",
        f"{_pct(a['flip_rate'])} [{_pct(a['flip_lo'])}, {_pct(a['flip_hi'])}]",
        f"{a['mean_dp']:.5f}",
        f"{a['max_dp']:.5f}",
        f"{100 * a['accuracy_delta']:+.3f}",
        f"{a['fixed']} / {a['broke']}",
        f"{a['mcnemar_p']:.2g}",
    ]


def _agreement(summary: dict[str, Any]) -> list[str]:
    pairs = summary["pairs"]
    rows = [_agreement_row(key, pair["overall"]) for key, pair in pairs.items()]
    lines = [
        "## Agreement between variants (same items)",
        "",
        *_table(_AGREEMENT_HEAD, ["---", "---:", "---"] + ["---:"] * 5, rows),
    ]
    return lines + _agreement_breakdowns(summary) if pairs else lines


def _agreement_breakdowns(summary: dict[str, Any]) -> list[str]:
    """The pairs' flips per set and by the reference's margin."""
    pairs = summary["pairs"]
    per_set = [
        [s, *(f"{p['per_set'][s]['flips']}/{p['per_set'][s]['n']}" for p in pairs.values())]
        for s in summary["per_set"]
    ]
    margins = next(iter(pairs.values()))["overall"]["by_margin"]
    by_margin = [
        [key, *(f"{b['flips']}/{b['n']}" for b in pair["overall"]["by_margin"])]
        for key, pair in pairs.items()
    ]
    return [
        "",
        "Flip rate per set:",
        "",
        *_table(["set", *pairs], ["---"] + ["---:"] * len(pairs), per_set),
        "",
        "Flips by the reference's margin (top-1 minus top-2 probability): flips/decisions",
        "",
        *_table(
            ["pair", *(f"{b['lo']:g}-{b['hi']:g}" for b in margins)],
            ["---"] + ["---:"] * len(margins),
            by_margin,
        ),
    ]


def _targets(summary: dict[str, Any]) -> list[str]:
    def verdict(ok: bool) -> str:
        return "holds" if ok else "MISSED"

    rows = [
        [
            t["style"],
            t.get("int8", "int8"),  # summaries written before int8-1digit existed
            f"{t['accuracy_gap_points']:.3f} ({verdict(t['accuracy_gap_holds'])})",
            f"{_pct(t['flip_int8_vs_fp32'])} % vs {_pct(t['flip_bf16_vs_fp32'])} % "
            f"({verdict(t['flip_holds'])})",
        ]
        for t in summary["targets"]
    ]
    head = [
        "style",
        "int8 variant",
        "abs(int8 - bf16) accuracy, points (<= 0.03)",
        "flip int8~fp32 <= flip bf16~fp32",
    ]
    return ["## Targets", "", *_table(head, ["---"] * 4, rows)]


def markdown(summary: dict[str, Any]) -> str:
    lines = [
        *_header(summary),
        "",
        *_accuracy(summary),
        "",
        *_calibration(summary),
        "",
        *_agreement(summary),
    ]
    if summary["targets"]:
        lines += ["", *_targets(summary)]
    if summary.get("seconds"):
        lines += [
            "",
            "Engine seconds per variant (this process; timings swing with machine load): "
            + ", ".join(f"{k} {v:.0f} s" for k, v in summary["seconds"].items()),
        ]
    lines += [
        "",
        "![reliability](reliability.png) ![confidence vs accuracy](confidence_vs_accuracy.png)",
        "",
    ]
    return "\n".join(lines)


def write(out: Path, summary: dict[str, Any]) -> None:
    """summary.json and report.md into `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=float) + "\n")
    (out / "report.md").write_text(markdown(summary))
