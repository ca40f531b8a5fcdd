"""Bandwidth of the memory-bound custom calls on the GPU against copy bandwidth, same run.

    python3 benchmarks/ops_bandwidth.py --out DIR [--runs 10] [--ms 64,256,512,4096]
        [--dtypes f32,bf16] [--norm-kernels reg2,reg4,reg8,lean4,lean8]
        [--glu-caches off] [--head-kernels row,warp]

The ops as the 27B model calls them (D = 5376, F = 21504, gelu_tanh), in the activation dtype
of its INT8 path (f32; bf16 with --dtypes): rmsnorm_quant, add_rmsnorm_quant (residual add,
norm, quantisation; writes h), norm_add_rmsnorm_quant (the same with Gemma's post-norm of x
fused in front: the 27B's pre-norms), rmsnorm (float out), add_rmsnorm (float out and h),
quantize_digits (two digits of float rows), glu_quant_pair (one digit), glu_quant2_pair
and glu_quant2_sum (two digits: the latter reads the three partial products), at M tokens;
candidate_head (R rows x C = 16 candidates gathered from a 262,208 x 5376 bf16 embedding) and
vocab_logsumexp (the whole embedding once per call). --norm-kernels also times the RMSNorm
kernels forced with PRISM_RMSNORM_KERNEL, and --glu-caches the gated activation with
PRISM_GLU_CACHE (same bits, each a fresh executable), at the smallest and largest M (or at
--forced-ms);
--head-kernels candidate_head's kernels forced with PRISM_CANDIDATE_HEAD_KERNEL.

Bytes = every input read once plus every output written once. Each timed run is one jitted call
applying the op R times, call i to its own inputs (XLA can neither merge nor deduplicate calls,
and inputs are not re-read from L2), R sized for ~2 ms of device time; per-op time = run / R,
median and min-max over --runs. Copy: XLA's x_i + 1 over 1 GiB of float32 (4-byte elements: an
int8 x + 1 runs at a third of this, so it is no ceiling), bytes read + written. --device-time
adds every op's and the copy's kernel time (op_timing.device_time: the kernels of 3 traced
runs, no host dispatch or launch gaps) and its share of the copy's, both timed the same way.
Writes ops_bandwidth.jsonl under --out; `--render FILE` prints its table.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from op_timing import (  # noqa: E402
    copy_bandwidth,
    device_time,
    repeated,
    reps_for,
    stats,
    time_jax,
)

from prism_jax import ops  # noqa: E402

D, F, V, C = 5376, 21504, 262_208, 16
COPY_BYTES = 1 << 30
BIG_INPUTS = 24 << 30  # inputs of one timed run at most: fewer calls when they would exceed it
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}
DEVICE = {"time": False}  # --device-time, read by run_op


def run_op(name, fn, make_inputs, in_bytes, out_bytes, emit, runs, **meta):
    """make_inputs(i) -> the arrays of call i; fn(*arrays) -> outputs."""
    reps = reps_for((in_bytes + out_bytes) / 3.5e12)  # ~2 ms of device time per timed run
    reps = max(2, min(reps, BIG_INPUTS // max(in_bytes, 1)))
    calls = [make_inputs(i) for i in range(reps)]
    inputs = tuple(list(arg) for arg in zip(*calls, strict=True))  # argument-major, as repeated
    jitted = repeated(fn, reps, f"{name}:{meta.pop('tag', '')}")
    s = stats(time_jax(jitted, inputs, reps, runs))
    total = in_bytes + out_bytes
    row = {"op": name, **meta, "bytes": total, **s, "reps": reps,
           "tbps": total / (s["median_us"] * 1e-6) / 1e12}  # fmt: skip
    td = device_time(jitted, inputs, reps) if DEVICE["time"] else None
    if td is not None:
        row |= {"device_us": td * 1e6, "device_tbps": total / td / 1e12}
    emit(row)
    del calls, inputs


def force(var: str, setting: str) -> None:
    """Sets the kernel-forcing environment variable var to setting ("default": unset). The
    handlers read it at launch; each setting's calls are a fresh executable (run_op's tag)."""
    os.environ.pop(var, None)
    if setting != "default":
        os.environ[var] = setting


def norm_ops(m: int, dt, emit, runs, normal, kernels: list[str]) -> None:
    size = jnp.dtype(dt).itemsize
    gamma = jnp.ones((D,), jnp.float32)
    x_bytes, q_out = m * D * size, m * D + m * 4
    for kernel in ["default", *kernels]:
        force("PRISM_RMSNORM_KERNEL", kernel)
        meta = {"M": m, "D": D, "dtype": jnp.dtype(dt).name, "kernel": kernel}
        run_op("rmsnorm_quant", lambda x: ops.rmsnorm_quant(x, gamma, eps=1e-6),
               lambda i: (normal(i, (m, D), dt),), x_bytes + D * 4, q_out, emit, runs,
               tag=kernel, **meta)  # fmt: skip
        run_op("add_rmsnorm_quant",
               lambda x, r: ops.add_rmsnorm_quant(x, r, gamma, eps=1e-6, weight_offset=1.0),
               lambda i: (normal(i, (m, D), dt), normal(i + 1000, (m, D), dt)),
               2 * x_bytes + D * 4, x_bytes + q_out, emit, runs, tag=kernel, **meta)  # fmt: skip
        run_op("norm_add_rmsnorm_quant",  # Gemma's post-norm fused in front (the 27B's pre-norm)
               lambda x, r: ops.add_rmsnorm_quant(x, r, gamma, eps=1e-6, weight_offset=1.0,
                                                  x_gamma=gamma),
               lambda i: (normal(i, (m, D), dt), normal(i + 1000, (m, D), dt)),
               2 * x_bytes + 2 * D * 4, x_bytes + q_out, emit, runs, tag=kernel,
               **meta)  # fmt: skip
        if kernel == "default":
            run_op("rmsnorm", lambda x: ops.rmsnorm(x, gamma, eps=1e-6, weight_offset=1.0),
                   lambda i: (normal(i, (m, D), dt),), x_bytes + D * 4, x_bytes, emit, runs,
                   **meta)  # fmt: skip
            run_op("add_rmsnorm",
                   lambda x, r: ops.add_rmsnorm(x, r, gamma, eps=1e-6, weight_offset=1.0),
                   lambda i: (normal(i, (m, D), dt), normal(i + 1000, (m, D), dt)),
                   2 * x_bytes + D * 4, 2 * x_bytes, emit, runs, **meta)  # fmt: skip
            if dt == jnp.float32:  # the two-digit path's row quantisation (f32 rows only)
                run_op("quantize_digits", lambda y: ops.quantize_digits(y, digits=2),
                       lambda i: (normal(i, (m, D), dt),), x_bytes, 2 * q_out, emit, runs,
                       **meta)  # fmt: skip
    force("PRISM_RMSNORM_KERNEL", "default")


def glu_ops(m: int, dt, emit, runs, normal, caches: list[str]) -> None:
    for cache in ["default", *caches]:
        force("PRISM_GLU_CACHE", cache)
        glu_op_set(m, dt, emit, runs, normal, cache)
    force("PRISM_GLU_CACHE", "default")


def glu_op_set(m: int, dt, emit, runs, normal, cache: str) -> None:
    size = jnp.dtype(dt).itemsize
    meta = {"M": m, "F": F, "dtype": jnp.dtype(dt).name, "kernel": f"cache {cache}", "tag": cache}
    act = "gelu_tanh"
    run_op("glu_quant_pair", lambda gu: ops.glu_quant_pair(gu, activation=act),
           lambda i: (normal(i, (m, 2, F), dt),), m * 2 * F * size, m * F + m * 4, emit, runs,
           **meta)  # fmt: skip
    run_op("glu_quant2_pair", lambda gu: ops.glu_quant2_pair(gu, activation=act),
           lambda i: (normal(i, (m, 2, F), dt),), m * 2 * F * size, 2 * (m * F + m * 4), emit,
           runs, **meta)  # fmt: skip
    if dt == jnp.float32:  # the partial products are float32 only
        run_op("glu_quant2_sum", lambda y2, yw2: ops.glu_quant2_sum(y2, yw2, activation=act),
               lambda i: (normal(i, (2 * m, 2, F), dt), normal(i + 1000, (m, 2, F), dt)),
               3 * m * 2 * F * 4, 2 * (m * F + m * 4), emit, runs, **meta)  # fmt: skip


def head_ops(rows: list[int], emit, runs, normal, key, kernels: list[str]) -> None:
    emb = normal(0, (V, D), jnp.bfloat16)  # the INT8 model's output embedding is bf16
    for r in rows:
        counts = jnp.full((r,), C, jnp.int32)

        def inputs(i, r=r):  # fresh ids per call: the gathered rows must not stay in L2
            ids = jax.random.randint(jax.random.fold_in(key, i), (r, C), 0, V, jnp.int32)
            return normal(i, (r, D), jnp.float32), ids, emb  # emb an argument, not a constant

        for kernel in ["default", *kernels]:
            force("PRISM_CANDIDATE_HEAD_KERNEL", kernel)
            run_op("candidate_head", lambda h, ids, e, c=counts: ops.candidate_head(h, e, ids, c),
                   inputs, r * D * 4 + r * C * (D * 2 + 4), r * C * 8, emit, runs, tag=kernel,
                   R=r, C=C, V=V, D=D, kernel=kernel)  # fmt: skip
    force("PRISM_CANDIDATE_HEAD_KERNEL", "default")
    run_op("vocab_logsumexp", lambda h, e: ops.vocab_logsumexp(h, e),
           lambda i: (normal(i, (1, D), jnp.float32), emb), V * D * 2 + D * 4, 4, emit, runs,
           R=1, V=V, D=D)  # fmt: skip


def render(path: pathlib.Path) -> str:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    copy_row = next(r for r in rows if r["op"] == "xla_copy_f32")
    copy, kcopy = copy_row["tbps"], copy_row.get("device_tbps")
    head = f"Copy ceiling (XLA f32 x + 1, read + written): {copy:.2f} TB/s"
    cols = "| op | shape | dtype | kernel | µs median (min-max) | TB/s | % of copy |"
    if kcopy:
        head += f"; in kernel time {kcopy:.2f} TB/s"
        cols += " kernel µs | kernel TB/s | % of kernel-time copy |"
    out = [head + ".", "", cols, "|---" * cols.count(" | ") + "|---|"]
    for r in rows:
        if r["op"] == "xla_copy_f32":
            continue
        shape = f"M = {r['M']}" if "M" in r else f"R = {r['R']}"
        line = (
            f"| {r['op']} | {shape} | {r.get('dtype', '')} | {r.get('kernel', '')} | "
            f"{r['median_us']:.1f} ({r['min_us']:.1f}-{r['max_us']:.1f}) | {r['tbps']:.2f} | "
            f"{100 * r['tbps'] / copy:.0f} % |"
        )
        if kcopy and "device_us" in r:
            line += f" {r['device_us']:.1f} | {r['device_tbps']:.2f} | "
            line += f"{100 * r['device_tbps'] / kcopy:.0f} % |"
        out.append(line)
    return "\n".join(out) + "\n"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="benchmarks/results/ops")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument("--ms", default="64,256,512,4096")
    p.add_argument("--rows", default="64,416,2048", help="candidate_head rows R")
    p.add_argument("--dtypes", default="f32")
    p.add_argument("--norm-kernels", default="", help="forced RMSNorm kernels, comma-separated")
    p.add_argument("--forced-ms", default="", help="M of the forced kernels (default: min, max)")
    p.add_argument("--glu-caches", default="", help="forced PRISM_GLU_CACHE settings (on, off)")
    p.add_argument("--head-kernels", default="", help="forced candidate_head kernels (row, warp)")
    p.add_argument("--render", help="print the table of an ops_bandwidth.jsonl and exit")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU (script check)")
    p.add_argument("--device-time", action="store_true", help="also kernel times from a trace")
    return p.parse_args()


def run_ops(args: argparse.Namespace, gpu, emit) -> None:
    """The copy ceiling, then the norms and gated activations per dtype and M, then the head."""
    key = jax.random.key(1)

    def normal(i, shape, dtype):
        k = jax.random.fold_in(key, hash((i, shape)) % 2**31)
        return jax.random.normal(k, shape, jnp.float32).astype(dtype)

    ms = [int(m) for m in args.ms.split(",")]
    kernels = [k for k in args.norm_kernels.split(",") if k]
    caches = [c for c in args.glu_caches.split(",") if c]
    forced_ms = [int(m) for m in args.forced_ms.split(",") if m] or [min(ms), max(ms)]
    with jax.default_device(gpu):
        # gemm_bench's float32 x + 1, each call its own input; named here as the table reads it.
        copy_emit = lambda row: emit({"op": "xla_copy_f32", **row})  # noqa: E731
        copy_bandwidth(copy_emit, args.runs, COPY_BYTES, args.device_time)
        for name in args.dtypes.split(","):
            for m in ms:
                forced = kernels if m in forced_ms else []
                norm_ops(m, DTYPES[name], emit, args.runs, normal, forced)
                glu_ops(m, DTYPES[name], emit, args.runs, normal, caches if forced else [])
        head_kernels = [k for k in args.head_kernels.split(",") if k]
        head_ops([int(r) for r in args.rows.split(",")], emit, args.runs, normal, key, head_kernels)


def main() -> int:
    args = parse_args()
    DEVICE["time"] = args.device_time
    if args.smoke:
        global D, F, V, COPY_BYTES
        D, F, V, COPY_BYTES = 512, 1024, 4096, 1 << 20
    if args.render:
        sys.stdout.write(render(pathlib.Path(args.render)))
        return 0
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "ops_bandwidth.jsonl"
    gpu = jax.devices("cpu" if args.smoke else "gpu")[0]
    with open(path, "w") as sink:

        def emit(row):
            row = {**row, "device": gpu.device_kind}
            print(json.dumps(row), flush=True)
            sink.write(json.dumps(row) + "\n")
            sink.flush()

        run_ops(args, gpu, emit)
    (out / "ops_bandwidth.md").write_text(render(path))
    sys.stdout.write(render(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
