"""E2E.md and e2e.png from the JSON lines of benchmarks/e2e_decide.py (also its --render)."""

from __future__ import annotations

import json
import pathlib
import sys

import numpy as np


def log(msg: str) -> None:
    print(f"[e2e] {msg}", file=sys.stderr, flush=True)


def render(out: pathlib.Path) -> None:
    rows = [json.loads(line) for line in (out / "e2e.jsonl").read_text().splitlines() if line]
    if not rows:
        return log(f"{out / 'e2e.jsonl'} has no results: nothing to render")
    write_markdown(out / "E2E.md", rows)
    setup = out / "compile.json"
    if setup.exists():  # the run's set-up costs, under the table
        s = json.loads(setup.read_text())
        with open(out / "E2E.md", "a") as f:
            f.write(
                f"\nSet-up: random weights int8 {s['init_int8_s']} s, bf16 {s['init_bf16_s']} s; "
                f"compiling {sum(s['compile_s'].values()):.1f} s ({len(s['compile_s'])} "
                f"executables, each in compile.json); whole run {s.get('total_s')} s.\n"
            )
    try:
        plot(out / "e2e.png", rows)
    except ImportError:
        log("matplotlib missing: no e2e.png (re-render elsewhere with --render DIR)")


def _ms(x: dict) -> str:
    return f"{x['median_ms']:.1f} ({x['min_ms']:.1f}-{x['max_ms']:.1f})"


def write_markdown(path: pathlib.Path, rows: list[dict]) -> None:
    m = rows[0]
    lines = [
        f"# End-to-end decision latency, {m['preset']} ({m['layers']} layers), random weights",
        "",
        f"Card {m['card']} ({m['platform']}), jax {m['jax']}, commit {m['commit']}, "
        f"{m['date']}; `benchmarks/e2e_decide.py`, token buckets {m['token_buckets']}, "
        f"prefill chunk {m['chunk']}, {m['kv_pages']} KV pages of 16 tokens.",
        "",
    ]
    if m["smoke"]:
        lines += [
            "**SMOKE RUN (not a GPU run of the full 27B preset with >= 10 timed runs): these "
            "numbers are not results.**",
            "",
        ]
    lines += [
        "Milliseconds, median (min-max) over the timed runs; prism_jax = int8 engine, "
        "baseline = bf16 XLA, one full-vocabulary request per question; ratio = "
        "baseline / prism_jax.",
        "",
        "| scenario | tokens computed (cached) | prism_jax | bf16 XLA baseline | ratio "
        "| target | meets | Prism (published) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        meets = "yes" if r["prism"]["median_ms"] <= r["target_ms"] else "no"
        lines.append(
            f"| {r['title']} | {r['computed_tokens']} ({r['cached_tokens']}) | "
            f"{_ms(r['prism'])} | {_ms(r['baseline'])} | {r['ratio']:.1f}x | "
            f"<= {r['target_ms']:g} | {meets} | {r['prism_published_ms']:g} |"
        )
    if any("split_ms" in r for r in rows):
        lines += [
            "",
            "Split of one run (medians, ms; synchronised after every part):",
            "",
            "| scenario | host prep | forward steps | readout |",
            "|---|---|---|---|",
        ]
        for r in rows:
            sp = r.get("split_ms")
            if sp:
                lines.append(
                    f"| {r['scenario']} | {sp['host_ms']:.2f} | "
                    f"{sp['forward_ms']:.2f} | {sp['readout_ms']:.2f} |"
                )
    path.write_text("\n".join(lines) + "\n")


def plot(path: pathlib.Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(9, 4.5))
    bars = [("prism_jax int8", "prism", "tab:blue"), ("bf16 XLA baseline", "baseline", "tab:gray")]
    for i, (label, key, color) in enumerate(bars):
        med = np.array([r[key]["median_ms"] for r in rows])
        err = np.array(
            [[m - r[key]["min_ms"], r[key]["max_ms"] - m] for m, r in zip(med, rows, strict=False)]
        ).T
        ax.bar(x + (i - 1.5) * 0.2, med, 0.2, yerr=err, capsize=3, label=label, color=color)
    ax.bar(
        x + 0.1,
        [r["prism_published_ms"] for r in rows],
        0.2,
        label="Prism (published)",
        color="tab:orange",
    )
    ax.bar(x + 0.3, [r["target_ms"] for r in rows], 0.2, label="target", color="tab:green")
    ax.set_xticks(x, [r["title"].replace(" (", "\n(") for r in rows], fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("ms per decision (log)")
    smoke = " - SMOKE RUN, not results" if rows[0]["smoke"] else ""
    ax.set_title(
        f"{rows[0]['preset']} on {rows[0]['card']}, {rows[0]['commit']}{smoke}", fontsize=9
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
