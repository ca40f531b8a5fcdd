"""`jevbench check` (PyPI jevbench) runs clean against the real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow


def test_jevbench_check_runs_clean(real_server):
    exe = Path(sys.executable).with_name("jevbench")
    r = subprocess.run(
        [str(exe), "check", "--url", real_server.url + "/v1/systemone", "--model", "default"],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "JEVBENCH_API_KEY": real_server.key},
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "jevbench check: OK" in r.stdout
