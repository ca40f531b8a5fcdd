"""CPU time of prism_vocab_logsumexp (the full-vocabulary log-sum-exp of the candidate head) at
the default model's shape: Gemma 3 270M, V = 262,208 vocabulary rows, D = 640.

    nice -n 10 .venv/bin/python benchmarks/cpu_vocab_lse.py [--runs 10] [--label after]
        [--out benchmarks/results/cpu_ops/cpu_vocab_lse.jsonl]

Prints one JSON line per (rows, embedding dtype, softcap): the median of --runs timed calls
after one warm-up, GMAC/s = rows * V * D / median, and a SHA-256 of the lse and of the
per-tile partials, so that runs of two builds can be checked for identical bits.
--out appends the lines to a file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import statistics
import subprocess
import time

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax.ops._registry import require_target
from prism_jax.ops.canonical import VOCAB_TILE

ROOT = pathlib.Path(__file__).resolve().parents[1]
V, D = 262_208, 640  # Gemma 3 270M vocabulary and model dim


def lse_and_partials(hidden, embedding, softcap: float):
    """The raw custom call: lse [R] and the per-tile (max, sum) partials [R, T, 2]."""
    require_target("prism_vocab_logsumexp")
    r, v = hidden.shape[0], embedding.shape[0]
    tiles = -(-v // VOCAB_TILE)
    outs = (
        jax.ShapeDtypeStruct((r,), jnp.float32),
        jax.ShapeDtypeStruct((r, tiles, 2), jnp.float32),
    )
    call = jax.ffi.ffi_call("prism_vocab_logsumexp", outs, vmap_method="sequential")
    return call(hidden, embedding, softcap=np.float32(softcap))


def measure(rows: int, emb_dtype, softcap: float, runs: int) -> dict:
    rng = np.random.default_rng(0)
    hidden = jnp.asarray(rng.normal(0, 1, (rows, D)).astype(np.float32))
    emb = jnp.asarray(rng.normal(0, 0.05, (V, D)).astype(np.float32)).astype(emb_dtype)
    fn = jax.jit(lse_and_partials, static_argnames="softcap")
    lse, partials = jax.block_until_ready(fn(hidden, emb, softcap=softcap))  # compile + warm
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(hidden, emb, softcap=softcap))
        times.append(time.perf_counter() - t0)
    median = statistics.median(times)
    return {
        "rows": rows,
        "V": V,
        "D": D,
        "hidden": "float32",
        "embedding": jnp.dtype(emb_dtype).name,
        "softcap": softcap,
        "runs": runs,
        "ms": round(median * 1e3, 2),
        "ms_min": round(min(times) * 1e3, 2),
        "gmac_per_s": round(rows * V * D / median / 1e9, 3),
        "lse_sha256": hashlib.sha256(np.asarray(lse).tobytes()).hexdigest()[:16],
        "partials_sha256": hashlib.sha256(np.asarray(partials).tobytes()).hexdigest()[:16],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--label", default="")
    parser.add_argument("--out", type=pathlib.Path)
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True, capture_output=True
    ).stdout.strip()
    context = {
        "label": args.label,
        "commit": commit,
        "cpus": os.cpu_count(),
        "loadavg_1m": os.getloadavg()[0],
        "jax": jax.__version__,
    }
    for emb_dtype in (jnp.bfloat16, jnp.float32):
        for softcap in (0.0, 30.0):
            for rows in args.rows:
                line = json.dumps({**measure(rows, emb_dtype, softcap, args.runs), **context})
                print(line, flush=True)
                if args.out:
                    args.out.parent.mkdir(parents=True, exist_ok=True)
                    with args.out.open("a") as f:
                        f.write(line + "\n")


if __name__ == "__main__":
    main()
