"""The table of an args_ab.sh or extension_ab.sh run: one row per run, in run order, with each
scenario's median (min-max) wall in ms, then each variant's mean of its runs' medians.

    python3 benchmarks/args_ab_summary.py DIR     # DIR holds <run index>_<name>/e2e.jsonl
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import statistics


def runs(root: pathlib.Path) -> list[tuple[int, str, dict[str, dict]]]:
    """(run index, variant name, scenario -> its e2e.jsonl row) of each run, in run order; a
    run whose e2e.jsonl is missing or empty (cut short) has no scenarios."""
    out = []
    for d in root.iterdir():
        index, sep, name = d.name.partition("_")
        if not (d.is_dir() and sep and index.isdigit()):
            continue
        f = d / "e2e.jsonl"
        lines = f.read_text().splitlines() if f.exists() else []
        rows = [json.loads(line) for line in lines if line.startswith("{")]
        out.append((int(index), name, {r["scenario"]: r for r in rows}))
    return sorted(out)


def _cell(prism: dict | None) -> str:
    if prism is None:
        return "-"
    return f"{prism['median_ms']:.2f} ({prism['min_ms']:.2f}-{prism['max_ms']:.2f})"


def table(found: list[tuple[int, str, dict[str, dict]]]) -> str:
    assert found, "no <run index>_<name>/ folders: pass the directory args_ab.sh wrote"
    names = list(dict.fromkeys(s for _, _, rows in found for s in rows))
    lines = ["| run | variant | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    medians: dict[str, dict[str, list[float]]] = collections.defaultdict(
        lambda: {n: [] for n in names}
    )
    for index, name, rows in found:
        cells = []
        for s in names:
            p = rows[s]["prism"] if s in rows else None
            cells.append(
                f"{p['median_ms']:.2f} ({p['min_ms']:.2f}-{p['max_ms']:.2f})" if p else "-"
            )
            if p:
                medians[name][s].append(p["median_ms"])
        lines.append(f"| {index} | {name} | " + " | ".join(cells) + " |")
    lines += ["", "| variant | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for name, per in medians.items():
        cells = [f"{statistics.fmean(v):.2f}" if v else "-" for v in per.values()]
        lines.append(f"| {name} (mean of medians) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("root", type=pathlib.Path)
    print(table(runs(p.parse_args(argv).root)))


if __name__ == "__main__":
    main()
