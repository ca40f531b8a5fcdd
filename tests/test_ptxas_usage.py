"""benchmarks/ptxas_usage.py: ptxas -v lines parsed per kernel, option flags stripped to match
the other checkout's names, and (where nvcc exists, as on CI) a real compile of a small source."""

import pathlib
import shutil
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ptxas_usage  # noqa: E402

LOG = """ptxas info    : Compiling entry function '_Z3fooILb1EEvv' for 'sm_90a'
ptxas info    : Function properties for _Z3fooILb1EEvv
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers
ptxas info    : Compiling entry function '_Z3barv' for 'sm_90a'
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 64 registers
"""


def test_usage_per_kernel():
    got = ptxas_usage.usage(LOG)
    names = sorted(got)
    assert len(names) == 2
    assert got[next(n for n in names if "foo" in n)] == (32, 8, 12)
    assert got[next(n for n in names if "bar" in n)] == (64, 0, 0)


def test_parameters_are_dropped_but_not_the_anonymous_namespace():
    name = "void prism::(anonymous namespace)::K<2>(char const*, long)"
    assert ptxas_usage.without_parameters(name) == "void prism::(anonymous namespace)::K<2>"


def test_base_name_strips_trailing_flags_at_the_top_level():
    name = "void prism::GluRowsKernel<prism::PairRows<float>, false, true, false>"
    base = "void prism::GluRowsKernel<prism::PairRows<float>, false>"
    assert ptxas_usage.base_name(name, 2) == base
    assert ptxas_usage.base_name(name, 0) == name
    mine = {name: (32, 0, 0)}
    other = {ptxas_usage.base_name(name, 2): (32, 8, 8)}
    assert "| no |" in ptxas_usage.table(mine, other, 2)


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="no nvcc on this machine")
def test_real_source_compiles_and_lists_its_kernel():
    got = ptxas_usage.usage(ptxas_usage.ptxas_log("cc/ops/vocab_logsumexp_cuda.cu", ROOT))
    assert any("VocabMergeKernel" in n for n in got), got
    assert all(regs > 0 for regs, _, _ in got.values())
