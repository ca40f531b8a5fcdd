"""The offline Bazel build (WORKSPACE, BUILD, bazel/) yields a working prism_jax._prism_ops.

Builds //:prism_ops CPU-only, checks that Bazel compiled the same source list as CMakeLists.txt
(both read cc/sources.txt) and imports the extension in the interpreter Bazel built it for.
Where nvcc is found, the CUDA build is analysed whole (every nvcc action and the cudart link
resolved) and one CUDA source is compiled by Bazel's nvcc rule. Compiling all of them again
here cost ~17 of CI's 30 minutes on 2 cores; `make build` (CMake) already compiles every CUDA
source with the same flags (bazel/cuda.bzl mirrors CMakeLists.txt), and
tests/test_build_flags.py keeps the two flag lists equal.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.test_extension import TARGETS  # every handler the extension registers

ROOT = Path(__file__).resolve().parents[1]
BUILD_TIMEOUT_S = 10 * 60  # a cold CPU-only build; CUTLASS kernels are not compiled here
# The CUDA source Bazel compiles for real: small, no CUTLASS, every include root but CUTLASS's.
PROBE_CUDA_SOURCE = "cc/ops/quantize_rows_cuda.cu"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bazel") is None, reason="bazel is not on PATH"),
]


def _bazel(*args: str, timeout: float = 120) -> str:
    try:
        proc = subprocess.run(
            ["bazel", *args],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else e.stdout
        pytest.fail(f"bazel {' '.join(args)} ran past {timeout:.0f} s:\n{(out or '')[-8000:]}")
    if proc.returncode != 0:
        pytest.fail(f"bazel {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-8000:]}")
    return proc.stdout


def _read_bzl(path: Path) -> dict:
    """The NAME = literal assignments of a generated .bzl (Starlark literals are Python's)."""
    values = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign):
            values[node.targets[0].id] = ast.literal_eval(node.value)
    return values


def _cmake_sources() -> dict[str, list[str]]:
    """cc/sources.txt read the way CMakeLists.txt reads it (same regexes)."""
    srcs: dict[str, list[str]] = {"module": [], "cpu": [], "cuda": []}
    for line in (ROOT / "cc" / "sources.txt").read_text().splitlines():
        if re.match(r"[a-z]", line):
            kind, path = re.match(r"([a-z]+)[ \t]+([^ \t]+)", line).groups()
            srcs[kind].append(path)
    return srcs


def _cuda_expected() -> bool:
    """bazel/prism_config.bzl's rule: nvcc under CUDA_PATH or /usr/local/cuda, unless PRISM_CUDA
    turns it off."""
    if os.environ.get("PRISM_CUDA", "").lower() in ("0", "off", "false", "no"):
        return False
    cuda = os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    return (Path(cuda) / "bin" / "nvcc").exists()


def _bazel_paths() -> dict[str, Path]:
    info = _bazel("info", "bazel-bin", "output_base")
    paths = dict(line.split(": ", 1) for line in info.splitlines())
    return {
        "bin": Path(paths["bazel-bin"]),
        "config": Path(paths["output_base"]) / "external" / "prism_config",
    }


@pytest.fixture(scope="module")
def built() -> dict:
    # --repo_env reaches the @prism_config rule (bazel/prism_config.bzl reads PRISM_CUDA).
    _bazel("build", "--repo_env=PRISM_CUDA=0", "//:prism_ops", timeout=BUILD_TIMEOUT_S)
    paths = _bazel_paths()
    return {
        "so": paths["bin"] / "_prism_ops.so",
        "config": _read_bzl(paths["config"] / "config.bzl"),
        "sources": _read_bzl(paths["config"] / "sources.bzl"),
    }


def test_bazel_compiles_cmakes_source_list(built):
    cmake = _cmake_sources()
    assert cmake["module"] and cmake["cpu"], "cc/sources.txt lists no module/cpu sources"
    assert built["sources"] == {
        "MODULE_SRCS": cmake["module"],
        "CPU_SRCS": cmake["cpu"],
        "CUDA_SRCS": cmake["cuda"],
    }


def test_extension_imports_and_registers_every_target(built, tmp_path):
    assert built["so"].is_file(), f"bazel built no {built['so']}"
    package = tmp_path / "prism_jax"
    package.mkdir()
    (package / "__init__.py").write_text("")
    shutil.copy(built["so"], package / "_prism_ops.so")
    script = textwrap.dedent(
        f"""
        import json, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from prism_jax import _prism_ops as m
        assert m.__file__.startswith({str(tmp_path)!r}), m.__file__
        regs = {{platform: sorted(fns) for platform, fns in m.registrations().items()}}
        print(json.dumps({{"with_cuda": m.with_cuda, "registrations": regs}}))
        """
    )
    # The interpreter whose headers Bazel compiled against (bazel/prism_config.bzl); -I -S
    # keep an installed prism_jax (and its editable-install import hooks) out of the way.
    proc = subprocess.run(
        [built["config"]["PYTHON"], "-I", "-S", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, f"import failed:\n{proc.stdout}\n{proc.stderr}"
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    regs = result["registrations"]

    assert built["config"]["CUDA_ENABLED"] is False, "PRISM_CUDA=0 did not reach @prism_config"
    assert set(regs) == {"cpu"}, f"a CPU-only build registered {sorted(regs)}"
    assert set(regs["cpu"]) == TARGETS
    assert result["with_cuda"] is False


# Last in the file: it re-runs @prism_config with the environment's own CUDA setting, after
# the CPU-only extension above was imported.
def test_cuda_detected_analysed_and_compiled(built):
    _bazel("build", "--nobuild", "//:prism_ops", timeout=BUILD_TIMEOUT_S)
    paths = _bazel_paths()
    config = _read_bzl(paths["config"] / "config.bzl")
    assert config["CUDA_ENABLED"] == _cuda_expected(), config
    if not config["CUDA_ENABLED"]:
        return
    assert (paths["config"] / "cutlass" / "include" / "cutlass" / "cutlass.h").is_file()
    stem = Path(PROBE_CUDA_SOURCE).stem
    assert PROBE_CUDA_SOURCE in _cmake_sources()["cuda"], f"{PROBE_CUDA_SOURCE} left cc/sources.txt"
    _bazel("build", f"//:_cuda_{stem}", timeout=BUILD_TIMEOUT_S)
    obj = paths["bin"] / "_cuda" / f"{stem}.pic.o"
    assert obj.is_file() and obj.stat().st_size > 0, f"Bazel's nvcc rule wrote no {obj}"
