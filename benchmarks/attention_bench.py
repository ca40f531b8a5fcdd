"""tree_attention (the prism custom call) on Gemma-3-27B attention shapes against the same run's
ceilings (copy bandwidth, dense matmul FLOP/s) and XLA's own attention on the same problem.

    python3 benchmarks/attention_bench.py --out DIR [--runs 10] [--quick] [--dtypes f32,bf16]

Shapes: N = 32 q heads, K = 16 kv heads, H = 128, page size 16, scale 168^-0.5; KV in fp32 (what
the engine stores for int8 and fp32 models, kv_pages.kv_dtype; q fp32) and bf16 (bf16 models).
Each case is one engine step, tables from the engine's forest/scheduler code
(attention_cases.py): (a) forest prefill root 64 + state 256 + 3x32 (416 tokens, bucket 512);
(b) prefill of a 4K/16K/32K state in chunks of 2048 (the largest token bucket): the first chunk
and each state's last chunk (2048 queries over the whole prefix) are timed, the whole state is
an estimate linear in keys between the two (labelled); (c) decode of 64 sequences x 2K cached
tokens, 1 new token each; (d) all of them again as sliding-window layers (window 1024).
One timed call = one jitted run of R tree_attention calls threading the donated pools (so no
pool copy), per-call time = run time / R, R sized for ~5 ms per run; median and min-max over
--runs runs (fewer, at least 3, when a case would pass --cap-s) after warm-up.
FLOPs = 4 * N * H * keys seen (unmasked only); bytes = KV rows read once + q/out + k/v written.
XLA baseline: jax.nn.dot_product_attention (implementation='xla') on dense contiguous K/V with
the step's exact mask (decode: a batch of 64), skipped above 2^31 logits. Layer context: the
int8 GEMM time of one 27B layer (qkv, o, gate_up, down) at M = the step's token bucket, from
--gemm (prism medians, linear between measured M). Writes attention.jsonl and attention.md.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import attention_cases as ac  # noqa: E402
from attention_report import markdown  # noqa: E402
from bench_common import commit, jsonl_emitter  # noqa: E402
from op_timing import copy_bandwidth, stats, time_jax  # noqa: E402

from prism_jax import ops  # noqa: E402
from prism_jax.config import EngineConfig  # noqa: E402
from prism_jax.ops.tree_attention_digits import pack_digit_rows  # noqa: E402

SCALE = 168**-0.5  # Gemma-3-27B query_pre_attn_scalar
TARGET_RUN_S = 5e-3
MAX_REPS = 64
MIN_RUNS = 3
ATTENTION = {"canonical": ops.tree_attention, "digits": ops.tree_attention_digits}
XLA_MAX_LOGITS = 2**31  # B * N * Tq * S; 8 GiB of fp32 logits
GEMM_SHAPES = {
    "qkv": (8192, 5376),
    "o": (5376, 4096),
    "gate_up": (43008, 5376),
    "down": (5376, 21504),
}
FULL = dict(
    n=32, k=16, h=128, window=1024, engine=EngineConfig(), forest=(64, 256, 3, 32),
    states=(4096, 16384, 32768), decode=(64, 2048), copy=1 << 30, matmul=8192,
    question=256, followup=(64, 4032, 32),
)  # fmt: skip
QUICK = dict(
    n=4, k=2, h=32, window=32, engine=EngineConfig(token_buckets=(8, 16, 32, 64)),
    forest=(8, 16, 3, 4), states=(128, 256), decode=(4, 64), copy=1 << 20, matmul=256,
    question=24, followup=(8, 120, 4),
)  # fmt: skip
DTYPES = {"f32": jnp.float32, "bf16": jnp.bfloat16}


class Budget:
    """A wall-clock limit for all measurements: past it, cases are reported as skipped."""

    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self) -> float:
        return self.deadline - time.monotonic()


def measure(build, runs: int, cap_s: float) -> tuple[list[float], int]:
    """build(R) -> a function running one timed call of R ops (blocking). Probes R = 1 to size
    R (~TARGET_RUN_S per run) and the number of runs (at most cap_s, at least MIN_RUNS)."""
    run = build(1)
    run()  # compile
    run()
    t0 = time.perf_counter()
    run()
    one = time.perf_counter() - t0
    reps = int(min(max(1, math.ceil(TARGET_RUN_S / max(one, 1e-7))), MAX_REPS))
    if reps > 1:
        run = build(reps)
        run()
        run()
    count = int(max(MIN_RUNS, min(runs, cap_s // max(one * reps, 1e-9))))
    per_op = []
    for _ in range(count):
        t0 = time.perf_counter()
        run()
        per_op.append((time.perf_counter() - t0) / reps)
    return per_op, reps


def prism_builder(case: ac.Case, cfg: dict, dtype, window: int):
    n, k, h, page = cfg["n"], cfg["k"], cfg["h"], cfg["engine"].page_size
    t = len(case.arrays["positions"])
    key = jax.random.key(t * 7 + case.num_pages)
    keys = jax.random.split(key, 5)
    q = jax.random.normal(keys[0], (t, n, h), jnp.float32).astype(dtype)
    kn, vn = (jax.random.normal(x, (t, k, h), jnp.float32).astype(dtype) for x in keys[1:3])
    shape = (case.num_pages, page, k, h)
    pools = [jax.random.normal(x, shape, jnp.float32).astype(dtype) for x in keys[3:]]
    if cfg.get("numerics") == "digits":  # packed INT8 digit rows (ops.tree_attention_digits)
        pools = [jax.jit(pack_digit_rows)(x) for x in pools]
    state = {"pools": pools}
    tables = [jnp.asarray(case.arrays[name]) for name in ac.TABLES]

    def build(reps: int):
        def steps(q, kn, vn, kp, vp, *tables):
            outs = []
            for _ in range(reps):  # each call reads the pools the previous one returned
                o, kp, vp = ATTENTION[cfg.get("numerics", "canonical")](
                    q, kn, vn, kp, vp, *tables, scale=SCALE, window=window
                )
                outs.append(o)
            return outs, kp, vp

        fn = jax.jit(steps, donate_argnums=(3, 4))

        def run():
            outs, kp, vp = fn(q, kn, vn, *state["pools"], *tables)
            state["pools"] = [kp, vp]
            jax.block_until_ready((outs, kp, vp))

        return run

    return build


def xla_builder(case: ac.Case, cfg: dict, dtype, window: int):
    """Dense XLA attention on the same queries/keys, or a reason it is skipped."""
    n, k, h = cfg["n"], cfg["k"], cfg["h"]
    b, tq, s, mask = ac.dense_problem(case.arrays, cfg["engine"].page_size, window)
    if b * n * tq * s > XLA_MAX_LOGITS:
        return f"dense logits B*N*Tq*S = {b * n * tq * s} > {XLA_MAX_LOGITS}: too large"
    key = jax.random.key(b * tq + s)
    kv = [
        jax.random.normal(x, (b, s, k, h), jnp.float32).astype(dtype) for x in jax.random.split(key)
    ]
    m = jnp.asarray(mask[:, None])  # (B, 1, Tq, S)

    def build(reps: int):
        qs = [
            jax.random.normal(jax.random.fold_in(key, i), (b, tq, n, h), jnp.float32).astype(dtype)
            for i in range(reps)
        ]  # own q per call: XLA cannot deduplicate the calls

        def attn(qs, kk, vv, m):
            return [
                jax.nn.dot_product_attention(x, kk, vv, mask=m, scale=SCALE, implementation="xla")
                for x in qs
            ]

        fn = jax.jit(attn)
        return lambda: jax.block_until_ready(fn(qs, *kv, m))

    return build


def load_gemm(path: pathlib.Path) -> dict:
    """{shape: [(M, prism median µs)]} from a gemm_bench.py gemm.jsonl (empty if absent)."""
    out: dict = {}
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        r = json.loads(line)
        if r.get("impl") == "prism" and "median_us" in r and r.get("shape") in GEMM_SHAPES:
            out.setdefault(r["shape"], []).append((r["M"], r["median_us"]))
    return {s: sorted(v) for s, v in out.items()}


def layer_gemm_us(gemm: dict, m: int) -> float | None:
    """One 27B layer's int8 GEMM time at M tokens: per shape, linear in M between measured Ms."""
    if set(gemm) != set(GEMM_SHAPES):
        return None
    total = 0.0
    for pts in gemm.values():
        ms, us = zip(*pts, strict=True)
        if not ms[0] <= m <= ms[-1]:
            return None
        total += float(np.interp(m, ms, us))
    return total


def bench_case(case, cfg, dtype_name, window, args, ctx, emit) -> dict | None:
    dtype = DTYPES[dtype_name]
    work = ac.account(
        case.arrays, cfg["engine"].page_size, window, cfg["n"], cfg["k"], cfg["h"],
        jnp.dtype(dtype).itemsize, jnp.dtype(dtype).itemsize,
    )  # fmt: skip
    base = {"scenario": case.name, "what": case.what, "kv_dtype": dtype_name, "window": window}
    base.update(work)
    if ctx["budget"].left() < 0:
        emit({**base, "impl": "prism", "skipped": "time budget (--budget-s) spent"})
        return None
    per_op, reps = measure(prism_builder(case, cfg, dtype, window), args.runs, args.cap_s)
    row = {**base, "impl": "prism", "reps": reps, **stats(per_op)}
    t = row["median_us"] * 1e-6
    row.update(tflops=work["flops"] / t / 1e12, tbps=work["bytes"] / t / 1e12)
    for name, (ceil_key, unit) in {"bf16_mm": ("tflops", "tflops"), "f32_mm": ("tflops", "tflops"),
                                   "copy": ("tbps", "tbps")}.items():  # fmt: skip
        if name in ctx["ceil"]:
            row[f"of_{name}"] = row[unit] / ctx["ceil"][name][ceil_key]
    gemm = layer_gemm_us(ctx["gemm"], work["step_tokens"])
    if gemm is not None:
        row.update(layer_gemm_us=gemm, attn_over_layer_gemm=row["median_us"] / gemm)
    emit(row)
    bench_xla(case, cfg, dtype, base, args, ctx, emit)
    return row


def bench_xla(case, cfg, dtype, base, args, ctx, emit) -> None:
    row = {**base, "impl": "xla_dense"}
    if ctx["budget"].left() < 0:
        emit({**row, "skipped": "time budget (--budget-s) spent"})
        return
    build = xla_builder(case, cfg, dtype, base["window"])
    if isinstance(build, str):
        emit({**row, "skipped": build})
        return
    try:
        per_op, reps = measure(build, args.runs, args.cap_s)
    except Exception as e:  # noqa: BLE001 (out of memory: report, go on)
        emit({**row, "skipped": f"{type(e).__name__}: {str(e)[:300]}"})
        return
    row.update(reps=reps, **stats(per_op))
    row["tflops"] = base["flops"] / (row["median_us"] * 1e-6) / 1e12
    emit(row)


def whole_state(cfg, length, window, dtype_name, first, last, ctx, emit) -> None:
    """Whole-state prefill estimate: per chunk a + b * keys, through the first and last chunk."""
    engine = cfg["engine"]
    steps, _ = ac.state_prefill(engine, length)
    acc = [
        ac.account(s, engine.page_size, window, cfg["n"], cfg["k"], cfg["h"], 4, 4) for s in steps
    ]
    keys = [a["keys_attended"] for a in acc]
    k0, k1, t0, t1 = keys[0], keys[-1], first["median_us"], last["median_us"]
    slope = (t1 - t0) / (k1 - k0) if k1 != k0 else 0.0
    total = sum(t0 + slope * (kk - k0) for kk in keys) if len(steps) > 2 else t0 + t1
    row = {
        "scenario": f"state{length}_whole", "impl": "prism_estimate", "kv_dtype": dtype_name,
        "window": window, "chunks": len(steps), "keys_attended": sum(keys),
        "flops": sum(a["flops"] for a in acc), "estimate_us": total,
        "how": "measured" if len(steps) <= 2 else
        "extrapolated: per-chunk time linear in keys through the measured first and last chunk",
    }  # fmt: skip
    row["tflops"] = row["flops"] / (total * 1e-6) / 1e12
    gemm = layer_gemm_us(ctx["gemm"], engine.max_step_tokens)
    if gemm is not None:
        row.update(
            layer_gemm_us=gemm * len(steps), attn_over_layer_gemm=total / (gemm * len(steps))
        )
    emit(row)


def ceilings(cfg, runs, emit) -> dict:
    rows = {}

    def keep(name):
        return lambda r: (rows.__setitem__(name, r), emit(r))

    copy_bandwidth(keep("copy"), runs, cfg["copy"])
    for name, dtype, prec in (("bf16_mm", jnp.bfloat16, None), ("f32_mm", jnp.float32, "highest")):
        n, reps = cfg["matmul"], 4
        xs = [
            jax.random.normal(jax.random.key(i), (n, n), jnp.float32).astype(dtype)
            for i in range(reps + 1)
        ]
        fn = jax.jit(
            lambda *a, p=prec, r=reps: [jnp.dot(a[i], a[i + 1], precision=p) for i in range(r)]
        )
        s = stats(time_jax(fn, tuple(xs), reps, runs))
        impl = f"xla_matmul_{name[:-3]}" + ("_highest" if prec else "")
        keep(name)({"impl": impl, "n": n, **s, "tflops": 2 * n**3 / (s["median_us"] * 1e-6) / 1e12})
    return rows


def run_all(cfg, args, emit) -> None:
    ctx = {"gemm": load_gemm(pathlib.Path(args.gemm)), "budget": Budget(args.budget_s)}
    ctx["ceil"] = ceilings(cfg, args.runs, emit)
    e, states = cfg["engine"], cfg["states"]
    cases = [ac.one_question(e, cfg["question"]), ac.forest_prefill(e, *cfg["forest"])]
    cases += [ac.follow_up(e, *cfg["followup"]), ac.state_chunk(e, states[0], 0)]
    cases += [ac.state_chunk(e, s, -1) for s in states] + [ac.decode(e, *cfg["decode"])]
    if args.cases:  # a subset by name prefix (whole-state estimates need both state chunks)
        cases = [c for c in cases if c.name.startswith(tuple(args.cases.split(",")))]
    for dtype_name in args.dtypes.split(","):
        for window in (0, cfg["window"]):
            done = {}
            for case in cases:
                if window and case.name.startswith(("forest", "question")):
                    continue  # fewer tokens than the window: the same work as the global layer
                done[case.name] = bench_case(case, cfg, dtype_name, window, args, ctx, emit)
            first = done.get(f"state{states[0]}_first_chunk")
            for s in states:
                last = done.get(f"state{s}_last_chunk")
                if first and last:
                    whole_state(cfg, s, window, dtype_name, first, last, ctx, emit)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/attention_h200")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="tiny shapes (a CPU smoke test)")
    parser.add_argument("--dtypes", default="f32,bf16", help="KV dtypes, in this order")
    parser.add_argument("--cap-s", type=float, default=3.0, help="timed seconds per measurement")
    parser.add_argument("--budget-s", type=float, default=100.0, help="then skip the rest")
    parser.add_argument("--cases", default="", help="comma-separated case name prefixes")
    parser.add_argument("--gemm", default="benchmarks/results/gemm_h200/gemm.jsonl")
    parser.add_argument(
        "--numerics",
        choices=sorted(ATTENTION),
        default="canonical",
        help="ops.tree_attention (canonical) or ops.tree_attention_digits (INT8 tensor cores)",
    )
    args = parser.parse_args()
    cfg = {**(QUICK if args.quick else FULL), "numerics": args.numerics}
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    dev = jax.devices()[0]
    meta = {
        "device": dev.device_kind, "platform": dev.platform, "jax": jax.__version__,
        "commit": commit(), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "quick": args.quick, "gemm_source": args.gemm, "shapes": {k: cfg[k] for k in "nkh"},
        "window": cfg["window"], "page_size": cfg["engine"].page_size,
        "numerics": args.numerics,
    }  # fmt: skip
    rows, rc = [], 0
    with open(out / "attention.jsonl", "w") as sink:
        emit = jsonl_emitter(sink, meta["device"], rows)

        emit({"meta": meta})
        try:
            run_all(cfg, args, emit)
        except KeyboardInterrupt:  # timeout -s INT: keep what was measured, write the table
            emit({"interrupted": "SIGINT before the end; the rows above are complete"})
            rc = 1
    md = markdown(rows, "python3 benchmarks/attention_bench.py " + " ".join(sys.argv[1:]))
    (out / "attention.md").write_text(md)
    print(md)
    return rc


if __name__ == "__main__":
    sys.exit(main())
