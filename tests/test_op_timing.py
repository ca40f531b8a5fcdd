"""benchmarks/op_timing.py: how a kernel time per op is derived from traced runs, and how many
ops a timed run applies."""

import pathlib
import sys

import jax.numpy as jnp
import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
import op_timing  # noqa: E402


def test_device_time_divides_traced_kernel_time_by_runs_and_reps():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    def traced(kernels: dict[str, float], source: str):
        return lambda _dir: (kernels, {}, source)

    reps = 5
    got = op_timing.device_time(fn, (jnp.ones(4),), reps, traced({"a": 2e6, "b": 1e6}, "gpu"))
    assert got == pytest.approx(3e6 * 1e-9 / (op_timing.DEVICE_RUNS * reps))
    assert len(calls) == 1 + op_timing.DEVICE_RUNS  # a warm-up call, then the traced runs
    assert op_timing.device_time(fn, (jnp.ones(4),), reps, traced({"t": 5.0}, "cpu")) is None


def test_reps_for_sizes_a_run_to_the_target_within_bounds():
    assert op_timing.reps_for(op_timing.TARGET_RUN_S / 20) == 20
    assert op_timing.reps_for(1.0) == 8  # slow ops: still 8 a run
    assert op_timing.reps_for(1e-9) == op_timing.MAX_REPS  # fast ops: capped


def test_stats_are_microseconds_per_op():
    got = op_timing.stats([3e-6, 1e-6, 2e-6])
    assert got == pytest.approx({"median_us": 2.0, "min_us": 1.0, "max_us": 3.0, "runs": 3})
