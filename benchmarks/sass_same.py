"""Whether a rewrite of a CUDA source left its machine code as it was: each kernel's SASS
(sm_90a, the extension's flags) in this checkout beside the same source in another one.

    python3 benchmarks/sass_same.py cc/ops/norm_quant_cuda.cu --against /tmp/base --only NormReg

Needs nvcc and cuobjdump (not part of the nvcc here: `pip download --no-deps
nvidia-cuda-cuobjdump` and put its nvidia/cu13/bin on PATH), no GPU. A kernel whose SASS is
identical runs the same instructions, so neither its bits nor its time can have moved; one
that differs needs a GPU run to say either. Kernels are matched by demangled name, or failing
that with this checkout's last `--strip` template arguments removed (ptxas_usage.base_name).
Branch targets and instruction addresses are compared as they are: an instruction more or less
anywhere before them counts as a difference.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import ptxas_usage

ROOT = pathlib.Path(__file__).resolve().parents[1]
FUNCTION = re.compile(r"^\s+Function : (\S+)\s*$")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(.*?)\s*;")


def sass(src: str, root: pathlib.Path) -> str:
    """cuobjdump -sass of root/src compiled to a cubin as the extension compiles it."""
    assert shutil.which("cuobjdump"), "cuobjdump is not on PATH (see this script's docstring)"
    with tempfile.TemporaryDirectory() as tmp:
        cubin = pathlib.Path(tmp) / "k.cubin"
        cmd = ptxas_usage.nvcc_command(src, root) + ["-cubin", "-o", str(cubin)]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        assert proc.returncode == 0, f"nvcc failed on {root / src}:\n{proc.stderr[-3000:]}"
        dump = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True)
        assert dump.returncode == 0, f"cuobjdump failed: {dump.stderr[-2000:]}"
        return dump.stdout


def kernels(dump: str) -> dict[str, list[str]]:
    """Demangled kernel name (no parameter list) -> its instructions, in order."""
    bodies: dict[str, list[str]] = {}
    current = None
    for line in dump.splitlines():
        if m := FUNCTION.match(line):
            current = m.group(1)
            bodies[current] = []
        elif current and (m := INSTRUCTION.search(line)):
            bodies[current].append(m.group(1))
    names = [ptxas_usage.without_parameters(n) for n in ptxas_usage.demangle(list(bodies))]
    return dict(zip(names, bodies.values(), strict=True))


def table(mine: dict, other: dict, strip: int, only: str) -> str:
    lines = ["| kernel | instructions | other checkout | same SASS |", "|---|---:|---:|---|"]
    same = total = 0
    for name, body in sorted(mine.items()):
        if only not in name:
            continue
        theirs = other.get(name, other.get(ptxas_usage.base_name(name, strip)))
        cell = "-" if theirs is None else str(len(theirs))
        verdict = "" if theirs is None else ("yes" if theirs == body else "no")
        total += 1
        same += verdict == "yes"
        lines.append(f"| {name[:100]} | {len(body)} | {cell} | {verdict} |")
    lines.append(f"\n{same} of {total} kernels have the same SASS")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", help="a CUDA source, relative to the checkout (cc/ops/...)")
    p.add_argument("--against", type=pathlib.Path, required=True, help="the other checkout")
    p.add_argument("--strip", type=int, default=0, help="trailing template flags to ignore")
    p.add_argument("--only", default="", help="kernels whose name contains this")
    args = p.parse_args(argv)
    mine = kernels(sass(args.src, ROOT))
    other = kernels(sass(args.src, args.against))
    sys.stdout.write(table(mine, other, args.strip, args.only))
    return 0


if __name__ == "__main__":
    sys.exit(main())
