"""CUDA vs CPU for every custom call on fresh random inputs at model-sized shapes.

Prints one JSON line per check and a short table: integer parts equal (int8_gemm), largest
float difference, and whether row invariance holds bitwise on the GPU (a row alone vs the
same row among 300 others). Run by benchmarks/gpu_suite.sh on the H200.
"""

from __future__ import annotations

import argparse
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from prism_jax import ops


def on(device, fn, *args, **kw):
    placed = [jax.device_put(a, device) for a in args]
    with jax.default_device(device):
        return jax.tree.map(np.asarray, jax.jit(lambda *a: fn(*a, **kw))(*placed))


def max_diff(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    finite = np.isfinite(a) & np.isfinite(b)
    assert np.array_equal(np.isfinite(a), np.isfinite(b)), "non-finite entries differ"
    return float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))


def same_bits(a, b) -> bool:
    return all(
        np.array_equal(
            np.asarray(x).reshape(-1).view(np.uint8), np.asarray(y).reshape(-1).view(np.uint8)
        )
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True)
    )


def row_invariant(gpu, fn, rows, shared, index=157) -> bool:
    """Row 0 of `rows` computed alone vs placed at `index` among 300 other rows."""
    alone = on(gpu, fn, *[r[:1] for r in rows], *shared)
    big = [np.concatenate([r[1 : index + 1], r[:1], r[index + 1 : 301]]) for r in rows]
    batched = on(gpu, fn, *big, *shared)
    return same_bits(
        [x[0] for x in jax.tree.leaves(alone)], [x[index] for x in jax.tree.leaves(batched)]
    )


def bf16(rng, shape, scale=1.0):
    return np.asarray(jnp.asarray(rng.normal(0, scale, shape).astype(np.float32), jnp.bfloat16))


def checks(rng, gpu, cpu):
    """Every op's rows, in order: the int8 GEMM, the norms, the gated activation, the head."""
    yield from gemm_checks(rng, gpu, cpu)
    yield from norm_checks(rng, gpu, cpu)
    yield from glu_checks(rng, gpu, cpu)
    yield from head_checks(rng, gpu, cpu)


def gemm_checks(rng, gpu, cpu):
    """int8_gemm on 27B shapes (qkv and down), M = 1 and 301."""
    for n, k in ((8192, 5376), (5376, 21504)):
        w = rng.integers(-127, 128, (n, k), dtype=np.int8)
        s_w = rng.uniform(1e-3, 1e-2, n).astype(np.float32)
        for m in (1, 301):
            x = rng.integers(-127, 128, (m, k), dtype=np.int8)
            ones = np.ones(m, np.float32)
            g = on(gpu, ops.int8_gemm, x, ones, w, np.ones(n, np.float32))
            exact = (x.astype(np.int64) @ w.astype(np.int64).T).astype(np.float32)
            s_x = rng.uniform(1e-3, 1e-2, m).astype(np.float32)
            yg = on(gpu, ops.int8_gemm, x, s_x, w, s_w, out_dtype=jnp.bfloat16)
            yc = on(cpu, ops.int8_gemm, x, s_x, w, s_w, out_dtype=jnp.bfloat16)
            inv = m == 301 and row_invariant(
                gpu, lambda a, b, w, s: ops.int8_gemm(a, b, w, s), [x, s_x], [w, s_w]
            )
            exact_int = bool(np.array_equal(g, exact))
            yield dict(
                op="int8_gemm",
                shape=f"M={m} N={n} K={k}",
                int_exact=exact_int,
                cuda_vs_cpu=max_diff(yg.astype(np.float32), yc.astype(np.float32)),
                bitwise_vs_cpu=same_bits(yg, yc),
                row_invariant=inv if m == 301 else None,
            )


def norm_checks(rng, gpu, cpu):
    """rmsnorm and add_rmsnorm_quant on 301 bf16 rows of the 27B's D."""
    d = 5376
    x, r = bf16(rng, (301, d)), bf16(rng, (301, d), 4.0)
    gamma = rng.normal(0, 0.5, d).astype(np.float32)
    for name, fn, args in (
        ("rmsnorm", lambda a, b, g: ops.rmsnorm(a, g, eps=1e-6, weight_offset=1.0), (x, r)),
        (
            "add_rmsnorm_quant",
            lambda a, b, g: ops.add_rmsnorm_quant(a, b, g, eps=1e-6, weight_offset=1.0),
            (x, r),
        ),
    ):
        og, oc = on(gpu, fn, *args, gamma), on(cpu, fn, *args, gamma)
        diff = max(
            max_diff(np.asarray(a, np.float32), np.asarray(b, np.float32))
            for a, b in zip(jax.tree.leaves(og), jax.tree.leaves(oc), strict=True)
        )
        yield dict(
            op=name,
            shape=f"M=301 D={d} bf16",
            cuda_vs_cpu=diff,
            bitwise_vs_cpu=same_bits(og, oc),
            row_invariant=row_invariant(gpu, fn, list(args), [gamma]),
        )


def glu_checks(rng, gpu, cpu):
    """glu_quant on 301 bf16 rows of the 27B's F, both activations."""
    f = 21504
    g_, u_ = bf16(rng, (301, f), 2.0), bf16(rng, (301, f), 2.0)
    for act in ("gelu_tanh", "silu"):

        def glu(a, b, act=act):
            return ops.glu_quant(a, b, activation=act)

        (qg, sg), (qc, sc) = on(gpu, glu, g_, u_), on(cpu, glu, g_, u_)
        yield dict(
            op=f"glu_quant[{act}]",
            shape=f"M=301 F={f} bf16",
            cuda_vs_cpu=float(np.abs(qg.astype(np.int32) - qc).max()),
            bitwise_vs_cpu=same_bits((qg, sg), (qc, sc)),
            row_invariant=row_invariant(gpu, glu, [g_, u_], []),
        )


def head_checks(rng, gpu, cpu):
    """candidate_head and vocab_logsumexp on 301 rows of the 27B's vocabulary."""
    d, v, c = 5376, 262_208, 16
    emb = bf16(rng, (v, d), 0.02)
    h = bf16(rng, (301, d))
    ids = rng.integers(0, v, (301, c)).astype(np.int32)
    counts = rng.integers(1, c + 1, 301).astype(np.int32)

    def head(hh, ii, kk, e):
        return ops.candidate_head(hh, e, ii, kk)

    og, oc = on(gpu, head, h, ids, counts, emb), on(cpu, head, h[:32], ids[:32], counts[:32], emb)
    yield dict(
        op="candidate_head",
        shape=f"R=301 C={c} D={d} V={v}",
        cuda_vs_cpu=max_diff(og[1][:32], oc[1]),
        bitwise_vs_cpu=same_bits(og[0][:32], oc[0]),
        row_invariant=row_invariant(gpu, head, [h, ids, counts], [emb]),
    )
    lg = on(gpu, lambda hh, e: ops.vocab_logsumexp(hh, e), h, emb)
    lc = on(cpu, lambda hh, e: ops.vocab_logsumexp(hh, e), h[:8], emb)
    yield dict(
        op="vocab_logsumexp",
        shape=f"R=301 D={d} V={v}",
        cuda_vs_cpu=max_diff(lg[:8], lc),
        bitwise_vs_cpu=same_bits(lg[:8], lc),
        row_invariant=row_invariant(gpu, lambda hh, e: ops.vocab_logsumexp(hh, e), [h], [emb]),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", help="write the JSON lines here too")
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else int(np.random.SeedSequence().entropy % 2**32)
    rng = np.random.default_rng(seed)
    gpu, cpu = jax.devices("gpu")[0], jax.devices("cpu")[0]
    print(f"# device {gpu.device_kind}, seed {seed}")
    rows = []
    for row in checks(rng, gpu, cpu):
        row["device"] = gpu.device_kind
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows)
    print(
        f"\n{'op':24} {'shape':30} {'int exact':>9} {'max |cuda-cpu|':>15} {'bitwise':>8} "
        f"{'row inv.':>8}"
    )
    for r in rows:
        print(
            f"{r['op']:24} {r['shape']:30} {str(r.get('int_exact', '-')):>9} "
            f"{r['cuda_vs_cpu']:>15.3g} {str(r['bitwise_vs_cpu']):>8} "
            f"{str(r['row_invariant']):>8}"
        )
    bad = [r for r in rows if r.get("int_exact") is False or r["row_invariant"] is False]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
