"""Two traced e2e runs side by side: per scenario, each op group's GPU ms a step in A and B, the
difference, and the step's busy, idle and span time (trace_breakdown.py's breakdown.jsonl rows).

    python3 benchmarks/breakdown_ab.py A/breakdown.jsonl B/breakdown.jsonl --names main,-wk

Kernel time repeats within ~1 % across machine starts and walls do not (patch_ab.sh), so an A/B
of a kernel option reads these rows. Kernels are listed by name as well, the largest first;
a kernel whose name changed between A and B (another template instance) shows on two lines.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys


def load(path: pathlib.Path) -> dict[str, dict[str, dict[str, float]]]:
    """scenario -> section ("group", "kernel", "step") -> name -> ms a run."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        scenario, kind = row.get("scenario"), row.get("kind")
        if scenario is None:
            continue
        sec = out.setdefault(scenario, {"group": {}, "kernel": {}, "step": {}})
        if kind == "group":
            sec["group"][row["group"]] = row["ms_per_run"]
        elif kind == "kernel":
            sec["kernel"][row["kernel"]] = sec["kernel"].get(row["kernel"], 0.0) + row["ms_per_run"]
        elif kind == "gaps" and "busy_ms" in row:
            sec["step"] |= {k: row[f"{k}_ms"] for k in ("busy", "idle", "span")}
    return out


def rows(a: dict[str, float], b: dict[str, float], top: int) -> list[str]:
    """Markdown rows of the names in a or b, the largest (in either) first."""
    names = sorted(set(a) | set(b), key=lambda n: -max(a.get(n, 0.0), b.get(n, 0.0)))[:top]
    out = []
    for n in names:
        x, y = a.get(n), b.get(n)
        cells = [f"{v:.3f}" if v is not None else "-" for v in (x, y)]
        delta = f"{y - x:+.3f}" if x is not None and y is not None else "-"
        pct = f"{100 * (y - x) / x:+.1f} %" if x and y is not None else "-"
        out.append(f"| {n[:90]} | {cells[0]} | {cells[1]} | {delta} | {pct} |")
    return out


def markdown(a: dict, b: dict, names: tuple[str, str], top: int) -> str:
    lines = [f"# GPU ms a step: A = {names[0]}, B = {names[1]}", ""]
    for scenario in sorted(set(a) & set(b)):
        sa, sb = a[scenario], b[scenario]
        head = f"| {{}} | {names[0]} | {names[1]} | B - A | (B - A) / A |"
        rule = "|---|---:|---:|---:|---:|"
        lines += [f"## {scenario}", "", head.format("step"), rule]
        lines += rows(sa["step"], sb["step"], 3)
        lines += ["", head.format("op group"), rule, *rows(sa["group"], sb["group"], top)]
        lines += ["", head.format("kernel"), rule, *rows(sa["kernel"], sb["kernel"], top), ""]
    only = sorted(set(a) ^ set(b))
    if only:
        lines.append(f"Scenarios in one run only: {', '.join(only)}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("a", type=pathlib.Path)
    p.add_argument("b", type=pathlib.Path)
    p.add_argument("--names", default="A,B", help="the two runs' names, comma-separated")
    p.add_argument("--top", type=int, default=12, help="op groups and kernels listed")
    args = p.parse_args(argv)
    names = tuple(args.names.split(","))
    assert len(names) == 2, f"--names takes two comma-separated names, got {args.names!r}"
    sys.stdout.write(markdown(load(args.a), load(args.b), names, args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
