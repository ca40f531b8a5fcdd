"""CMake (CMakeLists.txt) and Bazel (bazel/cuda.bzl) compile CUDA sources with the same flags.

CI compiles every CUDA source once, with CMake; Bazel's nvcc rule compiles one of them
(tests/test_bazel_build.py). This keeps the two flag lists from drifting apart, which a
CPU-only machine would otherwise only notice through one source.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _split(flags: list[str]) -> set[str]:
    """Flags as a set, -Xcompiler=a,b as -Xcompiler=a and -Xcompiler=b."""
    out = set()
    for flag in flags:
        if flag.startswith("-Xcompiler="):
            out |= {f"-Xcompiler={f}" for f in flag.split("=", 1)[1].split(",")}
        else:
            out.add(flag)
    return out


def _cmake_cuda_flags() -> tuple[set[str], str]:
    """The CUDA compile options and the default architecture of CMakeLists.txt."""
    text = (ROOT / "CMakeLists.txt").read_text()
    options = re.findall(r"\$<\$<COMPILE_LANGUAGE:CUDA>:([^>]*)>", text)
    assert len(options) == 1, f"expected one CUDA option list in CMakeLists.txt, got {options}"
    arch = re.search(r'set\(PRISM_CUDA_ARCHS "([0-9a-z]+)"', text)
    assert arch, "CMakeLists.txt no longer sets PRISM_CUDA_ARCHS"
    return _split(options[0].split()), arch.group(1)


def _bazel_nvcc_flags() -> set[str]:
    tree = ast.parse((ROOT / "bazel" / "cuda.bzl").read_text())  # Starlark literals are Python's
    for node in tree.body:
        if isinstance(node, ast.Assign) and node.targets[0].id == "NVCC_FLAGS":
            return _split(ast.literal_eval(node.value))
    raise AssertionError("bazel/cuda.bzl defines no NVCC_FLAGS")


def test_bazel_nvcc_flags_hold_cmakes():
    cmake, arch = _cmake_cuda_flags()
    bazel = _bazel_nvcc_flags()
    assert cmake <= bazel, f"CMake compiles CUDA with {sorted(cmake - bazel)}; Bazel does not"
    # What CMake adds through properties rather than options.
    assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in bazel, (arch, sorted(bazel))
    assert {"-std=c++17", "-DPRISM_WITH_CUDA", "-Xcompiler=-fvisibility=hidden"} <= bazel


def test_bazel_nvcc_flags_add_nothing_numeric():
    """Bazel may add only what CMake sets through properties; a float flag (-use_fast_math,
    -fmad=true, -prec-div=false, ...) on one side would change the other side's bits."""
    cmake, _ = _cmake_cuda_flags()
    extra = _bazel_nvcc_flags() - cmake
    allowed = re.compile(
        r"^(-std=c\+\+17|-DPRISM_WITH_CUDA|-gencode=.*|-Xcompiler=-fvisibility=hidden)$"
    )
    assert all(allowed.match(f) for f in extra), f"Bazel-only nvcc flags: {sorted(extra)}"
