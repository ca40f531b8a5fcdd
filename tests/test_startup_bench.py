"""benchmarks/startup_bench.py on the CPU at the tiny preset, twice on one cache directory (a
smoke test of the script the H200 runs; its timings here are not results)."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "startup_bench.py"
BUCKETS = ["--token-buckets", "64", "--row-buckets", "1", "--candidate-buckets", "4,256"]


def run(out: pathlib.Path, cache: pathlib.Path) -> dict:
    cmd = [sys.executable, str(SCRIPT), "--preset", "tiny", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--cache", str(cache), *BUCKETS],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_cold_then_cached_start(tmp_path):
    cache = tmp_path / "cache"
    cold = run(tmp_path, cache)
    # forward 64; the last layer (64, 1); readout (1, 1, 4) and (1, 1, 256); lse (1, 1).
    count = {"forward": 1, "tail": 1, "readout": 2, "lse": 1}
    assert cold["executables"] == 5 and cold["count"] == count
    assert cold["total_s"] > 0
    warm = run(tmp_path, cache)
    # The weights' own jitted initialisation is cached too, so the cold count need not be 0.
    assert warm["cache_files_before"] > cold["cache_files_before"], "no bucket was cached"
    assert warm["executables"] == 5
    rows = [json.loads(x) for x in (tmp_path / "startup.jsonl").read_text().splitlines()]
    assert rows == [cold, warm]
