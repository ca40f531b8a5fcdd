"""Is the host slow after a forward, and which of its threads are busy then? (The readout after
a 62-layer forward takes 1.1-1.8 ms of host time against 0.26 ms on an idle host, and even
packing its numpy arrays takes 4x longer: results/e2e_h200_session12/probes/.)

    python3 benchmarks/host_after_forward.py [--preset gemma3-27b] [--runs 20] [--single-digit]

Per round of --runs, each after a one-question forward (the engine's step, block_until_ready)
unless said: right after it; the same read again at once; after an idle pause of --idle-ms
with no forward; --idle-ms after a forward; after a forward and a tiny jit call copied back.
Each time:
  py_loop   a fixed pure-Python loop (bytecode under the GIL)
  np_copy   copying 8 MB with numpy (C, the GIL released)
  read      runner.read of the step's hidden (pack, readout call, copies back)
and, from the forward call (or the idle pause) to the end of those three, the CPU time of every
thread of the process (/proc/self/task/*/schedstat, ns), summed by thread name.
A pure-Python loop that slows down while numpy does not points at the GIL (another thread
holds it); both slowing down points at the core (frequency, caches); busy threads name who.
Prints one JSON line per condition: medians in ms, and the busiest thread names' median CPU ms
in the window. On the CPU it runs as a smoke test (--preset tiny).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import time

import jax
import numpy as np
from dispatch_probe import one_question_arrays, probe_engine  # benchmarks/ is sys.path[0]
from e2e_decide import add_engine_options
from e2e_scenarios import PRESETS, scenarios

from prism_jax.scheduler import release

LOOP = 20_000
COPY_BYTES = 8 << 20
TOP_THREADS = 8


def thread_cpu_ns() -> dict[int, tuple[str, int]]:
    """Per thread of this process: (name, ns it has run on a CPU)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        out[int(tid)] = (name, ns)
    return out


def busy_by_name(before: dict, after: dict) -> dict[str, float]:
    """CPU ms each thread name ran between two snapshots (threads alive in both)."""
    busy: dict[str, float] = collections.defaultdict(float)
    for tid, (name, ns) in after.items():
        if tid in before:
            busy[name] += (ns - before[tid][1]) / 1e6
    return busy


def py_loop() -> int:
    total = 0
    for i in range(LOOP):
        total += i & 7
    return total


def measure(read, src: np.ndarray, dst: np.ndarray, before: dict) -> tuple[dict[str, float], dict]:
    """The three timings (s), and the per-name thread CPU from the snapshot `before` (taken
    before the forward call, or before the idle pause) to their end."""
    t = [time.perf_counter()]
    py_loop()
    t.append(time.perf_counter())
    np.copyto(dst, src)
    t.append(time.perf_counter())
    read()
    t.append(time.perf_counter())
    busy = busy_by_name(before, thread_cpu_ns())
    times = dict(zip(("py_loop", "np_copy", "read"), np.diff(t), strict=True))
    return times, busy


def summary(condition: str, rows: list[tuple[dict, dict]]) -> dict:
    out = {"condition": condition, "runs": len(rows)}
    out |= {f"{k}_ms": 1e3 * statistics.median(r[0][k] for r in rows) for k in rows[0][0]}
    names = {n for _, busy in rows for n in busy}
    cpu = {n: statistics.median(busy.get(n, 0.0) for _, busy in rows) for n in names}
    top = sorted(cpu.items(), key=lambda kv: -kv[1])[:TOP_THREADS]
    return out | {"thread_cpu_ms": {n: round(ms, 3) for n, ms in top}}


def run(runner, arrays, runs: int, idle_s: float) -> list[dict]:
    src = np.ones(COPY_BYTES // 4, np.float32)
    dst = np.empty_like(src)
    hidden = jax.block_until_ready(runner.forward(arrays))
    runner.read(hidden, arrays)  # warm-up
    tiny = jax.jit(lambda: jax.numpy.arange(8.0))  # an unrelated 32-byte result
    jax.device_get(tiny())
    rows = collections.defaultdict(list)
    for _ in range(runs):
        before = thread_cpu_ns()
        hidden = jax.block_until_ready(runner.forward(arrays))
        rows["after_forward"].append(
            measure(lambda h=hidden: runner.read(h, arrays), src, dst, before)
        )
        before = thread_cpu_ns()  # the same read again at once: warm host and GPU
        rows["read_again"].append(
            measure(lambda h=hidden: runner.read(h, arrays), src, dst, before)
        )
        before = thread_cpu_ns()
        time.sleep(idle_s)
        rows[f"idle_{1e3 * idle_s:g}ms_after_read"].append(
            measure(lambda h=hidden: runner.read(h, arrays), src, dst, before)
        )
        before = thread_cpu_ns()
        hidden = jax.block_until_ready(runner.forward(arrays))
        time.sleep(idle_s)
        rows[f"{1e3 * idle_s:g}ms_after_forward"].append(
            measure(lambda h=hidden: runner.read(h, arrays), src, dst, before)
        )
        before = thread_cpu_ns()  # a tiny call and copy back first, then the read
        hidden = jax.block_until_ready(runner.forward(arrays))
        jax.device_get(tiny())
        rows["after_forward_and_tiny_get"].append(
            measure(lambda h=hidden: runner.read(h, arrays), src, dst, before)
        )
    return [summary(name, r) for name, r in rows.items()]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gemma3-27b")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--idle-ms", type=float, default=50.0)
    p.add_argument("--single-digit", action="store_true")
    add_engine_options(p)
    args = p.parse_args(argv)
    assert args.runs >= 1, "--runs must be at least 1"
    engine, config = probe_engine(args)
    scenario = next(s for s in scenarios(config.vocab_size) if s.name == "one_question")
    arrays, placements = one_question_arrays(engine, scenario)
    for line in run(engine.runner, arrays, args.runs, args.idle_ms / 1e3):
        print(json.dumps(line | {"device": jax.devices()[0].device_kind}), flush=True)
    release(placements, engine.cache, True)


if __name__ == "__main__":
    main()
