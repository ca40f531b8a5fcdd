"""Figures for the report (matplotlib, Agg): a reliability diagram and confidence vs accuracy
per set, one series per variant."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def reliability_diagram(path: Path, bins: Mapping[str, list[dict]], title: str) -> None:
    """Accuracy against mean confidence per 10 %-wide confidence bin (marker area ~ count);
    the diagonal is perfect calibration."""
    fig, (ax, hist) = plt.subplots(2, 1, figsize=(6, 7), height_ratios=(3, 1), sharex=True)
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="perfectly calibrated")
    width = 0.1 / max(len(bins), 1)
    for k, (name, series) in enumerate(bins.items()):
        full = [b for b in series if b["n"]]
        total = sum(b["n"] for b in full) or 1
        ax.plot(
            [b["confidence"] for b in full],
            [b["accuracy"] for b in full],
            marker="o",
            lw=1,
            label=name,
        )
        ax.scatter(
            [b["confidence"] for b in full],
            [b["accuracy"] for b in full],
            s=[600 * b["n"] / total for b in full],
            alpha=0.25,
        )
        hist.bar(
            [b["lo"] + width * (k + 0.5) for b in series],
            [b["n"] for b in series],
            width=width,
            label=name,
        )
    ax.set(xlim=(0, 1), ylim=(0, 1), ylabel="accuracy", title=title)
    ax.legend(loc="upper left", fontsize=8)
    hist.set(xlabel="confidence (top option probability)", ylabel="decisions")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def confidence_vs_accuracy(
    path: Path, per_set: Mapping[str, Mapping[str, dict]], title: str
) -> None:
    """One point per (set, variant): mean confidence against accuracy; points under the
    diagonal are over-confident sets."""
    fig, ax = plt.subplots(figsize=(7, 6))
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--")
    markers = "osD^v<>ph*"
    for k, (variant, sets) in enumerate(per_set.items()):
        xs = [s["mean_confidence"] for s in sets.values()]
        ys = [s["accuracy"] for s in sets.values()]
        ax.scatter(xs, ys, marker=markers[k % len(markers)], label=variant, alpha=0.75)
        if k == 0:
            for name, s in sets.items():
                ax.annotate(
                    name,
                    (s["mean_confidence"], s["accuracy"]),
                    fontsize=6,
                    xytext=(3, 3),
                    textcoords="offset points",
                )
    ax.set(
        xlim=(0, 1),
        ylim=(0, 1),
        xlabel="mean confidence (top option probability)",
        ylabel="accuracy",
        title=title,
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
