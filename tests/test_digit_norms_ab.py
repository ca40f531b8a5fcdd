"""benchmarks/digit_norms_ab.py: its "old" two-digit norms are the fused calls' computation
(same bits, two custom calls), and the A/B runs end to end at the tiny preset on the CPU."""

import json
import pathlib
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import ops
from tests.conftest import assert_bitwise_equal

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import digit_norms_ab  # noqa: E402


def test_old_variant_is_the_fused_calls_bits(rng):
    x = jnp.asarray(rng.normal(0, 2, (5, 300)).astype(np.float32))
    res = jnp.asarray(rng.normal(0, 1, (5, 300)).astype(np.float32))
    g, xg = (jnp.asarray(rng.normal(0, 0.5, 300).astype(np.float32)) for _ in range(2))
    kw = dict(eps=1e-6, weight_offset=1.0, digits=2)
    pairs = [
        (digit_norms_ab.unfused_rmsnorm_quant(x, g, **kw), ops.rmsnorm_quant(x, g, **kw)),
        (
            digit_norms_ab.unfused_add_rmsnorm_quant(x, res, g, x_gamma=xg, **kw),
            ops.add_rmsnorm_quant(x, res, g, x_gamma=xg, **kw),
        ),
    ]
    for old, new in pairs:
        assert len(old) == len(new) >= 4
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            assert_bitwise_equal(a, b, f"output {i}")


@pytest.mark.parametrize("variant", ["old", "new"])
def test_ab_runs_end_to_end(tmp_path, variant):
    proc = subprocess.run(
        [sys.executable, "digit_norms_ab.py", variant, "--preset", "tiny", "--runs", "2",
         "--no-baseline", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT / "benchmarks",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = (tmp_path / "e2e.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    assert {r["scenario"] for r in rows} == {"one_question", "state_3_questions", "follow_up_4k"}
    assert all(r["prism"]["median_ms"] > 0 for r in rows)


def test_usage_is_explained():
    proc = subprocess.run(
        [sys.executable, "digit_norms_ab.py"], capture_output=True, text=True, timeout=120,
        cwd=ROOT / "benchmarks",
    )  # fmt: skip
    assert proc.returncode != 0 and "usage: digit_norms_ab.py old|new" in proc.stderr
