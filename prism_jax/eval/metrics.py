"""Accuracy with Wilson intervals, calibration (ECE, Brier, reliability bins) and agreement
between two runs of the same items (decision flips, |dp|).

Conventions (docs/ACCURACY.md): a decision is correct when its most probable option (first
one on ties) is the gold option; its confidence is that top probability; Brier is the
multi-class score sum_k (p_k - [k = gold])^2 averaged over decisions (0 best, 2 worst); |dp|
of a decision is max_k |p_k - q_k| over its options.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

Z95 = 1.959963984540054  # two-sided 95 % normal quantile


def wilson(k: int, n: int, z: float = Z95) -> tuple[float, float]:
    """The Wilson score interval for k successes in n trials ((0, 1) when n = 0)."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def mcnemar_p(fixed: int, broke: int) -> float:
    """Exact two-sided McNemar test: the probability, if a change of variant were as likely to
    fix a decision as to break one, of a split at least this uneven (binomial, p = 1/2)."""
    n = fixed + broke
    if n == 0:
        return 1.0
    k = min(fixed, broke)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def top(probs: Sequence[float]) -> int:
    return int(np.argmax(np.asarray(probs, np.float64)))


def accuracy(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> dict[str, float]:
    """{"n", "correct", "accuracy", "lo", "hi"} with the 95 % Wilson interval."""
    correct = sum(top(p) == g for p, g in zip(probs, gold, strict=True))
    n = len(gold)
    lo, hi = wilson(correct, n)
    return {
        "n": n,
        "correct": correct,
        "accuracy": correct / n if n else float("nan"),
        "lo": lo,
        "hi": hi,
    }


def reliability_bins(
    confidence: Sequence[float], correct: Sequence[bool], bins: int = 10
) -> list[dict[str, float]]:
    """Equal-width confidence bins on [0, 1] (the last one closed): per bin its edges, count,
    mean confidence and accuracy (NaN when empty)."""
    conf = np.asarray(confidence, np.float64)
    hit = np.asarray(correct, np.float64)
    index = np.minimum((conf * bins).astype(int), bins - 1)
    out = []
    for b in range(bins):
        mask = index == b
        n = int(mask.sum())
        out.append(
            {
                "lo": b / bins,
                "hi": (b + 1) / bins,
                "n": n,
                "confidence": float(conf[mask].mean()) if n else float("nan"),
                "accuracy": float(hit[mask].mean()) if n else float("nan"),
            }
        )
    return out


def ece(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """Expected calibration error: sum over bins of n_b / N * |accuracy_b - confidence_b|."""
    total = len(confidence)
    if total == 0:
        return float("nan")
    return sum(
        b["n"] / total * abs(b["accuracy"] - b["confidence"])
        for b in reliability_bins(confidence, correct, bins)
        if b["n"]
    )


def brier(probs: Sequence[Sequence[float]], gold: Sequence[int]) -> float:
    """Multi-class Brier score: mean over decisions of sum_k (p_k - [k = gold])^2."""
    if not gold:
        return float("nan")
    total = 0.0
    for p, g in zip(probs, gold, strict=True):
        onehot = np.zeros(len(p))
        onehot[g] = 1.0
        total += float(np.sum((np.asarray(p, np.float64) - onehot) ** 2))
    return total / len(gold)


def calibration(probs: Sequence[Sequence[float]], gold: Sequence[int], bins: int = 10) -> dict:
    """{"ece", "brier", "mean_confidence", "bins"} for one run."""
    confidence = [float(np.max(p)) for p in probs]
    correct = [top(p) == g for p, g in zip(probs, gold, strict=True)]
    return {
        "ece": ece(confidence, correct, bins),
        "brier": brier(probs, gold),
        "mean_confidence": float(np.mean(confidence)) if confidence else float("nan"),
        "bins": reliability_bins(confidence, correct, bins),
    }


MARGIN_EDGES = (0.0, 0.01, 0.05, 0.1, 0.2, 1.0)  # reference top-1 minus top-2 probability


def margin(probs: Sequence[float]) -> float:
    """Top probability minus the runner-up (1 for a single option)."""
    p = np.sort(np.asarray(probs, np.float64))[::-1]
    return float(p[0] - p[1]) if len(p) > 1 else 1.0


def agreement(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], gold: Sequence[int] | None = None
) -> dict[str, Any]:
    """How far run b's decisions are from run a's on the same items: flips (the top option
    changes) with their rate and Wilson interval, mean and max |dp|; with gold, also the
    accuracy difference b - a, how many flips fixed or broke a decision, and the exact McNemar
    p-value of that split. "by_margin" splits decisions by run a's margin (MARGIN_EDGES):
    thin margins flip under any perturbation, wide ones should not."""
    flips, dps = 0, []
    fixed = broke = 0
    bins = [[0, 0] for _ in MARGIN_EDGES[:-1]]  # [decisions, flips] per margin bin
    for i, (p, q) in enumerate(zip(a, b, strict=True)):
        p64, q64 = np.asarray(p, np.float64), np.asarray(q, np.float64)
        dps.append(float(np.max(np.abs(p64 - q64))))
        k = min(int(np.searchsorted(MARGIN_EDGES, margin(p64), side="right")) - 1, len(bins) - 1)
        bins[k][0] += 1
        if top(p64) != top(q64):
            flips += 1
            bins[k][1] += 1
            if gold is not None:
                fixed += top(q64) == gold[i]
                broke += top(p64) == gold[i]
    n = len(dps)
    lo, hi = wilson(flips, n)
    out = {
        "n": n,
        "flips": flips,
        "flip_rate": flips / n if n else float("nan"),
        "flip_lo": lo,
        "flip_hi": hi,
        "mean_dp": float(np.mean(dps)) if dps else float("nan"),
        "max_dp": float(np.max(dps)) if dps else float("nan"),
        "by_margin": [
            {"lo": MARGIN_EDGES[j], "hi": MARGIN_EDGES[j + 1], "n": n_j, "flips": f_j}
            for j, (n_j, f_j) in enumerate(bins)
        ],
    }
    if gold is not None:
        out.update(
            {
                "fixed": fixed,
                "broke": broke,
                "accuracy_delta": (fixed - broke) / n if n else float("nan"),
                "mcnemar_p": mcnemar_p(fixed, broke),
            }
        )
    return out
