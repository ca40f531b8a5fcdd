"""End-to-end decision latency on a Gemma-3-27B-shaped model (random INT8 weights) against the
generic baseline (the same model in BF16 through XLA), both measured in the same run.

    python3 benchmarks/e2e_decide.py --preset gemma3-27b --runs 10 --out DIR [--profile]
    python3 benchmarks/e2e_decide.py --render DIR        # E2E.md and e2e.png from DIR/e2e.jsonl

Scenarios (DESIGN.md "Performance targets"; token ids are random, options single tokens):
  1. one question, ~256-token prompt: prefix 224 (root 64 + state 160) + branch 32, 4 options;
  2. one state + three questions: root 64 + state 256 + 3 x 32, as one forest;
  3. a follow-up question (branch 32) on a cached 4,096-token prefix (root 64 + state 4,032):
     the prefix is prefilled once, untimed, in steps of --chunk tokens; each timed run is a
     prefix-cache hit that computes the 32 branch tokens.
prism_jax = `Engine.run` on the int8 model (cold prefix cache before each timed run of 1 and 2),
timed on the host around the whole call (forest, cache, steps, readout, probabilities: run
returns host numbers, so it is synchronous). Baseline = one request per question, full causal
prompt, `model.forward` (dense masked attention) + `full_logits` of the last token + softmax
over the whole vocabulary, jitted, in BF16; scenario 2 = three such requests in a row,
scenario 3 = the full 4,128-token prompt. Median and min-max over --runs timed runs after
warm-up. Every executable is compiled before the timed runs (compile times are printed and
kept in DIR/compile.json) and the runs are checked not to compile anything.

Writes DIR/e2e.jsonl (one JSON line per scenario, also printed), DIR/E2E.md, DIR/e2e.png;
--profile adds a host-prep / forward / readout split per scenario (synchronised parts of a
run; e2e_split.py), --baseline-after builds the bf16 model only once the int8 engine is freed
(a card that cannot hold both: the 27B on an H100), --trace a jax.profiler trace of three
runs each under DIR/trace. --compile-only stops after compiling. --preset tiny is a small
model for CPU smoke tests: its numbers are not results (--layers 62 with it gives CPU lower
bounds on compile times).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import pathlib
import shutil
import statistics
import sys
import time

import jax
from bench_common import commit, stats, timed  # benchmarks/ is sys.path[0] as a script
from e2e_baseline import Baseline, build_baseline, compile_baseline, with_baseline
from e2e_report import render
from e2e_scenarios import (
    PRESETS,
    PRISM_MS,
    ROOT_LEN,
    TARGET_MS,
    TITLES,
    TOKEN_BUCKETS,
    Scenario,
    engine_steps,
    scenarios,
    step_keys,
)
from e2e_split import split_times

from prism_jax import model, ops
from prism_jax.config import COMMAND_BUFFERS, READOUT_MEMORIES, EngineConfig, ModelConfig
from prism_jax.engine import Engine

ROOT = pathlib.Path(__file__).resolve().parents[1]
TRACE_RUNS = 3  # prism runs per scenario under --trace


def log(msg: str) -> None:
    print(f"[e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --- timing -----------------------------------------------------------------------------------


def compile_engine(engine: Engine, keys: list[tuple], compile_s: dict) -> None:
    for key in keys:
        name = "/".join(map(str, key))
        if name not in compile_s:
            start = time.perf_counter()
            engine.runner.executable(key)  # lowers and compiles the bucket's step
            compile_s[name] = round(time.perf_counter() - start, 2)
            log(f"compiled {name} in {compile_s[name]:.1f} s")


def measure(
    engine: Engine, baseline, s: Scenario, runs: int, chunk: int, warmup: int = 1
) -> tuple[dict, list]:
    """The scenario's row (with the baseline's columns when `baseline` is given, else None)
    and the engine's probabilities per question."""
    compilations = engine.runner.compilations  # everything was compiled beforehand
    engine.cache.clear()
    for q in s.prefill:  # untimed: fills the prefix cache
        engine.run([q], chunk=chunk)
    clear = engine.cache.clear if s.cold else None
    if clear:
        clear()
    for _ in range(warmup):  # XLA records a step's CUDA graphs on their second execution
        if clear:  # a cold scenario stays cold: a hit would run (and compile) another step
            clear()
        engine.run(s.questions, chunk=chunk)
    results = []

    def prism():
        results.append(engine.run(s.questions, chunk=chunk))
        return results[-1]

    t_prism, result = timed(prism, runs, clear)
    assert engine.runner.compilations == compilations, (
        "the scenario compiled a step: step_keys is wrong"
    )
    cached = sum(result.cached_tokens(q) for q in range(len(s.questions)))
    row = {
        "scenario": s.name,
        "title": TITLES[s.name],
        "shapes": s.shapes,
        "prism": stats(t_prism),
        "engine_step_ms": 1e3 * statistics.median(r.seconds for r in results),
        "computed_tokens": result.computed_tokens,
        "cached_tokens": cached,
        "steps": result.steps,
        "target_ms": TARGET_MS[s.name],
        "prism_published_ms": PRISM_MS[s.name],
    }
    # Host lists of floats: --baseline-after compares against them once the engine is gone.
    return with_baseline(row, baseline, s, runs, result.probabilities), result.probabilities


# --- setup and main ---------------------------------------------------------------------------


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """The EngineConfig options `build` reads (also dispatch_probe.py's)."""
    p.add_argument(
        "--command-buffers",
        choices=sorted(COMMAND_BUFFERS),
        default=EngineConfig.command_buffers,
        help="EngineConfig.command_buffers: XLA's CUDA graphs as XLA decides, or off",
    )
    p.add_argument(
        "--layers-per-call",
        type=int,
        help="EngineConfig.forward_layers_per_call (default: the engine's, 32 on a GPU)",
    )
    p.add_argument(
        "--first-layers",
        type=int,
        default=EngineConfig.forward_first_layers,
        help="EngineConfig.forward_first_layers: the forward's first part's layers",
    )
    p.add_argument(
        "--readout-memory",
        choices=READOUT_MEMORIES,
        default=EngineConfig.readout_memory,
        help="EngineConfig.readout_memory: the readouts' results in host memory or on the device",
    )
    p.add_argument(
        "--whole-last-layer",
        action="store_true",
        help="EngineConfig.readout_only_last_layer=False: the last layer for every token (A/B)",
    )


def build(config: ModelConfig, args, times: dict) -> tuple[Engine, Baseline | None]:
    start = time.perf_counter()
    params8 = jax.block_until_ready(model.init_random(config, "int8", args.seed))
    times["init_int8_s"] = round(time.perf_counter() - start, 2)
    e = EngineConfig(
        page_size=16,
        kv_pages=args.kv_pages,
        token_buckets=args.token_buckets,
        row_buckets=(1, 4),
        candidate_buckets=(4, 256),
        command_buffers=args.command_buffers,
        forward_layers_per_call=args.layers_per_call,
        forward_first_layers=args.first_layers,
        readout_memory=args.readout_memory,
        readout_only_last_layer=not args.whole_last_layer,
    )
    # --attention digits applies to the prism engine only; the baseline keeps its own path.
    prism_config = config.replace(attention_numerics=getattr(args, "attention", "canonical"))
    engine = Engine(prism_config, params8, None, None, name="prism_jax int8", engine_config=e)
    engine.root_len = ROOT_LEN
    if args.no_baseline or getattr(args, "baseline_after", False):
        log(f"random weights: int8 {times['init_int8_s']} s, no baseline (yet)")
        return engine, None
    baseline = build_baseline(config, args.seed, times)
    log(f"random weights: int8 {times['init_int8_s']} s, bf16 {times['init_bf16_s']} s")
    return engine, baseline


def meta(args, config: ModelConfig) -> dict:
    dev = jax.devices()[0]
    return {
        "preset": args.preset,
        "layers": config.num_layers,
        "card": dev.device_kind,
        "platform": dev.platform,
        "jax": jax.__version__,
        "commit": commit(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "token_buckets": list(args.token_buckets),
        "chunk": args.chunk,
        "kv_pages": args.kv_pages,
        "int8_two_digit_rows": list(config.int8_two_digit_rows),
        "int8_two_digit_weights": list(config.int8_two_digit_weights),
        "attention_numerics": getattr(args, "attention", "canonical"),
        "command_buffers": args.command_buffers,
        "layers_per_call": args.layers_per_call,
        "first_layers": args.first_layers,
        "readout_memory": args.readout_memory,
        "readout_only_last_layer": not args.whole_last_layer,
        "warmup_runs": getattr(args, "warmup", 1),
        "baseline_after": getattr(args, "baseline_after", False),
        "kv_write": "qkv_rope" if ops.kv_write_fused() else "tree_attention",  # PRISM_QKV_ROPE_KV
        # What XLA ran under (command buffer modes, profiling with graphs): A/Bs differ here.
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        # Not a result: another model, another device or fewer runs than DESIGN.md asks for.
        "smoke": args.preset != "gemma3-27b"
        or bool(args.layers)
        or dev.platform != "gpu"
        or args.runs < 10
        or args.no_baseline,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--preset", choices=sorted(PRESETS), default="gemma3-27b")
    p.add_argument("--layers", type=int, help="override the preset's layer count (compile probes)")
    p.add_argument("--runs", type=int, default=10)
    p.add_argument(
        "--warmup",
        type=int,
        default=1,
        help="untimed runs per scenario first (XLA's command_buffer_update_mode=SKIP_PROFILED "
        "observes an executable's first 3 runs op by op: give it 4)",
    )
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/e2e_h200"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-pages", type=int, default=320, help="16-token pages (4,128 tokens: 259)")
    p.add_argument(
        "--token-buckets",
        type=lambda s: tuple(map(int, s.split(","))),
        default=TOKEN_BUCKETS,
        help="steps pad to the next bucket (default: 32, then every multiple of 64 up to 512, "
        "1024, 2048; only the buckets a scenario uses are compiled)",
    )
    p.add_argument("--chunk", type=int, default=2048, help="tokens per step of the 4K prefill")
    p.add_argument("--scenarios", default=",".join(TITLES), help="comma-separated subset")
    add_mode_options(p)
    add_engine_options(p)
    p.add_argument("--compile-only", action="store_true", help="build and compile, then stop")
    p.add_argument("--render", metavar="DIR", help="only re-render E2E.md / e2e.png from DIR")
    return p.parse_args(argv)


def add_mode_options(p: argparse.ArgumentParser) -> None:
    """What the run measures: profile or trace, the int8 engine's numerics, the baseline."""
    p.add_argument("--profile", action="store_true", help="host / forward / readout split")
    p.add_argument(
        "--single-digit", action="store_true", help="INT8 rows and weights with one digit each"
    )
    p.add_argument(
        "--attention",
        choices=("canonical", "digits"),
        default="canonical",
        help="the int8 engine's attention arithmetic (ModelConfig.attention_numerics)",
    )
    p.add_argument(
        "--trace",
        action="store_true",
        help="jax.profiler traces + per-op GPU time (breakdown.jsonl)",
    )
    p.add_argument(
        "--baseline-after",
        action="store_true",
        help="build the bf16 baseline only after every engine run, once the int8 model is "
        "freed (a card that cannot hold both: the 27B on an H100); rows are printed twice",
    )
    p.add_argument(
        "--no-baseline",
        action="store_true",
        help="skip the bf16 baseline (engine probes: XLA flags, traces); rows are smoke rows",
    )


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.render:
        return render(pathlib.Path(args.render))
    t_start = time.perf_counter()
    config = PRESETS[args.preset]
    if args.layers:
        config = config.replace(num_layers=args.layers)
    if args.single_digit:  # INT8 with one digit per row and weight (issue 7's option off)
        config = config.replace(int8_two_digit_rows=(), int8_two_digit_weights=())
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    info = meta(args, config)
    log(f"{info['card']} ({info['platform']}), preset {args.preset}, {config.num_layers} layers")
    setup: dict = {"compile_s": {}}
    engine, baseline = build(config, args, setup)
    chosen = [
        s for s in scenarios(config.vocab_size, args.seed) if s.name in args.scenarios.split(",")
    ]
    summary = out / "compile.json"  # rewritten after each scenario: a cut-short run still reports
    (out / "e2e.jsonl").write_text("")
    measured = []  # (scenario, row, the engine's probabilities)
    for s in chosen:  # compile then measure each in turn: a run cut short keeps what it measured
        compile_scenario(engine, baseline, s, args.chunk, setup["compile_s"])
        setup["total_s"] = round(time.perf_counter() - t_start, 1)
        summary.write_text(json.dumps({**info, **setup}, indent=1) + "\n")
        if not args.compile_only:
            measured.append((s, *run_scenario(engine, baseline, s, args, info, out)))
    if args.trace:
        trace(engine, baseline, chosen, args.chunk, out / "trace")
    if args.baseline_after and not args.no_baseline:
        del engine  # the int8 weights and KV pool go before the bf16 model is built
        baseline_after(config, args, chosen, measured, setup, out)
    setup["total_s"] = round(time.perf_counter() - t_start, 1)
    summary.write_text(json.dumps({**info, **setup}, indent=1) + "\n")
    log(f"done in {setup['total_s']} s (compiling {sum(setup['compile_s'].values()):.1f} s)")
    if not args.compile_only and not args.no_baseline:
        render(out)


def compile_scenario(engine: Engine, baseline: Baseline, s: Scenario, chunk: int, times: dict):
    keys = step_keys(engine.runner, engine_steps(s, chunk))
    compile_engine(engine, keys, times)
    compile_baseline(baseline, s, times, log)


def run_scenario(engine: Engine, baseline: Baseline, s: Scenario, args, info: dict, out):
    """Measures s, prints and appends its row; returns the row and the engine's answers."""
    row, probabilities = measure(engine, baseline, s, args.runs, args.chunk, args.warmup)
    row = {**info, **row}
    if args.profile:
        row["split_ms"] = split_times(engine, s, args.runs, args.chunk)
    print(json.dumps(row), flush=True)
    with open(out / "e2e.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    log_row(row)
    return row, probabilities


def log_row(row: dict) -> None:
    p = row["prism"]["median_ms"]
    if row["baseline"] is None:  # --no-baseline, or --baseline-after before the bf16 model
        log(f"{row['scenario']}: prism_jax {p:.2f} ms (no baseline)")
        return
    b = row["baseline"]["median_ms"]
    log(f"{row['scenario']}: prism_jax {p:.2f} ms, baseline {b:.2f} ms, ratio {row['ratio']:.1f}")


def baseline_after(config: ModelConfig, args, chosen, measured, setup: dict, out) -> None:
    """--baseline-after: the bf16 model built once the int8 engine is gone (a card that cannot
    hold both, e.g. an H100 with the 27B), every scenario's baseline compiled and measured
    against the engine's kept answers, and e2e.jsonl rewritten with the full rows."""
    freed = gc.collect()
    in_use = (jax.devices()[0].memory_stats() or {}).get("bytes_in_use")
    log(f"int8 engine released ({freed} objects collected; device bytes in use: {in_use})")
    baseline = build_baseline(config, args.seed, setup)
    log(f"random weights: bf16 {setup['init_bf16_s']} s")
    for s in chosen:
        compile_baseline(baseline, s, setup["compile_s"], log)
    rows = [with_baseline(row, baseline, s, args.runs, probs) for s, row, probs in measured]
    with open(out / "e2e.jsonl", "w") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)
    for row in rows:
        print(json.dumps(row), flush=True)
        log_row(row)


def trace(engine: Engine, baseline, chosen: list[Scenario], chunk: int, where: pathlib.Path):
    """TRACE_RUNS prism runs per scenario, each scenario in its own jax.profiler trace, then the
    per-op GPU time of each (benchmarks/trace_breakdown.py) into OUT/breakdown.jsonl."""
    from trace_breakdown import breakdown
    from trace_gaps import gaps

    rows = []
    for s in chosen:
        if not s.cold:  # the cached prefix may have been evicted since: refill it untraced
            engine.run(s.questions, chunk=chunk)
        # The breakdown reads every trace under the folder: one left by an earlier run into the
        # same --out would be summed with this one (session 20 got every op twice that way).
        shutil.rmtree(where / s.name, ignore_errors=True)
        with jax.profiler.trace(str(where / s.name)):
            for _ in range(TRACE_RUNS):
                if s.cold:
                    engine.cache.clear()
                with jax.profiler.TraceAnnotation(f"prism {s.name}"):
                    engine.run(s.questions, chunk=chunk)
        rows += [{"scenario": s.name, **r} for r in breakdown(where / s.name, TRACE_RUNS)]
        rows += [{"scenario": s.name, **r} for r in gaps(where / s.name, TRACE_RUNS)]
    with open(where.parent / "breakdown.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    for r in rows:
        if r["kind"] != "kernel":
            print(json.dumps(r), flush=True)
    log(f"profiler traces in {where}, per-op GPU time in {where.parent / 'breakdown.jsonl'}")


if __name__ == "__main__":
    main()
