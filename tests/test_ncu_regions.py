"""benchmarks/ncu_regions.py: regions of an Nsight Compute SASS export, on a hand-made one."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import ncu_regions as nr  # noqa: E402

HEADER = ["Address", "Source", nr.SAMPLES, "Warp Stall Sampling (Not-issued Samples)", nr.EXECUTED]


def _write(path, *kernels):
    """ncu's layout, per profiled launch: a kernel-name row, the header, then one quoted row
    per instruction."""
    rows = []
    for lines in kernels:
        rows += [["Kernel Name", "void k(float *)", ""], HEADER]
        for i, (src, samples, executed) in enumerate(lines):
            rows.append([hex(i * 16), src, str(samples), "0", f"{executed:,}"])
    path.write_text("\n".join(",".join(f'"{c}"' for c in r) for r in rows) + "\n")


def test_regions_split_on_execution_count(tmp_path):
    # setup (runs 10), a loop body (runs 1,000: two FP lines and a predicated branch), tail (10)
    lines = [
        ("MOV R1, c[0x0][0x28]", 5, 10), ("BAR.SYNC.DEFER_BLOCKING 0x0", 40, 10),
        ("FMUL R2, R3, R4", 7, 1000), ("FADD R5, R5, R2", 9, 1000), ("@!P0 BRA 0x20", 1, 1000),
        ("STG.E desc[UR4][R6.64], R5", 2, 10),
    ]  # fmt: skip
    _write(tmp_path / "src.csv", lines)
    found = nr.regions(nr.read_sass(str(tmp_path / "src.csv")))
    assert [(r.first, r.last, r.runs) for r in found] == [(0, 1, 10), (2, 4, 1000), (5, 5, 10)]
    body = found[1]
    assert (body.size, body.executed, body.samples, body.fp) == (3, 3000, 17, 2)
    assert found[0].head.startswith("MOV") and found[0].samples == 45
    table = nr.report(found, top=2)
    assert "3,030 warp instructions executed, 64 stall samples" in table
    assert table.splitlines()[3].startswith("| 0-1 | 2 | 10 | 0.7% | 70.3% | 0 | `MOV")
    assert len(table.splitlines()) == 5  # header lines + the top 2 regions


def test_cli_rejects_a_details_export(tmp_path):
    (tmp_path / "details.csv").write_text('"ID","Kernel Name","Metric Name"\n"0","k","Duration"\n')
    script = ROOT / "benchmarks" / "ncu_regions.py"
    proc = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "details.csv")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.returncode != 0 and "--page source" in proc.stderr


def test_a_file_of_several_launches_reads_one(tmp_path):
    first = [("MOV R1, c[0x0][0x28]", 5, 10), ("EXIT", 1, 10)]
    second = [("FMUL R2, R3, R4", 7, 1000)]
    _write(tmp_path / "src.csv", first, second)
    assert [r["Source"] for r in nr.read_sass(str(tmp_path / "src.csv"))] == [
        "MOV R1, c[0x0][0x28]",
        "EXIT",
    ]
    assert [r["Source"] for r in nr.read_sass(str(tmp_path / "src.csv"), 1)] == ["FMUL R2, R3, R4"]
    try:
        nr.read_sass(str(tmp_path / "src.csv"), 2)
    except ValueError as e:
        assert "holds 2 kernels" in str(e)
    else:
        raise AssertionError("a kernel index past the file's launches must be an error")
