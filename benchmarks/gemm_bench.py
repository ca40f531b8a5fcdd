"""prism int8_gemm on the GPU against XLA's int8 dot, XLA's bf16 dot and cuBLASLt (torch._int_mm)
on the Gemma-3-27B projection shapes, measured in the same run.

    python3 benchmarks/gemm_bench.py --out DIR [--runs 10] [--sweep] [--ms 1,16,64]

Shapes: qkv N=8192 K=5376, o N=5376 K=4096, gate_up N=43008 K=5376, down N=5376 K=21504, for
M in {1, 16, 64, 256, 416, 1024, 4096}. Each timed run is one jitted call that applies the op R
times, call i to its own x_i and w_i (so XLA can neither merge nor deduplicate calls and no
weight is re-read from the 60 MB L2), timed on the host around block_until_ready; per-op time =
run time / R, R in [8, 100] sized for about 2 ms of device time per run. Median and min-max
over --runs timed runs after 2 warm-up calls. torch._int_mm (cuBLASLt) is timed the same way,
R calls captured in one CUDA graph (torch._int_mm needs M > 16). prism output is float32 (what
Int8Linear asks for); XLA int8 dot gives int32, XLA bf16 dot bf16.

--sweep also times every kernel of prism's dispatch that applies to the shape, forced with
PRISM_INT8_GEMM_KERNEL (each forced variant is a fresh executable); --kernels names the forced
variants instead, each optionally with a tile order for the persistent schedulers, NAME@<m|n>S
(raster along M or N, swizzle S: PRISM_INT8_GEMM_RASTER / PRISM_INT8_GEMM_SWIZZLE), and for the
stream-K tiles a decomposition, NAME+s (stream-K), +d (data-parallel) or +k<splits> (split-K):
PRISM_INT8_GEMM_DECOMP, e.g. sm90_streamk_128x128x128_c2x1@m4+s. The XLA int8
dot's line says which kernel XLA compiled it to (xla_kernel). --device-time adds each jax
implementation's kernel time per op (device_us): every GPU kernel of 3 more runs, traced with
jax.profiler, summed and divided by 3 R. It leaves out host dispatch and launch gaps, which the
host timing includes, as Nsight Compute and the e2e breakdown do. Writes gemm.jsonl (one JSON
line per measurement) and gemm.md (tables) under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from bench_common import jsonl_emitter  # noqa: E402
from gemm_report import markdown  # noqa: E402
from op_timing import (  # noqa: E402
    copy_bandwidth,
    device_time,
    repeated,
    reps_for,
    stats,
    time_jax,
)

from prism_jax import ops  # noqa: E402

SHAPES = {"qkv": (8192, 5376), "o": (5376, 4096), "gate_up": (43008, 5376), "down": (5376, 21504)}
SMOKE = {"tiny": (264, 512)}  # for a quick check of this script (--platform cpu --shapes tiny)
MS = (1, 16, 64, 256, 416, 1024, 4096)
L2_BYTES = 60 << 20
DECODE = ("decode16", "decode32", "decode64")
# The decode kernel with a cluster of 2-8 blocks splitting each slab's K.
DECODE_SPLIT = tuple(f"decode{rows}k{split}" for rows in (16, 32) for split in (2, 4, 8))
SM90 = (
    "sm90_coop_128x256x128_c2x1",
    "sm90_ping_64x256x128_c2x1",
    "sm90_coop_128x128x128_c2x1",
    "sm90_swap_ping_128x64x128_c2x1",
    "sm90_coop_128x192x128_c2x1",
    "sm90_swap_ping_64x32x128_c2x1",
    "sm90_swap_ping_64x64x128_c2x1",
)
STREAMK = (
    "sm90_streamk_128x128x128_c2x1",
    "sm90_streamk_128x256x128_c2x1",
)


def variants_for(m: int) -> list[str]:
    """The kernels worth forcing at this M (the others are far off or unsupported)."""
    if m <= 16:
        return [*DECODE, *DECODE_SPLIT]
    if m <= 64:
        return [
            "decode32",
            *DECODE_SPLIT,
            SM90[3],
            SM90[5],
            SM90[6],
        ]
    if m <= 256:
        return [SM90[3], SM90[2], SM90[1], SM90[0], *STREAMK]
    return [SM90[0], SM90[1], SM90[2], SM90[4], *STREAMK, SM90[4] + "@m4"]


def forced_env(variant: str) -> dict[str, str]:
    """The environment that forces `variant`: NAME, then optionally @<m|n><swizzle> (a tile
    order) and +<s|d|k<splits>> (a stream-K tile's decomposition)."""
    variant, _, decomp = variant.partition("+")
    name, _, order = variant.partition("@")
    env = {"PRISM_INT8_GEMM_KERNEL": name}
    if decomp:
        assert decomp in ("s", "d") or (decomp[0] == "k" and decomp[1:].isdigit()), (
            f"{variant}+{decomp}: the decomposition is +s, +d or +k<splits>, e.g. +k3"
        )
        env["PRISM_INT8_GEMM_DECOMP"] = decomp
    if order:
        assert order[0] in "mn" and order[1:].isdigit(), (
            f"{variant!r}: the tile order is @m<swizzle> or @n<swizzle>, e.g. @m4"
        )
        env |= {"PRISM_INT8_GEMM_RASTER": order[0], "PRISM_INT8_GEMM_SWIZZLE": order[1:]}
    return env


FORCING = (
    "PRISM_INT8_GEMM_KERNEL",
    "PRISM_INT8_GEMM_RASTER",
    "PRISM_INT8_GEMM_SWIZZLE",
    "PRISM_INT8_GEMM_DECOMP",
)


def xla_kernel(fn, args) -> str:
    """What XLA compiled the first dot of fn(*args) to: a custom call's target (cuBLAS /
    cuBLASLt) or a fusion's kind (a Triton GEMM), with its backend config (tile sizes)."""
    hlo = fn.lower(*args).compile().as_text()
    for line in hlo.splitlines():
        if "custom_call_target=" in line and ("cublas" in line or "gemm" in line):
            target = line.split("custom_call_target=")[1].split(",")[0]
            return target + " " + _config(line)
        if "kind=kCustom" in line and "fusion" in line and "gemm" in line:
            return "triton " + _config(line)
    return "unknown"


def _config(line: str) -> str:
    cfg = line.split("backend_config=", 1)[1] if "backend_config=" in line else ""
    return cfg[:600]


def estimate(m, n, k) -> float:
    """A rough time per op (to size R): the larger of 1.2 POP/s and 3.5 TB/s."""
    return max(2 * m * n * k / 1.2e15, (n * k + m * k) / 3.5e12)


class Pool:
    """Random arrays made on the device on first use, index i always the same array."""

    def __init__(self, make):
        self.make, self.items = make, []

    def take(self, count: int) -> list:
        while len(self.items) < count:
            self.items.append(self.make(len(self.items)))
        return self.items[:count]


def int8_random(key, shape):
    return jax.random.randint(key, shape, -127, 128, jnp.int32).astype(jnp.int8)


def scales_random(key, n):
    return jax.random.uniform(key, (n,), jnp.float32, 1e-3, 1e-2)


def make_record(emit, base, reps, runs, device):
    """record(impl, fn, fn_args): times fn (reps calls a run) and emits its row on `base`."""
    m, n, k = base["M"], base["N"], base["K"]

    def record(impl, fn, fn_args):
        s = stats(time_jax(fn, fn_args, reps, runs))
        t = s["median_us"] * 1e-6
        row = {**base, "impl": impl, **s, "tops": 2 * m * n * k / t / 1e12}
        row["weight_tbps"] = n * k / t / 1e12
        td = device_time(fn, fn_args, reps) if device else None
        if td is not None:
            row |= {
                "device_us": td * 1e6,
                "device_tops": 2 * m * n * k / td / 1e12,
                "device_weight_tbps": n * k / td / 1e12,
            }
        emit(row)

    return record


def bench_prism(record, args, reps, forced):
    """The dispatch's own choice, then each forced kernel variant, on the same inputs."""

    def gemm(x, sx, w, sw):
        return ops.int8_gemm(x, sx, w, sw, out_dtype=jnp.float32)

    for var in FORCING:
        os.environ.pop(var, None)
    record("prism", repeated(gemm, reps, "auto"), args)
    for v in forced:
        os.environ.update(forced_env(v))
        try:
            record("prism:" + v, repeated(gemm, reps, v), args)
        finally:
            for var in FORCING:
                os.environ.pop(var, None)


def bench_xla(record, base, xs, w8, w16, reps):
    """XLA's int8 dot (naming the kernel it compiled to) and its bf16 dot."""

    def dot_i8(x, w):
        return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.int32)

    def dot_bf16(x, w):
        return jax.lax.dot_general(x, w, (((1,), (1,)), ((), ())))

    i8 = repeated(dot_i8, reps, "i8")
    base["xla_kernel"] = xla_kernel(i8, (xs, w8))
    record("xla_int8", i8, (xs, w8))
    del base["xla_kernel"]
    xs_bf16 = [x.astype(jnp.bfloat16) for x in xs]
    record("xla_bf16", repeated(dot_bf16, reps, "bf16"), (xs_bf16, w16))


def bench_shape(name, n, k, ms, runs, sweep, emit, key, kernels=None, device=False):
    wkey, xkey = jax.random.split(key)
    ws = Pool(lambda i: int8_random(jax.random.fold_in(wkey, i), (n, k)))
    s_w = Pool(lambda i: scales_random(jax.random.fold_in(wkey, 1_000_000 + i), n))
    ws_bf16 = Pool(lambda i: ws.take(i + 1)[i].astype(jnp.bfloat16))
    for m in ms:
        reps = reps_for(estimate(m, n, k))
        mk = jax.random.fold_in(xkey, m)
        xs = [int8_random(jax.random.fold_in(mk, i), (m, k)) for i in range(reps)]
        s_x = [scales_random(jax.random.fold_in(mk, 1_000_000 + i), m) for i in range(reps)]
        base = {"shape": name, "M": m, "N": n, "K": k, "reps": reps}
        record = make_record(emit, base, reps, runs, device)
        forced = (kernels or variants_for(m)) if m in sweep else []
        bench_prism(record, (xs, s_x, ws.take(reps), s_w.take(reps)), reps, forced)
        bench_xla(record, base, xs, ws.take(reps), ws_bf16.take(reps), reps)
        del xs


def bench_torch(shapes, ms, runs, emit):
    """torch._int_mm (cuBLASLt int8 -> int32), R calls in one CUDA graph, timed with events."""
    try:
        import torch  # noqa: PLC0415 (optional)
    except ImportError as e:
        emit({"impl": "cublaslt", "skipped": f"torch not importable: {e}"})
        return
    dev = torch.device("cuda")
    for name, (n, k) in shapes.items():
        ws = []
        for m in ms:
            base = {"shape": name, "M": m, "N": n, "K": k, "impl": "cublaslt"}
            if m <= 16:  # torch._int_mm requires M > 16
                emit({**base, "skipped": "torch._int_mm needs M > 16"})
                continue
            reps = reps_for(estimate(m, n, k))
            while len(ws) < reps:
                ws.append(torch.randint(-127, 128, (n, k), dtype=torch.int8, device=dev))
            xs = [
                torch.randint(-127, 128, (m, k), dtype=torch.int8, device=dev) for _ in range(reps)
            ]
            per_op = _time_int_mm(torch, xs, ws[:reps], runs)
            s = stats(per_op)
            t = s["median_us"] * 1e-6
            emit(
                {
                    **base,
                    "reps": reps,
                    **s,
                    "tops": 2 * m * n * k / t / 1e12,
                    "weight_tbps": n * k / t / 1e12,
                    "timing": "cuda graph + events",
                }
            )
            del xs
        del ws
        torch.cuda.empty_cache()


def _time_int_mm(torch, xs, ws, runs) -> list[float]:
    reps = len(xs)
    for x, w in zip(xs, ws, strict=True):
        torch._int_mm(x, w.t())  # warm-up, cuBLASLt heuristics
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = [torch._int_mm(x, w.t()) for x, w in zip(xs, ws, strict=True)]
    graph.replay()
    graph.replay()
    per_op = []
    for _ in range(runs):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        per_op.append(a.elapsed_time(b) * 1e-3 / reps)
    del graph, outs
    return per_op


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/gemm_h200")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--sweep", action="store_true", help="also time every forced kernel")
    parser.add_argument("--sweep-ms", default="", help="with --sweep: only at these M")
    parser.add_argument(
        "--kernels", default="", help="with --sweep: these forced variants (NAME or NAME@m4)"
    )
    parser.add_argument(
        "--device-time", action="store_true", help="also each op's kernel time from a trace"
    )
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--ms", default=",".join(map(str, MS)))
    parser.add_argument("--no-torch", action="store_true")
    parser.add_argument("--platform", default="gpu", help="cpu: a smoke test of this script")
    parser.add_argument("--render", help="only write gemm.md (to --out) from this gemm.jsonl")
    parser.add_argument("--render-command", help="with --render: the command that made it")
    parser.add_argument(
        "--graphs",
        action="store_true",
        help="XLA command buffers for every custom call and cuBLAS call, even single ones "
        "(without them each call costs ~20 µs of host dispatch, the floor seen at small M)",
    )
    return parser.parse_args()


def enable_graphs() -> None:
    """--graphs: read when the backend starts, so before the first device use."""
    os.environ["XLA_FLAGS"] = " ".join(
        [
            os.environ.get("XLA_FLAGS", ""),
            "--xla_gpu_enable_command_buffer=FUSION,CUBLAS,CUBLASLT,CUSTOM_CALL",
            "--xla_gpu_graph_min_graph_size=1",
        ]
    ).strip()


def run_meta(gpu) -> dict:
    """The run's first JSON line: card, jax, commit, date and XLA flags."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        commit = ""
    return {
        "device": gpu.device_kind,
        "jax": jax.__version__,
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def run(args: argparse.Namespace, out: pathlib.Path) -> list[dict]:
    """Every measurement, each emitted to out/gemm.jsonl as it lands; the rows."""
    shapes = {s: {**SHAPES, **SMOKE}[s] for s in args.shapes.split(",")}
    ms = [int(v) for v in args.ms.split(",")]
    gpu = jax.devices(args.platform)[0]
    meta = run_meta(gpu)
    rows = []
    with open(out / "gemm.jsonl", "w") as sink:
        emit = jsonl_emitter(sink, meta["device"], rows)
        emit({"meta": meta})
        with jax.default_device(gpu):
            size = 1 << 30 if args.platform == "gpu" else 1 << 20
            copy_bandwidth(emit, args.runs, size, args.device_time)
            key = jax.random.key(0)
            sweep = set(map(int, args.sweep_ms.split(","))) if args.sweep_ms else set(ms)
            sweep = sweep if args.sweep else set()
            kernels = [v for v in args.kernels.split(",") if v]
            for name, (n, k) in shapes.items():
                key_nk = jax.random.fold_in(key, n * k)
                bench_shape(
                    name, n, k, ms, args.runs, sweep, emit, key_nk, kernels, args.device_time
                )
        if not args.no_torch:
            bench_torch(shapes, ms, args.runs, emit)
    return rows


def main() -> int:
    args = parse_args()
    if args.render:
        rows = [json.loads(line) for line in open(args.render)]  # noqa: SIM115
        command = args.render_command or "python3 benchmarks/gemm_bench.py"
        pathlib.Path(args.out, "gemm.md").write_text(markdown(rows, command))
        return 0
    if args.graphs:
        enable_graphs()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = run(args, out)
    md = markdown(rows, "python3 benchmarks/gemm_bench.py " + " ".join(sys.argv[1:]))
    (out / "gemm.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
