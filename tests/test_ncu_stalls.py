"""benchmarks/ncu_stalls.py: the largest stall reasons of each launch in a raw-page CSV."""

import csv
import importlib.util
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = importlib.util.spec_from_file_location("ncu_stalls", ROOT / "benchmarks" / "ncu_stalls.py")
ncu_stalls = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(ncu_stalls)

P, S = ncu_stalls.PREFIX, ncu_stalls.SUFFIX


def write_raw(path, rows):
    keys = ["Kernel Name", f"{P}barrier{S}", f"{P}long_scoreboard{S}", f"{P}wait{S}", "other"]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerow(dict(zip(keys, ["", "ratio", "ratio", "ratio", "x"], strict=True)))  # units
        for row in rows:
            w.writerow(dict(zip(keys, row, strict=True)))


def test_lists_each_launch_largest_reasons_first(tmp_path):
    raw = tmp_path / "raw.csv"
    # ncu writes thousands with a comma; an empty cell is skipped
    rows = [("KernelA", "4.38", "0.64", "1,600.5", "9"), ("KernelB", "0.5", "7.2", "", "9")]
    write_raw(raw, rows)
    with open(raw, newline="") as f:
        lines = ncu_stalls.stalls(list(csv.DictReader(f)), top=2)
    assert lines == [
        "KernelA: wait 1600.50, barrier 4.38",
        "KernelB: long_scoreboard 7.20, barrier 0.50",
    ]


def test_a_report_without_stall_metrics_is_an_error(tmp_path, capsys, monkeypatch):
    raw = tmp_path / "raw.csv"
    with open(raw, "w") as f:
        f.write("Kernel Name,other\nK,1\n")
    monkeypatch.setattr("sys.argv", ["ncu_stalls.py", str(raw)])
    assert ncu_stalls.main() == 1
    assert "no stall metrics" in capsys.readouterr().out
