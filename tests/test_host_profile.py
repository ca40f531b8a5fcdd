"""benchmarks/host_profile.py's summary of py-spy raw stacks (synthetic stacks: recording
needs py-spy and ptrace rights, which the H200 run has)."""

import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import host_profile  # noqa: E402

FWD = "Runner.forward (prism_jax/runner.py:140)"
RAW = [
    f"<module> (x.py:1);main (x.py:2);{FWD};Compiled.__call__ (stages.py:952);"
    "xla::Execute (libjax.so);xla::Thunk::Initialize (libjax.so) 30\n",
    f"<module> (x.py:1);main (x.py:2);{FWD};Compiled.__call__ (stages.py:952);"
    "xla::Execute (libjax.so);cuGraphLaunch (libcuda.so) 10\n",
    f"<module> (x.py:1);main (x.py:2);{FWD};pack (step_buffers.py:51) 5\n",
    f"<module> (x.py:1);{FWD};Runner.executable (prism_jax/runner.py:124);compile (c.so) 500\n",
    "<module> (x.py:1);main (x.py:2);other (x.py:9) 200\n",
]


def test_summary_counts_only_the_marked_steady_state_samples():
    s = host_profile.summarize(host_profile.parse_raw(RAW))
    assert s["samples"] == 745 and s["marked"] == 45  # compiles and other frames left out
    inclusive = dict(s["inclusive"])
    assert inclusive["Compiled.__call__ (stages.py:952)"] == 40
    assert inclusive["xla::Execute (libjax.so)"] == 40
    assert FWD not in inclusive  # frames below the marker only
    assert s["exclusive"][0] == ("xla::Thunk::Initialize (libjax.so)", 30)
    assert dict(s["exclusive"])["pack (step_buffers.py:51)"] == 5
    text = host_profile.render(s, "host_profile.py --summarize x")
    assert "45 of 745 samples" in text and "66.7 %" in text


def test_a_line_that_is_not_raw_format_is_refused():
    with pytest.raises(AssertionError, match="not a py-spy raw line"):
        host_profile.parse_raw(["main (x.py:2);no count here\n"])
