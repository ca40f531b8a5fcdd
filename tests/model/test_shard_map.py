"""Every op wrapper the model uses works under jax.shard_map (rows sharded over 4 fake CPU
devices) with bitwise the unsharded results. Runs tests/model/shard_map_ops.py in a
subprocess: the device count is fixed when jax initialises, so it cannot change in this one."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.model.tiny import ROOT


def test_ops_under_shard_map_are_bitwise_unsharded(rng):
    env = dict(os.environ)
    env["XLA_FLAGS"] = (
        env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=4"
    ).strip()
    env["JAX_PLATFORMS"] = "cpu"
    seed = str(int(rng.integers(1 << 31)))
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model.shard_map_ops", seed],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), (
        f"shard_map check failed (seed {seed}):\n{proc.stdout}\n{proc.stderr[-4000:]}"
    )
