"""`python -m prism_jax.audit`: a real audit of one request on the default model passes with
zero mismatches, a configuration that changes a bit is reported and fails the exit status,
and suites load from JSONL with errors that say what is wrong."""

from __future__ import annotations

import json

import pytest

from prism_jax import audit
from prism_jax.audit_suite import DEFAULT_SUITE
from prism_jax.engine import Engine

SUITE = [DEFAULT_SUITE[1]]  # a noul and a choice with multi-token options


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine.from_pretrained("default", precision="int8", warmup=False)


def test_real_audit_has_no_mismatch(engine):
    report = audit.audit(engine, SUITE, progress=False)
    assert report["ok"], [r for r in report["rows"] if r["mismatches"]]
    assert len(report["rows"]) == len(audit.configurations()) == 11
    assert all(r["checked"] == 2 for r in report["rows"])
    assert set(report["hashes"]) == {"0/angry", "0/city"}
    assert all(len(h) == 64 for h in report["hashes"].values())


def test_a_changed_bit_is_a_mismatch(engine, monkeypatch, capsys, tmp_path):
    def nudged(engine, suite, cases, i):
        probs = audit._together(engine, suite, cases, i)
        probs[1] = list(probs[1])
        probs[1][0] = float(probs[1][0]) * (1 + 2**-52)  # one ulp of float64
        return probs

    monkeypatch.setattr(audit, "configurations", lambda: [("nudged", nudged)])
    monkeypatch.setattr(audit, "load_suite", lambda path: SUITE)
    monkeypatch.setattr(Engine, "from_pretrained", classmethod(lambda cls, *a, **k: engine))
    out = tmp_path / "report.json"
    assert audit.main(["--model", "default", "--out", str(out)]) == 1
    report = json.loads(out.read_text())
    (row,) = [r for r in report["rows"] if r["configuration"] == "nudged"]
    assert [m["question"] for m in row["mismatches"]] == ["0/city"]
    assert "MISMATCH" in capsys.readouterr().out


def test_suite_files(tmp_path):
    good = tmp_path / "suite.jsonl"
    good.write_text("\n".join(json.dumps(r) for r in DEFAULT_SUITE) + "\n\n")
    assert audit.load_suite(str(good)) == DEFAULT_SUITE
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"questions": {}}) + "\n")
    with pytest.raises(SystemExit, match="bad.jsonl:1: each line must be a System One request"):
        audit.load_suite(str(bad))
