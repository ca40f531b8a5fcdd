"""benchmarks/occupancy_probe.py (what occupancy_ncu.sh runs under Nsight Compute): on the CPU
at tiny sizes it makes every call it names, each env setting in turn, in order."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "occupancy_probe.py"


def test_probe_makes_every_call_on_the_cpu():
    args = ["--m", "8", "--rows", "4", "--vocab", "300"]
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "rmsnorm_quant default: done",
        "rmsnorm_quant lean8: done",
        "add_rmsnorm_quant: done",
        "norm_add_rmsnorm_quant: done",
        "glu_quant_pair: done",
        "candidate_head default: done",
        "candidate_head warp: done",
    ]
