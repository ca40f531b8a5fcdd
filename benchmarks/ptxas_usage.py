"""Registers and spill bytes per kernel of one CUDA source, from `nvcc -Xptxas -v` (sm_90a, -O3,
the extension's flags), optionally beside the same source in another checkout.

    python3 benchmarks/ptxas_usage.py cc/ops/glu_quant_cuda.cu --against /tmp/base

Needs nvcc, no GPU. An option compiled in as a template flag should leave the default
instantiation's registers and spills as they were: `--against` a worktree of the commit before
(`git worktree add /tmp/base <commit>`) shows whether it did. Kernels are matched by demangled
name, or failing that with this checkout's last `--strip` template arguments removed.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import re
import shutil
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
ENTRY = re.compile(r"Compiling entry function '([^']+)'")
SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")
REGS = re.compile(r"Used (\d+) registers")


def include_dirs() -> list[str]:
    import cutlass_library  # noqa: PLC0415 (a build requirement, as in CMakeLists.txt)
    import jax.ffi  # noqa: PLC0415

    cutlass = os.path.join(os.path.dirname(cutlass_library.__file__), "source", "include")
    return [jax.ffi.include_dir(), cutlass]


def nvcc_command(src: str, root: pathlib.Path) -> list[str]:
    """nvcc compiling root/src as CMakeLists.txt compiles it (sm_90a); add the output's flags."""
    cmd = ["nvcc", "-DPRISM_WITH_CUDA", f"-I{root}"]
    cmd += [arg for d in include_dirs() for arg in ("-isystem", d)]
    cmd += ["-O3", "-DNDEBUG", "-std=c++17", "--generate-code=arch=compute_90a,code=[sm_90a]"]
    cmd += ["-fmad=false", "--expt-relaxed-constexpr", "-x", "cu", str(root / src)]
    return cmd


def ptxas_log(src: str, root: pathlib.Path) -> str:
    """nvcc's -Xptxas -v output for root/src, compiled as CMakeLists.txt compiles it."""
    cmd = nvcc_command(src, root) + ["-Xptxas", "-v", "-c", "-o", os.devnull]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, f"nvcc failed on {root / src}:\n{proc.stderr[-3000:]}"
    return proc.stdout + proc.stderr


def demangle(names: list[str]) -> list[str]:
    if not names or shutil.which("c++filt") is None:
        return names
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return out.stdout.splitlines()


def without_parameters(name: str) -> str:
    """A demangled signature without its parameter list: the last parenthesised group, which
    "(anonymous namespace)" in the qualified name is not."""
    if not name.endswith(")"):
        return name
    depth = 0
    for i in range(len(name) - 1, -1, -1):
        depth += (name[i] == ")") - (name[i] == "(")
        if depth == 0:
            return name[:i]
    return name


def usage(log: str) -> dict[str, tuple[int, int, int]]:
    """Demangled kernel name (no parameter list) -> (registers, spill stores, spill loads)."""
    rows: dict[str, list[int]] = {}
    current = None
    for line in log.splitlines():
        if m := ENTRY.search(line):
            current = m.group(1)
            rows[current] = [0, 0, 0]
        elif current and (m := SPILLS.search(line)):
            rows[current][1:] = [int(m.group(1)), int(m.group(2))]
        elif current and (m := REGS.search(line)):
            rows[current][0] = int(m.group(1))
    names = [without_parameters(n) for n in demangle(list(rows))]
    return {n: tuple(v) for n, v in zip(names, rows.values(), strict=True)}


def base_name(name: str, strip: int) -> str:
    """name with its last `strip` template arguments removed (the options' flags)."""
    if strip == 0 or not name.endswith(">"):
        return name
    head, args = name[: name.index("<") + 1], name[name.index("<") + 1 : -1]
    parts, depth, start = [], 0, 0
    for i, c in enumerate(args + ","):  # top-level commas only
        depth += (c == "<") - (c == ">")
        if c == "," and depth == 0:
            parts.append(args[start:i].strip())
            start = i + 1
    return head + ", ".join(parts[:-strip]) + ">"


def table(mine: dict, other: dict | None, strip: int) -> str:
    lines = ["| kernel | registers | spill stores / loads (B) | other checkout | same |"]
    lines.append("|---|---:|---:|---:|---|")
    for name, (regs, st, ld) in sorted(mine.items()):
        # The name as it is, else without the option flags this checkout added.
        theirs = None if other is None else other.get(name, other.get(base_name(name, strip)))
        cell = f"{theirs[0]} / {theirs[1]} / {theirs[2]}" if theirs else "-"
        same = "" if theirs is None else ("yes" if theirs == (regs, st, ld) else "no")
        lines.append(f"| {name[:100]} | {regs} | {st} / {ld} | {cell} | {same} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("src", help="a CUDA source, relative to the checkout (cc/ops/...)")
    p.add_argument("--against", type=pathlib.Path, help="another checkout to compile it in")
    p.add_argument("--strip", type=int, default=0, help="trailing template flags to ignore")
    args = p.parse_args(argv)
    mine = usage(ptxas_log(args.src, ROOT))
    other = usage(ptxas_log(args.src, args.against)) if args.against else None
    sys.stdout.write(table(mine, other, args.strip))
    return 0


if __name__ == "__main__":
    sys.exit(main())
