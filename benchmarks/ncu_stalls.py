"""The stall reasons of each profiled kernel, from Nsight Compute's raw page.

    ncu -i report.ncu-rep --page raw --csv > raw.csv
    python3 benchmarks/ncu_stalls.py raw.csv [--top 6]

occupancy_ncu.sh collects the smsp__average_warps_issue_stalled_*_per_issue_active metrics
when NCU_STALLS=1: for each reason, the warps stalled on it per issued instruction. Prints one
line per kernel launch: its name, then its largest reasons with their values.
"""

from __future__ import annotations

import argparse
import csv
import sys

PREFIX = "smsp__average_warps_issue_stalled_"
SUFFIX = "_per_issue_active.ratio"


def stalls(rows: list[dict[str, str]], top: int) -> list[str]:
    """One line per launch: 'name: reason value, ...' with the `top` largest reasons."""
    lines = []
    for row in rows:
        name = row.get("Kernel Name", "?")
        reasons = []
        for key, value in row.items():
            if key.startswith(PREFIX) and key.endswith(SUFFIX):
                try:
                    reasons.append((float(value.replace(",", "")), key[len(PREFIX) : -len(SUFFIX)]))
                except ValueError:
                    continue  # a unit row or an empty cell
        if not reasons:
            continue
        reasons.sort(reverse=True)
        listed = ", ".join(f"{reason} {value:.2f}" for value, reason in reasons[:top])
        lines.append(f"{name[:80]}: {listed}")
    return lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("raw_csv")
    p.add_argument("--top", type=int, default=6)
    args = p.parse_args()
    with open(args.raw_csv, newline="") as f:
        rows = list(csv.DictReader(f))
    lines = stalls(rows, args.top)
    print("\n".join(lines) if lines else "no stall metrics in " + args.raw_csv)
    return 0 if lines else 1


if __name__ == "__main__":
    sys.exit(main())
