"""What XLA made of a step's executables: the optimized HLO of each forward part, tail and
readout of one token bucket, its instructions counted by opcode, and every copy and slice
listed with its shape. For finding work XLA adds around the custom calls (copies
of sliced step tables, copies of donated pools) that a trace shows only as kernel names.

    python3 benchmarks/step_hlo.py [--preset gemma3-27b] [--single-digit] [--tokens 32]
        [--out DIR] [engine options of e2e_decide.py]

Prints one JSON line per executable ({"key", "part", "opcodes", "copies"}) and writes each
executable's HLO text to DIR/<key>.hlo.txt when --out is given. On the CPU it runs as a smoke
test (--preset tiny): the CPU backend's HLO is not the GPU's.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re
import sys

from dispatch_probe import probe_engine  # benchmarks/ is sys.path[0] as a script
from e2e_decide import add_engine_options
from e2e_scenarios import PRESETS

# An HLO instruction line: "%name = type opcode(operands), ...", the type one shape
# ("s32[32]{0}") or a tuple of them ("(f32[32,5376]{1,0}, u8[1]{0})", as custom calls have).
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?[\w.\-]+ = (\(.*?\)|\S+) ([\w\-]+)\(")
LISTED = ("copy", "copy-start", "slice", "dynamic-slice")


def summarize(hlo: str) -> tuple[dict[str, int], list[str]]:
    """(opcode -> count, the LISTED instructions' lines) of the entry and fused computations
    together; the listed lines are cut to 200 characters."""
    counts: collections.Counter = collections.Counter()
    listed = []
    for line in hlo.splitlines():
        m = INSTRUCTION.match(line)
        if not m:
            continue
        counts[m.group(2)] += 1
        if m.group(2) in LISTED:
            listed.append(line.strip()[:200])
    return dict(counts.most_common()), listed


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gemma3-27b")
    p.add_argument("--single-digit", action="store_true")
    p.add_argument("--tokens", type=int, default=32, help="the token bucket (e2e: 32, 256, 448)")
    p.add_argument("--rows", type=int, default=1, help="the row bucket of the tail and readout")
    p.add_argument("--candidates", type=int, default=4, help="the readout's candidate bucket")
    p.add_argument("--out", type=pathlib.Path)
    add_engine_options(p)
    args = p.parse_args(argv)
    engine, _ = probe_engine(args)
    runner = engine.runner
    t, r, c = args.tokens, args.rows, args.candidates
    keys = runner.step_keys(t, r, c)
    assert keys, f"no executables for tokens={t}"
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
    for key in keys:
        exes = runner.executable(key)
        for part, exe in enumerate(exes if isinstance(exes, tuple) else (exes,)):
            hlo = exe.as_text()
            opcodes, copies = summarize(hlo)
            name = "_".join(map(str, key)) + f"_part{part}"
            row = {"key": list(key), "part": part, "opcodes": opcodes, "copies": copies}
            print(json.dumps(row))
            if args.out:
                (args.out / f"{name}.hlo.txt").write_text(hlo)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
