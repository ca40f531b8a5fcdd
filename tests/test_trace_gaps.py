"""benchmarks/trace_gaps.py: idle gaps between kernels, split into steps, charged to op pairs."""

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "benchmarks"))
from trace_gaps import bounds_rows, gap_rows  # noqa: E402

US = 1e3  # ns


def test_gaps_split_steps_and_charge_pairs():
    # Two steps of one run each: [gemm 0-10us][gap 4][norm 14-16][gap 30][attention 46-60],
    # a 5 ms pause, then [gemm][gap 4][norm]; attention overlaps a fusion on another stream.
    events = [
        (0 * US, 10 * US, "cutlass_gemm_kernel"),
        (14 * US, 16 * US, "prism::NormSplitRowsKernel"),
        (46 * US, 60 * US, "prism::block::BlockAttendKernel"),
        (50 * US, 62 * US, "loop_add_fusion"),
        (5062 * US, 5072 * US, "cutlass_gemm_kernel"),
        (5076 * US, 5078 * US, "prism::NormSplitRowsKernel"),
    ]
    rows = gap_rows(events, runs=2, split_ns=1000 * US)
    head = rows[0]
    assert head["kind"] == "gaps"
    assert head["span_ms"] == pytest.approx((62 + 16) * 1e-3 / 2)
    assert head["busy_ms"] == pytest.approx((10 + 2 + 16 + 10 + 2) * 1e-3 / 2)
    assert head["idle_ms"] == pytest.approx((4 + 30 + 4) * 1e-3 / 2)
    pairs = {(r["after_op"], r["before_op"]): r for r in rows if r["kind"] == "gap_pair"}
    assert pairs[("rmsnorm_quant", "tree_attention")]["ms_per_run"] == pytest.approx(0.015)
    assert pairs[("int8_gemm", "rmsnorm_quant")]["count_per_run"] == 1
    assert pairs[("int8_gemm", "rmsnorm_quant")]["mean_us"] == pytest.approx(4)
    assert head["hist"]["<5us"]["count_per_run"] == 1
    assert head["hist"]["<50us"]["count_per_run"] == 0.5


def test_no_kernels_says_so():
    assert gap_rows([], runs=1, split_ns=1e6)[0]["source"] == "none"


def test_run_bounds_measure_host_time_around_the_kernels():
    events = [(10 * US, 20 * US, "a"), (25 * US, 30 * US, "b"), (110 * US, 120 * US, "c")]
    (row,) = bounds_rows(events, [(0, 40 * US), (100 * US, 150 * US)])
    assert row["runs"] == 2
    assert row["lead_ms"] == pytest.approx((10 + 10) / 2 * 1e-3)
    assert row["tail_ms"] == pytest.approx((10 + 30) / 2 * 1e-3)
    assert row["wall_ms"] == pytest.approx((40 + 50) / 2 * 1e-3)
    assert bounds_rows(events, [(200 * US, 300 * US)]) == []


def test_top_gaps_place_the_largest_gaps_in_their_step():
    events = [
        (0 * US, 10 * US, "cutlass_gemm_kernel"),
        (14 * US, 16 * US, "prism::NormSplitRowsKernel"),
        (46 * US, 60 * US, "prism::block::BlockAttendKernel"),
        (5060 * US, 5070 * US, "cutlass_gemm_kernel"),
        (5170 * US, 5172 * US, "prism::NormSplitRowsKernel"),
    ]
    tops = [r for r in gap_rows(events, runs=2, split_ns=1000 * US) if r["kind"] == "top_gap"]
    assert [r["gap_us"] for r in tops] == pytest.approx([100, 30, 4])
    assert [r["step"] for r in tops] == [1, 0, 0]
    assert tops[0]["at_ms"] == pytest.approx(0.010)  # 10 us after step 1's first kernel
    assert tops[1]["at_ms"] == pytest.approx(0.016)
    assert (tops[1]["after_op"], tops[1]["before_op"]) == ("rmsnorm_quant", "tree_attention")
    assert tops[0]["before_kernel"] == "prism::NormSplitRowsKernel"
