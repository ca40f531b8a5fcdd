"""Agreement between two evaluation runs of the same variants (e.g. the CPU and the CUDA build,
or before and after a quantisation change), on the items both decided:

    python -m prism_jax.eval.compare RUN_A RUN_B

Prints one JSON line per variant file present in both output directories: flips of the top
option, their rate and Wilson interval, mean and max |dp| (metrics.agreement).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from prism_jax.eval import metrics
from prism_jax.eval.runner import load_done


def compare(a: Path, b: Path) -> list[dict]:
    out = []
    for path in sorted(a.glob("predictions-*.jsonl")):
        other = b / path.name
        if not other.is_file():
            continue
        pa, pb = load_done(path), load_done(other)
        common = sorted(set(pa) & set(pb))
        if not common:
            continue
        stats = metrics.agreement([pa[i] for i in common], [pb[i] for i in common])
        out.append({"variant": path.stem.removeprefix("predictions-"), **stats})
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m prism_jax.eval.compare", description=__doc__)
    p.add_argument("run_a", type=Path)
    p.add_argument("run_b", type=Path)
    args = p.parse_args(argv)
    rows = compare(args.run_a, args.run_b)
    for row in rows:
        print(json.dumps(row))
    return 0 if rows else 1


if __name__ == "__main__":
    sys.exit(main())
