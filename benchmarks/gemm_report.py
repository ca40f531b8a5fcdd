"""gemm_bench.py's report: gemm.md's tables from its JSON lines (prism against XLA's int8 and
bf16 dots and cuBLASLt; every forced kernel; kernel times under --device-time)."""

from __future__ import annotations


def table(rows: list[dict]) -> str:
    by = {}
    for r in rows:
        if "shape" in r and "median_us" in r:
            by.setdefault((r["shape"], r["M"]), {})[r["impl"]] = r

    def tops(r):
        return f"{r['tops']:.0f}" if r else "n/a"

    def ratio(a, b):
        return f"{a['tops'] / b['tops']:.2f}x" if a and b else "n/a"

    lines = [
        "| shape | M | prism µs median (min-max) | prism TOP/s | prism weight TB/s | XLA int8 TOP/s"
        " | XLA bf16 TFLOP/s | cuBLASLt TOP/s | prism / cuBLASLt | prism / XLA int8"
        " | fastest forced kernel |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (shape, m), d in by.items():
        p = d.get("prism")
        if p is None:
            continue
        forced = {k.split(":", 1)[1]: v for k, v in d.items() if k.startswith("prism:")}
        best = min(forced.items(), key=lambda kv: kv[1]["median_us"]) if forced else None
        lines.append(
            f"| {shape} | {m} | {p['median_us']:.1f} ({p['min_us']:.1f}-{p['max_us']:.1f})"
            f" | {p['tops']:.0f} | {p['weight_tbps']:.2f} | {tops(d.get('xla_int8'))}"
            f" | {tops(d.get('xla_bf16'))} | {tops(d.get('cublaslt'))}"
            f" | {ratio(p, d.get('cublaslt'))} | {ratio(p, d.get('xla_int8'))}"
            f" | {f'{best[0]} ({best[1]["tops"]:.0f} TOP/s)' if best else '-'} |"
        )
    return "\n".join(lines) + "\n"


def forced_table(rows: list[dict]) -> str:
    """Every forced kernel's median TOP/s (weight TB/s at M <= 16) per shape and M."""
    by, names = {}, []
    for r in rows:
        if "median_us" in r and r.get("impl", "").startswith("prism"):
            by.setdefault((r["shape"], r["M"]), {})[r["impl"]] = r
            if r["impl"] not in names:
                names.append(r["impl"])
    names.sort(key=lambda v: (v != "prism", v))
    lines = ["| shape | M | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for (shape, m), d in by.items():
        if len(d) < 2:
            continue
        cells = []
        for v in names:
            r = d.get(v)
            cells.append(
                ""
                if r is None
                else f"{r['tops']:.0f}"
                if m > 16
                else f"{r['weight_tbps']:.2f} TB/s"
            )
        lines.append(f"| {shape} | {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def forced_device_table(rows: list[dict]) -> str:
    """Every forced kernel's kernel time (µs, --device-time) per shape and M; "" without it."""
    by, names = {}, []
    for r in rows:
        if "device_us" in r and r.get("impl", "").startswith("prism"):
            by.setdefault((r["shape"], r["M"]), {})[r["impl"]] = r["device_us"]
            names += [] if r["impl"] in names else [r["impl"]]
    names.sort(key=lambda v: (v != "prism", v))
    lines = ["| shape | M | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for (shape, m), d in by.items():
        if len(d) > 1:
            cells = [f"{d[v]:.1f}" if v in d else "" for v in names]
            lines.append(f"| {shape} | {m} | " + " | ".join(cells) + " |")
    if len(lines) == 2:
        return ""
    return "\n## Forced kernels, kernel time (µs, --device-time)\n\n" + "\n".join(lines) + "\n"


def device_table(rows: list[dict]) -> str:
    """Kernel time per op (--device-time) against cuBLASLt's CUDA-event time; "" without it."""
    by = {}
    for r in rows:
        if "shape" in r and ("device_us" in r or r.get("impl") == "cublaslt"):
            by.setdefault((r["shape"], r["M"]), {})[r["impl"]] = r
    lines = [
        "| shape | M | prism kernel µs | TOP/s | weight TB/s | XLA int8 kernel µs | XLA int8 TOP/s"
        " | cuBLASLt µs (events) | prism / cuBLASLt |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for (shape, m), d in by.items():
        p, x, c = d.get("prism"), d.get("xla_int8"), d.get("cublaslt")
        if p is None or "device_us" not in p:
            continue
        xs = f"{x['device_us']:.1f} | {x['device_tops']:.0f}" if x else "n/a | n/a"
        cs = (
            f"{c['median_us']:.1f} | {c['median_us'] / p['device_us']:.2f}x"
            if c and "median_us" in c
            else "n/a | n/a"
        )
        lines.append(
            f"| {shape} | {m} | {p['device_us']:.1f} | {p['device_tops']:.0f}"
            f" | {p['device_weight_tbps']:.2f} | {xs} | {cs} |"
        )
    if len(lines) == 2:
        return ""
    return (
        "\n## Kernel time (--device-time: every kernel of 3 traced runs / 3 R; no host dispatch"
        " or launch gaps)\n\n" + "\n".join(lines) + "\n"
    )


def markdown(rows: list[dict], command: str) -> str:
    meta = next((r["meta"] for r in rows if "meta" in r), {})
    copy = next((r for r in rows if r.get("impl") == "xla_copy"), None)
    runs = next((r["runs"] for r in rows if "runs" in r), "?")
    head = (
        f"# int8 GEMM on {meta.get('device')} ({meta.get('date')}, jax {meta.get('jax')})\n\n"
        f"`{command}`\n\nMedian over {runs} timed runs after warm-up (per-op time of a run of R "
        "calls, each on its own inputs). TOP/s = 2·M·N·K / t; weight TB/s = N·K bytes / t. "
    )
    if copy:
        head += f"XLA copy in this run: {copy['tbps']:.2f} TB/s (read + written bytes). "
    return (
        head + "\n\n" + table(rows) + "\n## Forced kernels (prism = the dispatch at run time)"
        "\n\nTOP/s, or weight TB/s at M <= 16.\n\n"
        + forced_table(rows)
        + forced_device_table(rows)
        + device_table(rows)
    )
