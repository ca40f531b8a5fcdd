"""One call of each memory-bound op at the item-3 sizes, for Nsight Compute's launch and
occupancy sections (benchmarks/occupancy_ncu.sh runs it under ncu).

    python3 benchmarks/occupancy_probe.py [--m 4096] [--rows 2048] [--vocab 262208]
        [--norm-kernels lean8,bulk]

Calls, in order: rmsnorm_quant (the launcher's choice, then each PRISM_RMSNORM_KERNEL of
--norm-kernels), add_rmsnorm_quant (the launcher's choice), norm_add_rmsnorm_quant (the same
with the post-norm of x fused in front: the pre-norm of every 27B layer), glu_quant_pair (one
digit), candidate_head (the launcher's choice, then PRISM_CANDIDATE_HEAD_KERNEL=warp). f32
activations, the 27B's D = 5376 and F = 21504.
"""

from __future__ import annotations

import argparse
import os

import jax
import jax.numpy as jnp

from prism_jax import ops

D, F, V, C = 5376, 21504, 262208, 16


def call(label: str, fn, *args) -> None:
    out = jax.jit(fn)(*args)  # each env setting traces its own executable: fresh launches
    jax.block_until_ready(out)
    print(f"{label}: done", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--m", type=int, default=4096)
    p.add_argument("--rows", type=int, default=2048)
    p.add_argument("--vocab", type=int, default=V, help="embedding rows (small: a CPU check)")
    p.add_argument("--norm-kernels", default="lean8", help="forced RMSNorm kernels, after default")
    args = p.parse_args()
    key = jax.random.key(0)
    x = jax.random.normal(key, (args.m, D), jnp.float32)
    gamma = jnp.ones((D,), jnp.float32)
    for kernel in ["", *(k for k in args.norm_kernels.split(",") if k)]:
        os.environ["PRISM_RMSNORM_KERNEL"] = kernel
        call(f"rmsnorm_quant {kernel or 'default'}",
             lambda x, g: ops.rmsnorm_quant(x, g, eps=1e-6), x, gamma)  # fmt: skip
    os.environ.pop("PRISM_RMSNORM_KERNEL")
    res = jax.random.normal(jax.random.key(1), (args.m, D), jnp.float32)
    call("add_rmsnorm_quant",
         lambda x, r, g: ops.add_rmsnorm_quant(x, r, g, eps=1e-6), x, res, gamma)  # fmt: skip
    call("norm_add_rmsnorm_quant",  # with Gemma's post-norm of x fused in front (x_gamma)
         lambda x, r, g: ops.add_rmsnorm_quant(x, r, g, eps=1e-6, x_gamma=g),
         x, res, gamma)  # fmt: skip
    gu = jax.random.normal(key, (args.m, 2, F), jnp.float32)
    call("glu_quant_pair", lambda gu: ops.glu_quant_pair(gu, activation="gelu_tanh"), gu)
    emb = jax.random.normal(key, (args.vocab, D), jnp.bfloat16)
    h = jax.random.normal(key, (args.rows, D), jnp.float32)
    ids = jax.random.randint(key, (args.rows, C), 0, args.vocab, jnp.int32)
    counts = jnp.full((args.rows,), C, jnp.int32)
    for kernel in ("", "warp"):
        os.environ["PRISM_CANDIDATE_HEAD_KERNEL"] = kernel
        call(f"candidate_head {kernel or 'default'}", ops.candidate_head, h, emb, ids, counts)
    os.environ.pop("PRISM_CANDIDATE_HEAD_KERNEL")


if __name__ == "__main__":
    main()
