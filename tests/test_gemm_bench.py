"""benchmarks/gemm_bench.py: the CPU smoke run (--platform cpu --shapes tiny; its timings are not
results) writes a line per implementation and forced variant, names what XLA compiled its int8
dot to, and parses the forced variants' tile orders."""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gemm_bench.py"
sys.path.insert(0, str(ROOT / "benchmarks"))
import gemm_bench  # noqa: E402
import gemm_report  # noqa: E402


def test_forced_env_names_kernel_and_tile_order():
    assert gemm_bench.forced_env("sm90_coop_128x256x128_c2x1") == {
        "PRISM_INT8_GEMM_KERNEL": "sm90_coop_128x256x128_c2x1"
    }
    assert gemm_bench.forced_env("sm90_coop_128x192x128_c2x1@n4") == {
        "PRISM_INT8_GEMM_KERNEL": "sm90_coop_128x192x128_c2x1",
        "PRISM_INT8_GEMM_RASTER": "n",
        "PRISM_INT8_GEMM_SWIZZLE": "4",
    }
    with pytest.raises(AssertionError, match="tile order"):
        gemm_bench.forced_env("sm90_coop_128x256x128_c2x1@x4")


def test_forced_env_names_a_decomposition():
    assert gemm_bench.forced_env("sm90_streamk_128x128x128_c2x1@m4+k3") == {
        "PRISM_INT8_GEMM_KERNEL": "sm90_streamk_128x128x128_c2x1",
        "PRISM_INT8_GEMM_RASTER": "m",
        "PRISM_INT8_GEMM_SWIZZLE": "4",
        "PRISM_INT8_GEMM_DECOMP": "k3",
    }
    assert gemm_bench.forced_env("sm90_streamk_128x256x128_c2x1+s") == {
        "PRISM_INT8_GEMM_KERNEL": "sm90_streamk_128x256x128_c2x1",
        "PRISM_INT8_GEMM_DECOMP": "s",
    }
    with pytest.raises(AssertionError, match="decomposition"):
        gemm_bench.forced_env("sm90_streamk_128x256x128_c2x1+x")


def test_smoke_run_writes_every_implementation(tmp_path):
    kernels = "simt,sm90_coop_128x256x128_c2x1@m2"
    args = ["--platform", "cpu", "--shapes", "tiny", "--ms", "8", "--runs", "2", "--no-torch",
            "--sweep", "--kernels", kernels, "--device-time", "--out", str(tmp_path)]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "gemm.jsonl").read_text().splitlines()]
    impls = {r.get("impl") for r in rows if "median_us" in r}
    assert impls == {"prism", "prism:simt", "prism:sm90_coop_128x256x128_c2x1@m2", "xla_int8",
                     "xla_bf16", "xla_copy"}  # fmt: skip
    xla = next(r for r in rows if r.get("impl") == "xla_int8")
    assert isinstance(xla["xla_kernel"], str) and xla["xla_kernel"]
    assert all(r["median_us"] > 0 for r in rows if "median_us" in r)
    # --device-time on the CPU: no kernels in the trace, so no kernel time and no such table.
    assert not any("device_us" in r for r in rows)
    table = (tmp_path / "gemm.md").read_text()
    assert "| tiny | 8 |" in table and "sm90_coop_128x256x128_c2x1@m2" in table
    assert "## Kernel time" not in table


def test_device_table_against_cublaslt_events():
    base = {"shape": "qkv", "M": 64, "N": 8192, "K": 5376}
    rows = [
        {**base, "impl": "prism", "median_us": 30.0, "device_us": 15.0, "device_tops": 376.0,
         "device_weight_tbps": 2.94},
        {**base, "impl": "xla_int8", "median_us": 31.0, "device_us": 16.0, "device_tops": 352.0,
         "device_weight_tbps": 2.75},
        {**base, "impl": "cublaslt", "median_us": 22.5},
    ]  # fmt: skip
    table = gemm_report.device_table(rows)
    assert "| qkv | 64 | 15.0 | 376 | 2.94 | 16.0 | 352 | 22.5 | 1.50x |" in table
    assert gemm_report.device_table([r for r in rows if r["impl"] == "cublaslt"]) == ""
