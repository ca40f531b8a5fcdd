"""Bandwidth of the memory-bound custom calls on the GPU against copy bandwidth, same run.

    python3 benchmarks/ops_bandwidth.py --out DIR [--runs 10]

rmsnorm_quant (D = 5376) and glu_quant (F = 21504, gelu_tanh) at M tokens, candidate_head
(R rows x C = 16 candidates, gathered rows of a 262,208 x 5376 bf16 embedding) and
vocab_logsumexp (the whole embedding streamed once per call). Bytes = every input read once plus
every output written once; timed like gemm_bench.py (R calls per jitted run, each on its own
inputs; median and min-max over --runs). Copy: XLA x_i + 1 over 1 GiB (own input per call),
bytes read + written. Writes ops_bandwidth.jsonl under --out.
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

import jax
import jax.numpy as jnp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from gemm_bench import copy_bandwidth, stats, time_jax  # noqa: E402

from prism_jax import ops  # noqa: E402

D, F, V, C = 5376, 21504, 262_208, 16
TARGET_RUN_S = 2e-3


def run_op(name, fn, make_inputs, in_bytes, out_bytes, emit, runs, **meta):
    """make_inputs(i) -> the arrays of call i (every call its own, so XLA cannot deduplicate
    calls and inputs are not re-read from L2); fn(*arrays) -> outputs."""
    est = (in_bytes + out_bytes) / 3.5e12
    reps = int(min(max(8, math.ceil(TARGET_RUN_S / max(est, 1e-7))), 100))
    inputs = [make_inputs(i) for i in range(reps)]
    f = jax.jit(lambda *ins: [fn(*ins[i]) for i in range(reps)])
    per_op = time_jax(f, tuple(inputs), reps, runs)
    s = stats(per_op)
    t = s["median_us"] * 1e-6
    emit(
        {
            "op": name,
            **meta,
            "bytes": in_bytes + out_bytes,
            **s,
            "reps": reps,
            "tbps": (in_bytes + out_bytes) / t / 1e12,
        }
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", default="benchmarks/results/gemm_h200")
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    sink = open(out / "ops_bandwidth.jsonl", "w")  # noqa: SIM115
    gpu = jax.devices("gpu")[0]

    def emit(row):
        row = {**row, "device": gpu.device_kind}
        print(json.dumps(row), flush=True)
        sink.write(json.dumps(row) + "\n")

    key = jax.random.key(1)

    def normal(i, shape, dtype=jnp.bfloat16):
        return jax.random.normal(
            jax.random.fold_in(key, hash((i, shape)) % 2**31), shape, jnp.float32
        ).astype(dtype)

    with jax.default_device(gpu):
        copy_bandwidth(emit, args.runs)
        gamma = jnp.ones((D,), jnp.float32)
        for m in (64, 416, 4096):
            run_op(
                "rmsnorm_quant",
                lambda x: ops.rmsnorm_quant(x, gamma, eps=1e-6),
                lambda i, m=m: (normal(i, (m, D)),),
                m * D * 2 + D * 4,
                m * D + m * 4,
                emit,
                args.runs,
                M=m,
                D=D,
            )
            run_op(  # the model's call: the gate/up projection's [M, 2, F] read in place
                "glu_quant",
                lambda gu: ops.glu_quant_pair(gu, activation="gelu_tanh"),
                lambda i, m=m: (normal(i, (m, 2, F)),),
                2 * m * F * 2,
                m * F + m * 4,
                emit,
                args.runs,
                M=m,
                F=F,
            )
        emb = normal(0, (V, D))
        for r in (64, 416):
            counts = jnp.full((r,), C, jnp.int32)

            def head_inputs(i, r=r):  # fresh ids per copy: the gathered rows must not stay in L2
                ids = jax.random.randint(jax.random.fold_in(key, i), (r, C), 0, V, jnp.int32)
                return normal(i, (r, D)), ids, emb  # emb an argument: not a 2.8 GB constant

            run_op(
                "candidate_head",
                lambda h, ids, e, counts=counts: ops.candidate_head(h, e, ids, counts),
                head_inputs,
                r * D * 2 + r * C * (D * 2 + 4),
                r * C * 8,
                emit,
                args.runs,
                R=r,
                C=C,
                V=V,
                D=D,
            )
        for r in (1, 64):
            run_op(
                "vocab_logsumexp",
                lambda h, e: ops.vocab_logsumexp(h, e),
                lambda i, r=r: (normal(i, (r, D)), emb),
                V * D * 2 + r * D * 2,
                r * 4,
                emit,
                args.runs,
                R=r,
                V=V,
                D=D,
            )
    sink.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
