"""Per-op GPU time from a jax.profiler trace: where a decision's milliseconds go.

    python3 benchmarks/trace_breakdown.py TRACE_DIR [--runs N] [--out FILE.json]

Reads every *.xplane.pb under TRACE_DIR (jax.profiler.trace output), sums the duration of every
kernel on the GPU streams by kernel name, groups kernels into ops (our custom calls by their
kernel names in cc/ops/*.cu, CUTLASS, XLA's own dots and fusions, copies) and prints one JSON
line per group and per top kernel, in ms per run when --runs gives the number of runs traced.
Stream busy time can exceed wall time when streams overlap; the sum is GPU time, not latency.
On a CPU-only trace (no GPU plane) it reports the XLA CPU thunks instead, for smoke tests.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import re

from jax.profiler import ProfileData

# Kernel name pattern -> op group; the first match wins (names as nvcc / CUTLASS / XLA emit them).
GROUPS = (
    ("tree_attention", re.compile(r"AttendKernel|WriteKernel|split::\w+Kernel|DigitMergeKernel")),
    (
        "int8_gemm",
        re.compile(r"cutlass|Int8GemmKernel|DecodeKernel|TmaStreamKernel|int8_gemm", re.I),
    ),
    ("rmsnorm_quant", re.compile(r"Norm(Warp|Reg|Split)?RowsKernel")),
    ("glu_quant", re.compile(r"Glu2?(Sum)?RowsKernel")),
    ("qkv_rope", re.compile(r"QkvRopeKernel")),
    ("candidate_head", re.compile(r"Candidate|Vocab(Tile|Merge)Kernel")),
    ("xla_dot", re.compile(r"gemm|nvjet|xmma|cublas|sm\d+_.*_(tn|nt|nn|tt)", re.I)),
    ("copies", re.compile(r"memcpy|memset|copy", re.I)),
    (
        "xla_fusions",
        re.compile(r"fusion|loop_|input_|wrapped_|reduce|concatenate|slice|broadcast", re.I),
    ),
)


def group_of(kernel: str) -> str:
    for name, pattern in GROUPS:
        if pattern.search(kernel):
            return name
    return "other"


def kernel_times(trace_dir: pathlib.Path) -> tuple[dict[str, float], dict[str, int], str]:
    """Kernel name -> total ns and launch count over every GPU stream of every trace file."""
    files = sorted(trace_dir.rglob("*.xplane.pb"))
    assert files, f"no *.xplane.pb under {trace_dir}: pass the directory jax.profiler.trace wrote"
    total: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    source = "gpu"
    for f in files:
        data = ProfileData.from_file(str(f))
        planes = [p for p in data.planes if p.name.startswith("/device:GPU")]
        if not planes:  # CPU smoke test: XLA's CPU thunks on the host plane
            source = "cpu"
            planes = [p for p in data.planes if p.name == "/host:CPU"]
        for plane in planes:
            for line in plane.lines:
                if source == "gpu" and not line.name.startswith("Stream"):
                    continue  # "XLA Ops"/"XLA Modules" lines repeat the stream time
                if source == "cpu" and not line.name.startswith("tf_XLA"):
                    continue
                for event in line.events:
                    total[event.name] += event.duration_ns
                    count[event.name] += 1
    return total, count, source


def breakdown(trace_dir: pathlib.Path, runs: int, top: int = 15) -> list[dict]:
    total, count, source = kernel_times(trace_dir)
    per_run = 1e-6 / runs  # ns -> ms per run
    groups: dict[str, float] = collections.defaultdict(float)
    launches: dict[str, int] = collections.Counter()
    for name, ns in total.items():
        groups[group_of(name)] += ns
        launches[group_of(name)] += count[name]
    all_ns = sum(total.values()) or 1.0
    rows = [
        {
            "kind": "group",
            "source": source,
            "group": g,
            "ms_per_run": ns * per_run,
            "share": ns / all_ns,
            "launches_per_run": launches[g] / runs,
        }
        for g, ns in sorted(groups.items(), key=lambda kv: -kv[1])
    ]
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        rows.append(
            {
                "kind": "kernel",
                "source": source,
                "group": group_of(name),
                "kernel": name[:160],
                "ms_per_run": ns * per_run,
                "share": ns / all_ns,
                "launches_per_run": count[name] / runs,
            }
        )
    rows.append({"kind": "total", "source": source, "ms_per_run": all_ns * per_run})
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trace_dir", type=pathlib.Path)
    p.add_argument("--runs", type=int, default=1, help="runs the trace holds (to print per run)")
    p.add_argument("--label", default="", help="scenario name stored in each row")
    p.add_argument("--out", type=pathlib.Path, help="append the rows to this JSON-lines file")
    args = p.parse_args(argv)
    assert args.runs >= 1, "--runs counts traced runs: at least 1"
    rows = [{"label": args.label, **r} for r in breakdown(args.trace_dir, args.runs)]
    for row in rows:
        print(json.dumps(row))
    if args.out:
        with open(args.out, "a") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)


if __name__ == "__main__":
    main()
