"""benchmarks/gemm_ncu.py: pairing Nsight Compute's rows with the cases, on a hand-made export."""

import csv
import io
import json
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gemm_ncu  # noqa: E402

HEADER = ["ID", "Kernel Name", "gpu__time_duration.sum", "dram__bytes_read.sum",
          "launch__grid_size"]  # fmt: skip
CUTLASS = "void cutlass::device_kernel<cutlass::gemm::kernel::GemmUniversal<int>>(T1::Params)"


def _export(path, launches, units=("nsecond", "byte")):
    """ncu --page raw --csv: a ==PROF== line, the header, the units row, one row per launch."""
    rows = [HEADER, ["", "", *units, ""]]
    rows += [[str(i), name, f"{ns:,}" if isinstance(ns, int) else ns, str(read), str(grid)]
             for i, (name, ns, read, grid) in enumerate(launches)]  # fmt: skip
    text = io.StringIO()
    csv.writer(text, quoting=csv.QUOTE_ALL).writerows(rows)
    path.write_text("==PROF== Connected to process 1\n" + text.getvalue())


def test_report_takes_each_cases_second_launch(tmp_path):
    cases = [{"shape": "o", "m": 64, "n": 5376, "k": 4096, "kernel": "dispatch"},
             {"shape": "o", "m": 64, "n": 5376, "k": 4096, "kernel": "decode32"}]  # fmt: skip
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    # warm-up launches are 10x slower: the report must read the second launch of each case
    _export(tmp_path / "raw.csv", [
        (CUTLASS, 110_100, 1, 84), (CUTLASS, 11_010, 22_020_096, 84),
        ("void prism::DecodeKernel<4, 8, 2, float>(int)", 80_000, 1, 168),
        ("void prism::DecodeKernel<4, 8, 2, float>(int)", 8_000, 24_000_000, 168),
    ])  # fmt: skip
    table = gemm_ncu.report(str(tmp_path / "raw.csv"), str(tmp_path / "cases.json"))
    lines = table.splitlines()
    assert len(lines) == 4, table
    # 5376 x 4096 weight bytes in 11.01 µs = 2.0 TB/s; 22,020,096 DRAM bytes read likewise
    cells = lines[2].split(" | ")[1:]
    assert cells == ["64", "dispatch", "cutlass", "11.0", "2.00", "2.00", "84 |"]
    assert lines[3].split(" | ")[3:6] == ["DecodeKernel", "8.0", "2.75"]


def test_report_scales_by_the_units_row(tmp_path):
    cases = [{"shape": "o", "m": 64, "n": 5376, "k": 4096, "kernel": "dispatch"}]
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    launches = [(CUTLASS, "110.10", "1.00", 84), (CUTLASS, "11.01", "22.020096", 84)]
    _export(tmp_path / "raw.csv", launches, units=("us", "Mbyte"))
    table = gemm_ncu.report(str(tmp_path / "raw.csv"), str(tmp_path / "cases.json"))
    assert table.splitlines()[2].split(" | ")[4:7] == ["11.0", "2.00", "2.00"]


def test_report_refuses_a_launch_count_that_does_not_match(tmp_path):
    (tmp_path / "cases.json").write_text(json.dumps([{"shape": "o", "m": 1, "n": 8, "k": 16,
                                                      "kernel": "dispatch"}]))  # fmt: skip
    _export(tmp_path / "raw.csv", [(CUTLASS, 1000, 1, 1)])
    with pytest.raises(AssertionError, match="1 profiled launches for 1 cases"):
        gemm_ncu.report(str(tmp_path / "raw.csv"), str(tmp_path / "cases.json"))
