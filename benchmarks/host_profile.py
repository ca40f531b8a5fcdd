"""Where the host's time goes inside a step's executable call, untraced: py-spy's native stacks.

    python3 benchmarks/host_profile.py --out DIR [--rate 200] [--timeout 180] [--marker TEXT] -- \
        [dispatch_probe.py arguments, e.g. --single-digit --runs 50]
    python3 benchmarks/host_profile.py --summarize DIR/host_profile.raw --out DIR

The XLA profiler cannot answer this: with a profiler session active XLA runs a command buffer's
thunks one by one instead of launching its CUDA graph (command_buffer_thunk.cc), so a trace
shows another mode than the one being timed. py-spy samples the process from outside instead
(--native: Python and C++ frames together, symbols from the libraries' tables). It records
benchmarks/dispatch_probe.py, keeps the samples taken inside --marker (default: the engine's
Runner.forward, less its first-call compiles) and writes host_profile.md: the frames that hold
the most samples inclusively (a frame anywhere on the stack) and exclusively (the innermost
frame). Needs the `py-spy` wheel (carried in .whl/ to the H200 machine) and ptrace rights.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import shutil
import signal
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
MARKER = "Runner.forward (prism_jax/runner.py"
EXCLUDE = ("Runner.executable (prism_jax/runner.py",)  # a bucket's first call compiles it
TOP = 40


def parse_raw(lines) -> list[tuple[list[str], int]]:
    """py-spy's raw format: one `frame;frame;...;frame COUNT` line per distinct stack,
    outermost frame first."""
    stacks = []
    for line in lines:
        line = line.rstrip("\n")
        if not line:
            continue
        stack, _, count = line.rpartition(" ")
        assert stack and count.isdigit(), f"not a py-spy raw line: {line[:200]!r}"
        stacks.append((stack.split(";"), int(count)))
    return stacks


def summarize(stacks, marker: str = MARKER, exclude=EXCLUDE) -> dict:
    """Samples under the innermost frame containing `marker` (stacks through an `exclude`
    frame left out): frames below it by inclusive and exclusive count."""
    inclusive: collections.Counter = collections.Counter()
    exclusive: collections.Counter = collections.Counter()
    total = kept = 0
    for frames, count in stacks:
        total += count
        at = [i for i, f in enumerate(frames) if marker in f]
        if not at or any(x in f for f in frames for x in exclude):
            continue
        below = frames[at[-1] + 1 :] or [frames[at[-1]]]
        kept += count
        for f in set(below):  # a recursive frame counts once per sample
            inclusive[f] += count
        exclusive[below[-1]] += count
    return {
        "samples": total,
        "marked": kept,
        "inclusive": inclusive.most_common(TOP),
        "exclusive": exclusive.most_common(TOP),
    }


def render(summary: dict, command: str) -> str:
    def table(rows):
        lines = ["| share of marked samples | samples | frame |", "|---|---|---|"]
        for frame, n in rows:
            name = frame.replace("|", "\\|")[:220]
            lines.append(f"| {100 * n / max(summary['marked'], 1):.1f} % | {n} | `{name}` |")
        return "\n".join(lines)

    return (
        "# Host profile (py-spy, native stacks)\n\n"
        f"`{command}`\n\n"
        f"{summary['marked']} of {summary['samples']} samples were inside the marker.\n\n"
        "## Inclusive (the frame anywhere below the marker)\n\n"
        f"{table(summary['inclusive'])}\n\n"
        "## Exclusive (the innermost frame)\n\n"
        f"{table(summary['exclusive'])}\n"
    )


def record(
    out: pathlib.Path, rate: int, timeout_s: float, probe_args: list[str]
) -> tuple[pathlib.Path, str]:
    """py-spy records dispatch_probe.py. Past timeout_s it gets SIGINT, on which it stops and
    still writes what it sampled: native unwinding can fall far behind its rate (here on the
    2-core machine it once did not finish at all), and a partial profile beats none."""
    spy = shutil.which("py-spy") or shutil.which(
        "py-spy", path=str(pathlib.Path(sys.prefix) / "bin")
    )
    if spy is None:
        raise SystemExit(
            "py-spy not found: pip install py-spy (on the H200 machine: put its wheel in .whl/, "
            "benchmarks/gpu_suite.sh installs it)"
        )
    raw = out / "host_profile.raw"
    cmd = [spy, "record", "--native", "--rate", str(rate), "--format", "raw", "-o", str(raw),
           "--", sys.executable, str(HERE / "dispatch_probe.py"), *probe_args]  # fmt: skip
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=HERE
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        stderr += f"\n(interrupted after {timeout_s} s)"
    (out / "host_profile_probe.jsonl").write_text(stdout)
    (out / "host_profile_spy.log").write_text(stderr[-20000:])
    if not raw.exists():
        raise SystemExit(f"py-spy wrote no profile ({proc.returncode}): {stderr[-3000:]}")
    return raw, " ".join(["py-spy", *cmd[1:3], "...", *probe_args])


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--rate", type=int, default=200, help="samples per second")
    p.add_argument("--timeout", type=float, default=180, help="seconds before py-spy is stopped")
    p.add_argument("--marker", default=MARKER, help="keep samples under the frame containing it")
    p.add_argument("--summarize", metavar="RAW", help="only summarise this raw file")
    args, probe_args = p.parse_known_args(argv)
    probe_args = [a for a in probe_args if a != "--"]
    out = pathlib.Path(args.out).resolve()  # py-spy runs in benchmarks/: paths must not be relative
    out.mkdir(parents=True, exist_ok=True)
    if args.summarize:
        raw, command = pathlib.Path(args.summarize), f"host_profile.py --summarize {args.summarize}"
    else:
        raw, command = record(out, args.rate, args.timeout, probe_args)
    with raw.open() as f:
        summary = summarize(parse_raw(f), args.marker)
    (out / "host_profile.json").write_text(json.dumps(summary, indent=1))
    (out / "host_profile.md").write_text(render(summary, command))
    print(json.dumps({"samples": summary["samples"], "marked": summary["marked"]}))


if __name__ == "__main__":
    main()
