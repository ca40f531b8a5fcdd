"""Host cost of launching one executable, by what it holds: a chain of N tiny XLA fusions
against a chain of N tiny prism custom calls, untraced.

    python3 benchmarks/graph_launch_probe.py [--counts 1,64,256,1024] [--runs 20] [--out DIR]

The 27B forward's call returns ~4 ms after it starts while passing its arguments costs ~1 ms
(results/e2e_h200_session10/): the rest is spent inside XLA's execution of its one CUDA graph
(command buffer) of ~1,058 commands, ~600 of them FFI custom calls, which XLA records by
stream capture as nested graphs. This probe separates the two kinds of command:
  fusion   x = optimization_barrier(x * a + b): one XLA loop-fusion kernel per step
  custom   (codes, scales) = rmsnorm_quant(x); x = int8_gemm(codes, scales, w, s_w): two FFI
           custom calls per step (the forward's own ops, on [1, D] rows)
and prints one JSON line per (kind, count): medians over --runs calls of the time until the
call returns (`return_ms`: the host's work, the graph's launch included) and until its result
is ready (`done_ms`), and return_ms per command. Run it once with XLA's default command buffers
and once with XLA_FLAGS=--xla_gpu_enable_command_buffer= (op-by-op thunks) to compare.
Needs a GPU for meaningful numbers; on the CPU it is a smoke test.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
from dispatch_probe import timed_call  # benchmarks/ is sys.path[0] as a script

from prism_jax.ops.int8_gemm import int8_gemm
from prism_jax.ops.quantize import quantize_weight
from prism_jax.ops.rmsnorm_quant import rmsnorm_quant


def fusion_chain(count: int):
    def fn(x):
        for i in range(count):
            x = jax.lax.optimization_barrier(x * jnp.float32(1.0001) + jnp.float32(1e-3 * i))
        return x

    return fn


def custom_chain(count: int):
    def fn(x, gamma, w_q, s_w):
        for _ in range(count):
            codes, scales = rmsnorm_quant(x, gamma, eps=1e-6)
            x = int8_gemm(codes, scales, w_q, s_w)
        return x

    return fn


def probe(kind: str, count: int, dim: int, runs: int) -> dict:
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((1, dim)), jnp.float32)
    if kind == "fusion":
        fn, args, commands = jax.jit(fusion_chain(count)), (x,), count
    else:
        w_q, s_w = quantize_weight(jnp.asarray(rng.standard_normal((dim, dim)), jnp.float32))
        gamma = jnp.ones((dim,), jnp.float32)
        fn, args, commands = jax.jit(custom_chain(count)), (x, gamma, w_q, s_w), 2 * count
    return_ms, done_ms = timed_call(lambda: fn(*args), runs)
    return {
        "probe": "graph_launch",
        "kind": kind,
        "count": count,
        "commands": commands,
        "return_ms": round(return_ms, 4),
        "done_ms": round(done_ms, 4),
        "return_us_per_command": round(1e3 * return_ms / commands, 3),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "backend": jax.default_backend(),
    }


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--counts", default="1,64,256,1024", help="chain lengths, comma-separated")
    p.add_argument("--kinds", default="fusion,custom")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", help="append the JSON lines to DIR/graph_launch.jsonl")
    args = p.parse_args(argv)
    counts = [int(c) for c in args.counts.split(",")]
    assert all(c > 0 for c in counts), f"--counts must be positive, got {args.counts}"
    kinds = args.kinds.split(",")
    assert set(kinds) <= {"fusion", "custom"}, f"--kinds: fusion and/or custom, got {args.kinds}"
    lines = []
    for kind in kinds:
        for count in counts:
            line = json.dumps(probe(kind, count, args.dim, args.runs))
            print(line, flush=True)
            lines.append(line)
    if args.out:
        path = pathlib.Path(args.out)
        path.mkdir(parents=True, exist_ok=True)
        with open(path / "graph_launch.jsonl", "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
