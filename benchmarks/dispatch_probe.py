"""Host dispatch cost of one engine step on the GPU, untraced: how long the host spends before
the GPU can start (the step's lead), split into what the weights' argument count costs and what
launching the forward's thunks costs.

    python3 benchmarks/dispatch_probe.py [--preset gemma3-27b] [--runs 20] [--single-digit]

Prints one JSON line per probe, medians over --runs calls after warm-up, in ms:
  null_one_arg       jit(x + 1) on the step's packed int32 buffer: the floor of one call
  null_all_weights   the same with every weight leaf passed too (what the forward receives)
  null_weights_kv    the same with the KV pool donated and returned too, as the forward does
  forward            the engine's one-question forward: `return_ms` until the call returns to
                     Python (its thunks launched), `done_ms` until its result is ready; each
                     result is dropped before the next call, as the engine drops its hidden
  forward_held       the same, each result kept until the next call has returned
  readout_split      runner.read of that forward's hidden in parts: pack, the readout call
                     returning, its result ready, the device-to-host copy, the whole read
  readout_after_forward  runner.read of each forward's fresh hidden: right after it is
                     ready, after a sleep, in parts, and forward + read in the engine's order
  engine_runs        (--engine-runs) whole engine.run calls of the e2e scenarios as e2e_decide.py
                     times them: per run its wall ms and the device addresses of the forward's
                     hidden and KV pool, to see which buffer moves between runs when XLA
                     re-records the graph
`slow_calls` counts the timed calls that took JAX's Python dispatch path instead of its C++
fast path (SlowPathCounter): each passes every argument through Python.
XLA re-records the forward's CUDA graph (command buffer) whenever a buffer it uses has moved;
the allocator gives a dropped hidden's block to the next call, a held one it cannot, so
forward_held - forward is what a moving buffer costs a step (runner.py). To see the re-records:
TF_CPP_MIN_LOG_LEVEL=0 TF_CPP_VMODULE=command_buffer_thunk=3 ("Updated command buffer in").
The difference between the two null calls is the per-argument cost of ~900 weight buffers; a
forward whose return_ms is close to done_ms launches at the GPU's pace (host-bound launching).
Needs a GPU for meaningful numbers; on the CPU it runs as a smoke test (--preset tiny).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time
from types import SimpleNamespace

import jax
from e2e_decide import add_engine_options, build  # benchmarks/ is sys.path[0] as a script
from e2e_scenarios import PRESETS, scenarios
from jax._src import stages

from prism_jax.forest import build_forest
from prism_jax.scheduler import place, plan_steps, release, step_arrays
from prism_jax.step_buffers import forward_layout, pack, readout_layout


class SlowPathCounter:
    """Counts calls that take JAX's Python dispatch path (stages.Compiled.call, a private
    function): a compiled executable's C++ fast path runs without it, so after the first call
    of each executable the count should stay 0. Every slow call passes the ~1,000 arguments
    through Python's shard_args, milliseconds of host time on the 27B forward."""

    def __init__(self) -> None:
        self.count = 0
        self._original = stages.Compiled.call

    def __enter__(self) -> SlowPathCounter:
        original = self._original

        def counted(*args, **kwargs):
            self.count += 1
            return original(*args, **kwargs)

        stages.Compiled.call = staticmethod(counted)
        return self

    def __exit__(self, *exc) -> None:
        stages.Compiled.call = staticmethod(self._original)


def timed_call(fn, runs: int, hold: bool = True) -> tuple[float, float]:
    """Median ms until fn() returns and until its result is ready (fn is warmed up first).
    hold: keep each result alive until the next call has returned (else drop it first)."""
    out = jax.block_until_ready(fn())
    returned, done = [], []
    for _ in range(runs):
        if not hold:
            out = None
        t0 = time.perf_counter()
        out = fn()
        t1 = time.perf_counter()
        jax.block_until_ready(out)
        t2 = time.perf_counter()
        returned.append(t1 - t0)
        done.append(t2 - t0)
    return 1e3 * statistics.median(returned), 1e3 * statistics.median(done)


def one_question_arrays(engine, scenario):
    forest = build_forest(scenario.questions, engine.root_len)
    placements = place(forest, engine.cache)
    (plan,) = plan_steps(forest, placements, 2048)
    arrays = step_arrays(forest, placements, plan, engine.engine_config, engine.pool.num_pages)
    return arrays, placements


def probe_engine(args) -> tuple:
    """(engine, config) for a probe's arguments (--preset, --single-digit, --layers if it has
    one, add_engine_options'): random weights, no baseline, the probes' token buckets."""
    config = PRESETS[args.preset]
    if args.single_digit:
        config = config.replace(int8_two_digit_rows=(), int8_two_digit_weights=())
    if getattr(args, "layers", None):
        config = config.replace(num_layers=args.layers)
    setup = SimpleNamespace(seed=0, kv_pages=320, token_buckets=(32, 64, 256, 512, 2048))
    setup.command_buffers = args.command_buffers
    setup.layers_per_call = args.layers_per_call
    setup.first_layers = args.first_layers
    setup.readout_memory = args.readout_memory
    setup.whole_last_layer = args.whole_last_layer
    setup.no_baseline = True
    engine, _ = build(config, setup, {})
    return engine, config


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gemma3-27b")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--single-digit", action="store_true")
    p.add_argument("--layers", type=int, help="override the preset's layer count")
    p.add_argument("--engine-runs", default="", help="e2e scenarios to run whole, comma-separated")
    add_engine_options(p)
    args = p.parse_args(argv)
    engine, config = probe_engine(args)
    runner = engine.runner
    scenario = next(s for s in scenarios(config.vocab_size) if s.name == "one_question")
    arrays, placements = one_question_arrays(engine, scenario)
    t = arrays["tokens"].shape[0]
    packed = pack(arrays, forward_layout(t, engine.engine_config))
    leaves = runner._param_leaves  # noqa: SLF001 (the probe measures exactly what forward passes)

    def row(name, times, **extra):
        print(json.dumps({"probe": name, "return_ms": times[0], "done_ms": times[1], **extra}))

    one = jax.jit(lambda x: x + 1)
    row("null_one_arg", timed_call(lambda: one(packed), args.runs))
    many = jax.jit(lambda leaves, x: x + 1)
    row("null_all_weights", timed_call(lambda: many(leaves, packed), args.runs), args=len(leaves))
    with_kv = jax.jit(lambda leaves, kv, x: (x + 1, kv), donate_argnums=1)

    def null_kv():  # the pool is donated each call: the result's pool is the next call's
        out, runner.kv = with_kv(leaves, runner.kv, packed)
        return out

    row("null_weights_kv", timed_call(null_kv, args.runs), kv=len(jax.tree.leaves(runner.kv)))
    for hold in (False, True):
        runner.forward(arrays)  # compiled and called once: later calls may take the fast path
        with SlowPathCounter() as slow:
            times = timed_call(lambda: runner.forward(arrays), args.runs, hold)
        row("forward_held" if hold else "forward", times, tokens=t, slow_calls=slow.count)
    hidden = jax.block_until_ready(runner.forward(arrays))
    print(json.dumps(readout_split(runner, hidden, arrays, args.runs)), flush=True)
    print(json.dumps(readout_after_forward(runner, arrays, args.runs)), flush=True)
    release(placements, engine.cache, True)
    for name in filter(None, args.engine_runs.split(",")):
        print(json.dumps(engine_runs(engine, config, name, args.runs)), flush=True)
    info = {"probe": "info", "device": jax.devices()[0].device_kind}
    info |= {"command_buffers": args.command_buffers, "layers": config.num_layers}
    print(json.dumps(info | {"forward_parts": len(runner.parts)}))


def _timed(fn) -> float:
    """Seconds fn() takes."""
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _read_parts(exe, emb, hidden, arrays) -> dict[str, float]:
    """runner.read's steps one by one, seconds each: packing the readout arrays, the readout
    call returning, its result being ready, the device-to-host copy."""
    r, c = arrays["cand_ids"].shape
    t = [time.perf_counter()]
    packed = pack(arrays, readout_layout(r, c))
    t.append(time.perf_counter())
    out = exe(emb, hidden, packed)
    t.append(time.perf_counter())
    jax.block_until_ready(out)
    t.append(time.perf_counter())
    jax.device_get(out)
    t.append(time.perf_counter())
    return {k: b - a for k, a, b in zip(("pack", "call", "ready", "get"), t, t[1:], strict=False)}


def _readout_exe(runner, hidden, arrays):
    """The readout executable of the step's arrays, what runner.read passes it, and the arrays
    it packs (the rows as they sit in hidden)."""
    key, arrays = runner.readout_inputs(hidden, arrays)
    emb = runner._embedding  # noqa: SLF001 (what read passes)
    return key, runner.executable(key), emb, arrays


def _medians(probe: str, key: tuple, rows: list[dict[str, float]]) -> dict:
    out = {"probe": probe, "key": list(key)}
    return out | {f"{k}_ms": statistics.median(1e3 * r[k] for r in rows) for k in rows[0]}


def readout_split(runner, hidden, arrays, runs: int) -> dict:
    """Where runner.read's host time goes, median ms per part over `runs` reads of a ready
    hidden: packing the step's readout arrays, the call returning, its result being ready,
    the device-to-host copy, and the whole runner.read for comparison."""
    key, exe, emb, packed_arrays = _readout_exe(runner, hidden, arrays)
    runner.read(hidden, arrays)  # warm-up
    rows = [
        _read_parts(exe, emb, hidden, packed_arrays)
        | {"read": _timed(lambda: runner.read(hidden, arrays))}
        for _ in range(runs)
    ]
    return _medians("readout_split", key, rows)


def spin_until_ready(x):
    """Polls x until it is ready, keeping the host thread busy (block_until_ready sleeps)."""
    while not x.is_ready():
        pass
    return x


def _after_forward_row(runner, arrays, exe, emb, tiny, read_arrays) -> dict[str, float]:
    """One round of readout_after_forward's reads, each after a forward of its own
    (read_arrays: what the readout executable packs, _readout_exe's)."""

    r, c = arrays["cand_ids"].shape

    def fresh():  # a forward whose hidden is ready
        return jax.block_until_ready(runner.forward(arrays))

    def read(hidden):
        return lambda: runner.read(hidden, arrays)

    def read_spinning():  # the engine's order, polling the result instead of sleeping
        out = exe(emb, runner.forward(arrays), pack(read_arrays, readout_layout(r, c)))
        out.copy_to_host_async()
        jax.device_get(spin_until_ready(out))

    row = {"after_ready": _timed(read(fresh()))}
    hidden = fresh()
    time.sleep(0.003)
    row["after_sleep"] = _timed(read(hidden))
    old = fresh()  # read in parts now; the next forward's hidden is fresh, this one is not
    row |= _read_parts(exe, emb, old, read_arrays)
    row["forward"] = _timed(fresh)
    row["both"] = _timed(lambda: runner.read(runner.forward(arrays), arrays))
    fresh()
    row["old_hidden"] = _timed(read(old))
    fresh()
    row["tiny_get"] = _timed(lambda: jax.device_get(tiny()))
    hidden = fresh()
    gc.disable()
    try:
        row["no_gc"] = _timed(read(hidden))
    finally:
        gc.enable()
    row["after_spin"] = _timed(read(spin_until_ready(runner.forward(arrays))))
    row["both_spin"] = _timed(read_spinning)
    return row


def readout_after_forward(runner, arrays, runs: int) -> dict:
    """runner.read of each step's fresh hidden, median ms: right after the forward is ready
    (e2e_decide's --profile readout_ms), the same after a 3 ms sleep (is it something the
    forward left running?), that read in parts (pack, call, ready, copy back), and the
    engine's own order, forward then read unblocked, against the forward alone; then after a
    fresh forward: a read of the previous hidden, a copy back of an unrelated tiny result,
    a read with Python's garbage collector off, a read after spinning (not sleeping) until
    the forward is ready, and the engine's order with a spin before the copy back."""
    hidden = jax.block_until_ready(runner.forward(arrays))
    key, exe, emb, read_arrays = _readout_exe(runner, hidden, arrays)
    tiny = jax.jit(lambda: jax.numpy.arange(8.0))  # an unrelated fresh 32-byte result
    rows = [
        _after_forward_row(runner, arrays, exe, emb, tiny, read_arrays) for _ in range(runs + 2)
    ]
    return _medians("readout_after_forward", key, rows[2:])  # the first two: warm-up


def engine_runs(engine, config, name: str, runs: int) -> dict:
    """e2e_decide.measure's runs of one scenario, each with its wall ms and the addresses of the
    forward's hidden and of the KV pool's first buffer after its forward."""
    scenario = next(s for s in scenarios(config.vocab_size) if s.name == name)
    runner, seen = engine.runner, []
    forward = runner.forward

    def logged(arrays):
        hidden = forward(arrays)
        kv = jax.tree.leaves(runner.kv)[0]
        seen.append((hidden.unsafe_buffer_pointer(), kv.unsafe_buffer_pointer()))
        return hidden

    engine.cache.clear()
    for q in scenario.prefill:
        engine.run([q])
    engine.run(scenario.questions)  # warm-up (and compiles)
    runner.forward, walls, addresses = logged, [], []
    try:
        with SlowPathCounter() as slow:
            for i in range(runs):
                if scenario.cold:
                    engine.cache.clear()
                print(f"## {name} run {i}", file=sys.stderr, flush=True)  # between XLA's logs
                seen.clear()
                t0 = time.perf_counter()
                engine.run(scenario.questions)
                walls.append(1e3 * (time.perf_counter() - t0))
                addresses.append([[hex(h), hex(k)] for h, k in seen])
    finally:
        runner.forward = forward
    return {
        "probe": "engine_runs",
        "scenario": name,
        "wall_ms": walls,
        "hidden_kv": addresses,
        "slow_calls": slow.count,
    }


if __name__ == "__main__":
    main()
