"""int8_gemm kernels under Nsight Compute: each (shape, M, kernel) case's device time and DRAM
traffic, without the host timing around it that gemm_bench.py's per-op figures include.

    python3 benchmarks/gemm_ncu.py run --ms 64,128 --kernels dispatch,sm90_swap_ping_128x64x128_c2x1
    python3 benchmarks/gemm_ncu.py report NCU_RAW.csv CASES.json > gemm_ncu.md

`run` makes each case's operands on the host (numpy, so no XLA kernel runs between the GEMMs),
calls int8_gemm twice per case (the second call is the profiled one) and writes the case list
as JSON to --cases; benchmarks/gemm_ncu.sh runs it under ncu. "dispatch" is the kernel the
handler picks; any other name is forced with PRISM_INT8_GEMM_KERNEL (int8_gemm_cuda.cu).
`report` pairs ncu's rows (launch order, GEMM kernels only) with the cases: duration, weight
TB/s (N*K bytes / duration), DRAM read TB/s and grid size.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import pathlib
import sys

SHAPES = {"qkv": (8192, 5376), "o": (5376, 4096), "gate_up": (43008, 5376), "down": (5376, 21504)}
CALLS_PER_CASE = 2  # warm-up, then the profiled call


def run_cases(ms: list[int], kernels: list[str], shapes: list[str], cases_path: str) -> None:
    import jax
    import numpy as np

    from prism_jax import ops

    rng = np.random.default_rng(0)
    cases = []
    for name in shapes:
        n, k = SHAPES[name]
        w = jax.device_put(rng.integers(-127, 128, (n, k), dtype=np.int8))
        s_w = jax.device_put(rng.random(n, dtype=np.float32))
        for m in ms:
            x = jax.device_put(rng.integers(-127, 128, (m, k), dtype=np.int8))
            s_x = jax.device_put(rng.random(m, dtype=np.float32))
            for kernel in kernels:
                os.environ.pop("PRISM_INT8_GEMM_KERNEL", None)
                if kernel != "dispatch":
                    os.environ["PRISM_INT8_GEMM_KERNEL"] = kernel
                # A fresh jit per case: the workspace is sized at trace time for the kernel.
                fn = jax.jit(lambda a, b, c, d: ops.int8_gemm(a, b, c, d))
                for _ in range(CALLS_PER_CASE):
                    jax.block_until_ready(fn(x, s_x, w, s_w))
                cases.append({"shape": name, "m": m, "n": n, "k": k, "kernel": kernel})
    os.environ.pop("PRISM_INT8_GEMM_KERNEL", None)
    pathlib.Path(cases_path).write_text(json.dumps(cases, indent=1) + "\n")


# ncu's raw page scales each metric to a readable unit, given in the row under the header.
UNITS = {"nsecond": 1.0, "ns": 1.0, "usecond": 1e3, "us": 1e3, "msecond": 1e6, "ms": 1e6,
         "byte": 1.0, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "": 1.0}  # fmt: skip


def ncu_rows(path: str) -> list[dict]:
    """ncu --page raw --csv rows, one per profiled launch, each metric scaled to ns or bytes
    by the units row."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]
    header, units, *launches = list(csv.reader(lines))
    scale = dict(zip(header, units, strict=True))
    rows = []
    for values in launches:
        row = dict(zip(header, values, strict=True))
        for name in ("gpu__time_duration.sum", "dram__bytes_read.sum"):
            unit = scale.get(name, "")
            assert unit in UNITS, f"{name} in unknown unit {unit!r}: add it to UNITS"
            row[name] = metric(row, name) * UNITS[unit]
        rows.append(row)
    return [r for r in rows if r["ID"].isdigit()]


def metric(row: dict, name: str) -> float:
    value = row.get(name, "").replace(",", "")
    return float(value) if value not in ("", "n/a") else float("nan")


def ran(kernel_name: str) -> str:
    """A short name for the kernel that ran: CUTLASS's are all cutlass::device_kernel<...>."""
    head = kernel_name.split("<")[0].split("(")[0]
    cutlass = "cutlass" in head or "device_kernel" in head  # ncu demangles without namespaces
    return "cutlass" if cutlass else head.split("::")[-1].replace("void ", "")


def report(raw_csv: str, cases_json: str) -> str:
    cases = json.loads(pathlib.Path(cases_json).read_text())
    rows = ncu_rows(raw_csv)
    assert len(rows) == CALLS_PER_CASE * len(cases), (
        f"{len(rows)} profiled launches for {len(cases)} cases x {CALLS_PER_CASE} calls: "
        "profile only the GEMM kernels (gemm_ncu.sh's -k filter) and every launch"
    )
    out = [
        "| shape | M | kernel | ran | µs | weight TB/s | DRAM read TB/s | grid |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for i, case in enumerate(cases):
        row = rows[CALLS_PER_CASE * i + CALLS_PER_CASE - 1]
        ns, read = row["gpu__time_duration.sum"], row["dram__bytes_read.sum"]
        tbs = case["n"] * case["k"] / ns / 1e3
        out.append(
            f"| {case['shape']} | {case['m']} | {case['kernel']} | {ran(row['Kernel Name'])} | "
            f"{ns / 1e3:.1f} | {tbs:.2f} | {read / ns / 1e3:.2f} | "
            f"{row.get('launch__grid_size', '')} |"
        )
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--ms", default="64,128")
    r.add_argument("--kernels", default="dispatch")
    r.add_argument("--shapes", default=",".join(SHAPES))
    r.add_argument("--cases", default="gemm_ncu_cases.json")
    rep = sub.add_parser("report")
    rep.add_argument("raw_csv")
    rep.add_argument("cases_json")
    args = p.parse_args(argv)
    if args.cmd == "run":
        run_cases(
            [int(m) for m in args.ms.split(",")],
            args.kernels.split(","),
            args.shapes.split(","),
            args.cases,
        )
    else:
        sys.stdout.write(report(args.raw_csv, args.cases_json))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
