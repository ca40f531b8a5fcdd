"""Where a kernel's instructions and stalls go, from Nsight Compute's per-instruction SASS page.

Input: `ncu -i REPORT --page source --print-source sass --csv > src.csv` (one kernel). Lines of
SASS that ran the same number of times in a row form a region: a straight-line block or a loop
body (a loop's body runs more often than the code around it). Regions are ranked by warp-stall
samples and printed with their instruction count, how often they ran, their share of executed
instructions and of stall samples, and their first instruction, which is usually enough to find
the source (a barrier, a load loop, an unrolled dot product).

    python3 benchmarks/ncu_regions.py src.csv --top 15
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import sys

EXECUTED = "Instructions Executed"
SAMPLES = "Warp Stall Sampling (All Samples)"


@dataclasses.dataclass(frozen=True)
class Region:
    first: int  # index of the region's first SASS line
    last: int  # inclusive
    runs: int  # how many times each of its instructions executed (warp-level)
    samples: int  # warp stall samples on its instructions
    fp: int  # FADD / FMUL / FFMA lines in it
    head: str  # its first instruction

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    @property
    def executed(self) -> int:
        return self.runs * self.size


def read_sass(path: str, kernel: int = 0) -> list[dict]:
    """The SASS rows of one kernel of an ncu source-page CSV (per profiled launch: a title row,
    then the header, then one row per instruction); `kernel` picks the launch, in file order."""
    with open(path, newline="") as f:
        rows = list(csv.reader(f))
    headers = [i for i, r in enumerate(rows) if EXECUTED in r and "Source" in r]
    if not headers:
        raise ValueError(
            f"{path} has no '{EXECUTED}' column: export it with "
            "ncu -i REPORT --page source --print-source sass --csv"
        )
    if not 0 <= kernel < len(headers):
        raise ValueError(f"{path} holds {len(headers)} kernels; --kernel {kernel} is not one")
    start = headers[kernel]
    stop = headers[kernel + 1] - 1 if kernel + 1 < len(headers) else len(rows)  # its title row
    header = rows[start]
    return [
        dict(zip(header, r, strict=False)) for r in rows[start + 1 : stop] if len(r) == len(header)
    ]


def _count(text: str) -> int:
    return int(text.replace(",", "") or 0)


def _opcode(source: str) -> str:
    words = source.split()
    if words and words[0].startswith("@"):  # a predicate guard: @P0, @!PT
        words = words[1:]
    return words[0].split(".")[0] if words else ""


def regions(sass: list[dict]) -> list[Region]:
    """Maximal runs of consecutive lines with the same execution count."""
    out, start = [], 0
    for i in range(1, len(sass) + 1):
        if i < len(sass) and _count(sass[i][EXECUTED]) == _count(sass[start][EXECUTED]):
            continue
        lines = sass[start:i]
        out.append(Region(
            start, i - 1, _count(lines[0][EXECUTED]), sum(_count(r[SAMPLES]) for r in lines),
            sum(_opcode(r["Source"]) in ("FADD", "FMUL", "FFMA") for r in lines),
            lines[0]["Source"].strip(),
        ))  # fmt: skip
        start = i
    return out


def report(found: list[Region], top: int) -> str:
    executed = sum(r.executed for r in found) or 1
    samples = sum(r.samples for r in found) or 1
    lines = [
        f"{executed:,} warp instructions executed, {samples:,} stall samples",
        "| lines | instructions | runs | of executed | of stalls | fp lines | first instruction |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in sorted(found, key=lambda r: -r.samples)[:top]:
        lines.append(
            f"| {r.first}-{r.last} | {r.size} | {r.runs:,} | {r.executed / executed:.1%} "
            f"| {r.samples / samples:.1%} | {r.fp} | `{r.head[:60]}` |"
        )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("csv", help="ncu --page source --print-source sass --csv output")
    parser.add_argument("--top", type=int, default=15, help="regions to print, by stall samples")
    parser.add_argument("--kernel", type=int, default=0, help="which profiled launch (0: first)")
    args = parser.parse_args()
    print(report(regions(read_sass(args.csv, args.kernel)), args.top))
    return 0


if __name__ == "__main__":
    sys.exit(main())
