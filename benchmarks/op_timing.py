"""Timing of jitted GPU ops for the kernel benchmarks (gemm_bench, ops_bandwidth,
attention_bench): R applications of an op per timed run, each on its own inputs, timed on the
host around block_until_ready (time_jax) or as the summed kernel time of traced runs
(device_time), and the copy that gives their bandwidth ceiling (copy_bandwidth). benchmarks/ is
sys.path[0] when a script runs, so scripts import this as `op_timing`."""

from __future__ import annotations

import math
import pathlib
import statistics
import tempfile
import time

import jax
import jax.numpy as jnp

TARGET_RUN_S = 2e-3  # device time of one timed run
MAX_REPS = 100


def stats(per_op_s: list[float]) -> dict:
    return {
        "median_us": statistics.median(per_op_s) * 1e6,
        "min_us": min(per_op_s) * 1e6,
        "max_us": max(per_op_s) * 1e6,
        "runs": len(per_op_s),
    }


def time_jax(fn, args, reps: int, runs: int) -> list[float]:
    jax.block_until_ready(fn(*args))  # compile + warm-up
    jax.block_until_ready(fn(*args))
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        out.append((time.perf_counter() - t0) / reps)
    return out


DEVICE_RUNS = 3  # traced runs behind a device time


def device_time(fn, args, reps: int, kernel_times=None) -> float | None:
    """Kernel seconds per op: every GPU kernel of DEVICE_RUNS traced calls of fn (R ops each),
    summed (trace_breakdown.kernel_times). None without a GPU in the trace: on the CPU the custom
    calls run inline on the calling thread, with no kernel events to sum."""
    if kernel_times is None:
        from trace_breakdown import kernel_times  # noqa: PLC0415 (benchmarks/ is on sys.path)

    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as d:
        with jax.profiler.trace(d):
            for _ in range(DEVICE_RUNS):
                jax.block_until_ready(fn(*args))
        total, _, source = kernel_times(pathlib.Path(d))
    if source != "gpu":
        return None
    return sum(total.values()) * 1e-9 / (DEVICE_RUNS * reps)


def repeated(op, reps: int, tag: str):
    """jit of R applications of op, call i on inputs i: no two calls share an operand, so XLA can
    neither merge nor deduplicate them and no weight is reused from L2. `tag` makes the HLO (and so
    the executable and any command buffer recorded for it) distinct per forced kernel."""

    def run(*lists):
        outs = [op(*[arg[i] for arg in lists]) for i in range(reps)]
        return outs, jnp.asarray(sum(map(ord, tag)), jnp.int32)

    return jax.jit(run)


def reps_for(seconds_per_op: float) -> int:
    """Calls per timed run: enough for TARGET_RUN_S of device time, at least 8, at most 100."""
    return int(min(max(8, math.ceil(TARGET_RUN_S / max(seconds_per_op, 1e-7))), MAX_REPS))


def copy_bandwidth(emit, runs, size=1 << 30, device=False):
    """XLA elementwise x_i + 1 over `size` bytes of float32, each call its own x_i (with one
    shared input, XLA fuses the calls into one multi-output kernel that reads x once): read +
    written bytes. Float32, not int8: XLA's int8 elementwise kernels reach ~1.5 TB/s on the H200
    (one byte per thread), well under the ~3.6 TB/s of 4-byte elements, so they are no ceiling.
    device: also its kernel time (device_time), the ceiling for ops timed the same way."""
    reps = 4
    xs = [jnp.full((size // 4,), i + 3, jnp.float32) for i in range(reps)]
    fn = jax.jit(lambda *a: [x + 1.0 for x in a])
    per_op = time_jax(fn, tuple(xs), reps, runs)
    s = stats(per_op)
    row = {"impl": "xla_copy", "bytes": 2 * size, **s}
    row["tbps"] = 2 * size / (s["median_us"] * 1e-6) / 1e12
    td = device_time(fn, tuple(xs), reps) if device else None
    if td is not None:
        row |= {"device_us": td * 1e6, "device_tbps": 2 * size / td / 1e12}
    emit(row)
