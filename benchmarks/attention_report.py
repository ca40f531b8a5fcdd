"""attention.md from attention_bench.py's rows (one JSON object per measurement)."""

from __future__ import annotations


def _f(x, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "-" if x is None else format(x * scale, fmt)


def _ceilings(rows: list[dict]) -> str:
    by = {r["impl"]: r for r in rows if r.get("impl", "").startswith(("xla_copy", "xla_matmul"))}
    parts = []
    if "xla_copy" in by:
        parts.append(f"copy {by['xla_copy']['tbps']:.2f} TB/s (read + written)")
    for name, r in by.items():
        if name.startswith("xla_matmul"):
            parts.append(f"{name} {r['n']}^3: {r['tflops']:.1f} TFLOP/s")
    return "Ceilings measured in this run: " + "; ".join(parts) + "."


def _main_table(rows: list[dict]) -> list[str]:
    xla = {
        (r["scenario"], r["kv_dtype"], r["window"]): r for r in rows if r.get("impl") == "xla_dense"
    }
    cols = (
        "scenario, KV, window, tokens (step), keys seen, KV MB read, prism µs median (min-max),"
        " TFLOP/s, of bf16 mm, of f32 mm, TB/s, of copy, XLA dense µs, XLA / prism,"
        " layer GEMM µs, attn / GEMM"
    ).split(", ")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        if r.get("impl") != "prism":
            continue
        head = f"| {r['scenario']} | {r['kv_dtype']} | {r['window'] or 'global'}"
        head += f" | {r['tokens']} ({r['step_tokens']}) | {r['keys_attended']:,}"
        head += f" | {r['kv_bytes'] / 1e6:.1f}"
        if "skipped" in r:
            lines.append(head + f" | skipped: {r['skipped']} |" + " |" * 9)
            continue
        x = xla.get((r["scenario"], r["kv_dtype"], r["window"]), {})
        xla_us = x.get("median_us")
        xla_cell = _f(xla_us) if xla_us else f"skipped ({x.get('skipped', '?')[:40]})"
        lines.append(
            head + f" | {r['median_us']:.1f} ({r['min_us']:.1f}-{r['max_us']:.1f})"
            f" | {r['tflops']:.2f} | {_f(r.get('of_bf16_mm'), '.1%')}"
            f" | {_f(r.get('of_f32_mm'), '.1%')} | {r['tbps']:.3f} | {_f(r.get('of_copy'), '.1%')}"
            f" | {xla_cell} | {_f(xla_us and xla_us / r['median_us'], '.2f')}x"
            f" | {_f(r.get('layer_gemm_us'))} | {_f(r.get('attn_over_layer_gemm'), '.2f')} |"
        )
    return lines


def _whole_table(rows: list[dict]) -> list[str]:
    lines = [
        "| state | KV | window | chunks | keys seen | attention ms (estimate) | TFLOP/s"
        " | layer GEMM ms (all chunks) | attn / GEMM | how |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if r.get("impl") == "prism_estimate":
            lines.append(
                f"| {r['scenario']} | {r['kv_dtype']} | {r['window'] or 'global'} | {r['chunks']}"
                f" | {r['keys_attended']:,} | {r['estimate_us'] / 1e3:.2f} | {r['tflops']:.2f}"
                f" | {_f(r.get('layer_gemm_us'), '.2f', 1e-3)}"
                f" | {_f(r.get('attn_over_layer_gemm'), '.2f')} | {r['how']} |"
            )
    return lines


def markdown(rows: list[dict], command: str) -> str:
    meta = next((r["meta"] for r in rows if "meta" in r), {})
    runs = next((r["runs"] for r in rows if r.get("impl") == "prism" and "runs" in r), "?")
    head = [
        f"# tree_attention on {meta.get('device')} ({meta.get('date')}, jax {meta.get('jax')},"
        f" commit {meta.get('commit')}{', QUICK smoke shapes' if meta.get('quick') else ''})",
        "",
        f"`{command}`",
        "",
        f"Shapes {meta.get('shapes')}, page size {meta.get('page_size')}. Per-call time: median"
        f" (min-max) over up to {runs} timed runs of R calls threading the donated pools."
        " FLOPs = 4·N·H·(unmasked keys); bytes = KV rows read once + q/out + new k/v."
        " XLA dense = jax.nn.dot_product_attention(implementation='xla') on contiguous K/V"
        " with the step's mask (it computes masked keys too). Layer GEMM = one 27B layer's"
        f" int8 GEMMs (qkv, o, gate_up, down) at M = the step's token bucket, from"
        f" {meta.get('gemm_source')} (prism medians, linear in M between measured M).",
        "",
        _ceilings(rows),
        "",
    ]
    body = _main_table(rows) + ["", "## Whole-state prefill", ""] + _whole_table(rows)
    return "\n".join(head + body) + "\n"
