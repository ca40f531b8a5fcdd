"""benchmarks/ops_bandwidth.py: the CPU smoke run (--smoke: tiny shapes; its timings are not
results) prints one JSON line per (op, shape, forced variant) with bytes that match the op's
inputs and outputs, and renders the table against the copy ceiling."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "ops_bandwidth.py"
OPS = {"rmsnorm_quant", "add_rmsnorm_quant", "norm_add_rmsnorm_quant", "rmsnorm", "add_rmsnorm",
       "quantize_digits", "glu_quant_pair", "glu_quant2_pair", "glu_quant2_sum", "candidate_head",
       "vocab_logsumexp", "xla_copy_f32"}  # fmt: skip


def test_smoke_run_covers_every_op_and_forced_variant(tmp_path):
    args = ["--smoke", "--out", str(tmp_path), "--ms", "4,8", "--rows", "4", "--runs", "2",
            "--norm-kernels", "reg1", "--glu-caches", "off", "--head-kernels", "warp",
            "--device-time"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "ops_bandwidth.jsonl").read_text().splitlines()]
    assert {r["op"] for r in rows} == OPS
    # Forced variants at the smallest and largest M only, each its own row.
    forced = {(r["op"], r["M"]) for r in rows if r.get("kernel") in ("reg1", "cache off")}
    assert forced == {(op, m) for m in (4, 8) for op in
                      ("rmsnorm_quant", "add_rmsnorm_quant", "norm_add_rmsnorm_quant",
                       "glu_quant_pair", "glu_quant2_pair", "glu_quant2_sum")}  # fmt: skip
    heads = sorted(r["kernel"] for r in rows if r["op"] == "candidate_head")
    assert heads == ["default", "warp"]  # --head-kernels: a row per forced head kernel
    d = 512  # --smoke's D
    norm = next(r for r in rows if r["op"] == "rmsnorm_quant" and r["kernel"] == "default")
    assert norm["bytes"] == norm["M"] * d * 4 + d * 4 + norm["M"] * d + norm["M"] * 4
    fused = next(r for r in rows if r["op"] == "norm_add_rmsnorm_quant" and r["M"] == 8)
    x_bytes = 8 * d * 4  # reads x, residual and both gammas; writes h, codes and scales
    assert fused["bytes"] == 2 * x_bytes + 2 * d * 4 + x_bytes + 8 * d + 8 * 4
    digits = next(r for r in rows if r["op"] == "quantize_digits")
    assert digits["bytes"] == digits["M"] * d * 4 + 2 * (digits["M"] * d + digits["M"] * 4)
    assert all(r["median_us"] > 0 and r["tbps"] > 0 for r in rows)
    table = (tmp_path / "ops_bandwidth.md").read_text()
    assert "Copy ceiling" in table and "% of copy" in table
    assert table.count("\n| ") == len(rows) - 1 + 1  # a row per measurement but the copy, header


def test_render_adds_kernel_time_against_the_kernel_time_copy(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ops_bandwidth  # noqa: PLC0415

    rows = [
        {"op": "xla_copy_f32", "bytes": 2 << 30, "median_us": 600.0, "min_us": 590.0,
         "max_us": 610.0, "tbps": 3.5, "device_us": 560.0, "device_tbps": 4.0},
        {"op": "rmsnorm_quant", "M": 4096, "dtype": "float32", "kernel": "default", "bytes": 1,
         "median_us": 100.0, "min_us": 99.0, "max_us": 101.0, "tbps": 1.75, "device_us": 70.0,
         "device_tbps": 3.2},
    ]  # fmt: skip
    path = tmp_path / "ops_bandwidth.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = ops_bandwidth.render(path)
    assert "in kernel time 4.00 TB/s" in table
    assert "| 1.75 | 50 % | 70.0 | 3.20 | 80 % |" in table
    header, rule = table.splitlines()[2:4]
    assert header.count(" | ") + 1 == rule.count("---") == 10
