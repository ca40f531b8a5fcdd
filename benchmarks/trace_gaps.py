"""Where a step's wall time is not kernel time: GPU idle gaps and host thunk time in a trace.

    python3 benchmarks/trace_gaps.py TRACE_DIR [--runs N] [--split-ms 1.0]

Reads every *.xplane.pb under TRACE_DIR (jax.profiler.trace output). On the GPU planes it merges
every kernel of every stream into busy intervals and measures the idle time between them. A gap
longer than --split-ms separates steps (host work between runs: scheduling, readout); shorter
gaps are inside a step, the launch and dependency overhead that makes a forward's wall time
exceed its kernel time. Each inner gap is charged to the pair (op group of the kernel before it,
op group of the kernel after it), so a gap that follows every custom call of one kind shows up
as one row; the largest inner gaps are also listed one by one (top_gap rows), with their step,
their offset from the step's first kernel and the kernels on either side, which places a
one-off gap (a host wait at a part boundary, before a copy) in the step. On the host plane it
sums the XLA runtime's events by name (thunk execution, command buffer updates), which says
whether the host or the GPU sets the pace. Under the profiler XLA runs command buffers op by
op unless XLA_FLAGS has --xla_enable_command_buffers_during_profiling=true (gpu_suite's -tg).
Even then a gap is an upper bound on the untraced one: the ~20 µs after each of a 32-token
step's small table copies cost nothing measurable untraced (results/e2e_h100_session39/, 7),
while the readout-to-copy gap the traces showed was real (the host-memory readouts took it off
the untraced walls, ibid. 1); an A/B of untraced walls decides.
Prints one JSON line per row, in ms per run when --runs gives the number of traced runs.
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
from dataclasses import dataclass, field

from jax.profiler import ProfileData
from trace_breakdown import group_of

HIST_US = (2, 5, 10, 20, 50, 100, 1000)  # upper bounds of the gap histogram's bins
TOP_GAPS = 12  # inner gaps listed one by one, largest first


def load_planes(trace_dir: pathlib.Path) -> list:
    """Every plane of every *.xplane.pb under trace_dir, parsed once (27B traces are large)."""
    files = sorted(trace_dir.rglob("*.xplane.pb"))
    assert files, f"no *.xplane.pb under {trace_dir}: pass the directory jax.profiler.trace wrote"
    return [plane for f in files for plane in ProfileData.from_file(str(f)).planes]


def kernel_events(planes: list) -> list[tuple[float, float, str]]:
    """(start_ns, end_ns, kernel name) of every kernel on every GPU stream, by start."""
    events = []
    for plane in planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for line in plane.lines:
            if line.name.startswith("Stream"):  # "XLA Ops"/"XLA Modules" repeat the streams
                events += [(e.start_ns, e.start_ns + e.duration_ns, e.name) for e in line.events]
    return sorted(events)


def host_events(planes: list) -> tuple[dict[str, float], dict[str, int]]:
    """Host event name -> total ns and count, Python's own frames left out."""
    total: dict[str, float] = collections.defaultdict(float)
    count: dict[str, int] = collections.Counter()
    for plane in planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            if line.name == "python":
                continue
            for e in line.events:
                total[e.name] += e.duration_ns
                count[e.name] += 1
    return total, count


def _hist_bin(gap_us: float) -> str:
    for bound in HIST_US:
        if gap_us < bound:
            return f"<{bound}us"
    return f">={HIST_US[-1]}us"


@dataclass
class GapScan:
    """What walking the kernels in start order finds: busy and step-span time (ns), the gaps
    inside steps by (op before, op after) and by size bin, and each such gap's place."""

    busy: float = 0.0
    span: float = 0.0
    pairs: dict = field(default_factory=lambda: collections.defaultdict(list))
    hist: dict = field(default_factory=lambda: collections.defaultdict(list))
    inner: list = field(default_factory=list)  # (gap, step, offset, before, after)


def scan_gaps(events: list[tuple[float, float, str]], split_ns: float) -> GapScan:
    """Merges overlapping kernels into busy intervals; a gap of split_ns or more starts a step."""
    g = GapScan()
    cur_start, cur_end, cur_name = events[0]
    step_start, step = cur_start, 0
    for start, end, name in events[1:]:
        if start <= cur_end:  # overlaps the busy interval (another stream): extend it
            if end > cur_end:
                cur_end, cur_name = end, name
            continue
        g.busy += cur_end - cur_start
        gap = start - cur_end
        if gap >= split_ns:  # a new step begins
            g.span += cur_end - step_start
            step_start, step = start, step + 1
        else:
            g.pairs[(group_of(cur_name), group_of(name))].append(gap)
            g.hist[_hist_bin(gap / 1e3)].append(gap)
            g.inner.append((gap, step, cur_end - step_start, cur_name, name))
        cur_start, cur_end, cur_name = start, end, name
    g.busy += cur_end - cur_start
    g.span += cur_end - step_start
    return g


def gap_rows(events: list[tuple[float, float, str]], runs: int, split_ns: float) -> list[dict]:
    """Busy, span and idle time per run, the gap histogram and the gap pairs by total time."""
    if not events:
        return [{"kind": "gaps", "source": "none", "note": "no GPU kernels in the trace"}]
    g = scan_gaps(events, split_ns)
    per_run = 1e-6 / runs
    rows = [
        {
            "kind": "gaps",
            "source": "gpu",
            "span_ms": g.span * per_run,
            "busy_ms": g.busy * per_run,
            "idle_ms": (g.span - g.busy) * per_run,
            "kernels_per_run": len(events) / runs,
            "hist": {
                b: {"count_per_run": len(v) / runs, "ms_per_run": sum(v) * per_run}
                for b, v in sorted(g.hist.items(), key=lambda kv: -sum(kv[1]))
            },
        }
    ]
    for (before, after), v in sorted(g.pairs.items(), key=lambda kv: -sum(kv[1]))[:15]:
        rows.append(
            {
                "kind": "gap_pair",
                "after_op": before,
                "before_op": after,
                "ms_per_run": sum(v) * per_run,
                "count_per_run": len(v) / runs,
                "mean_us": sum(v) / len(v) / 1e3,
            }
        )
    return rows + top_gap_rows(g.inner)


def top_gap_rows(inner: list[tuple[float, int, float, str, str]]) -> list[dict]:
    """The TOP_GAPS largest inner gaps, one row each: where in which step, between what."""
    return [
        {
            "kind": "top_gap",
            "gap_us": gap / 1e3,
            "step": step,
            "at_ms": offset / 1e6,  # from the step's first kernel to the gap's start
            "after_op": group_of(before),
            "before_op": group_of(after),
            "after_kernel": before[:120],
            "before_kernel": after[:120],
        }
        for gap, step, offset, before, after in sorted(inner, key=lambda g: -g[0])[:TOP_GAPS]
    ]


def host_rows(planes: list, runs: int, top: int = 20) -> list[dict]:
    total, count = host_events(planes)
    per_run = 1e-6 / runs
    return [
        {
            "kind": "host",
            "event": name[:160],
            "ms_per_run": ns * per_run,
            "count_per_run": count[name] / runs,
        }
        for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:top]
    ]


def annotations(planes: list, prefix: str) -> list[tuple[float, float]]:
    """(start_ns, end_ns) of the host's TraceAnnotation events whose name starts with prefix."""
    spans = []
    for plane in planes:
        if plane.name == "/host:CPU":
            for line in plane.lines:
                spans += [(e.start_ns, e.end_ns) for e in line.events if e.name.startswith(prefix)]
    return sorted(spans)


def bounds_rows(events, runs_spans: list[tuple[float, float]]) -> list[dict]:
    """Per annotated run: host time before its first kernel starts (lead: host prep, input
    transfers, the launch of the first thunks) and after its last kernel ends (tail: the
    readout's transfer back and the host's post-processing), in ms, averaged over runs."""
    leads, tails, walls = [], [], []
    for start, end in runs_spans:
        inside = [(a, b) for a, b, _ in events if start <= a and b <= end]
        if not inside:
            continue
        leads.append(min(a for a, _ in inside) - start)
        tails.append(end - max(b for _, b in inside))
        walls.append(end - start)
    if not walls:
        return []
    n = len(walls)
    return [
        {
            "kind": "run_bounds",
            "runs": n,
            "wall_ms": sum(walls) / n / 1e6,
            "lead_ms": sum(leads) / n / 1e6,
            "tail_ms": sum(tails) / n / 1e6,
        }
    ]


def gaps(trace_dir: pathlib.Path, runs: int, split_ms: float = 1.0, run_prefix: str = "prism "):
    """Gap, run-bound and host rows of a trace (run_prefix: the annotation of each run)."""
    assert runs >= 1, "runs counts traced runs: at least 1"
    planes = load_planes(trace_dir)
    events = kernel_events(planes)
    bounds = bounds_rows(events, annotations(planes, run_prefix))
    return gap_rows(events, runs, split_ms * 1e6) + bounds + host_rows(planes, runs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("trace_dir", type=pathlib.Path)
    p.add_argument("--runs", type=int, default=1, help="runs the trace holds (to print per run)")
    p.add_argument("--split-ms", type=float, default=1.0, help="longer gaps separate steps")
    args = p.parse_args(argv)
    for row in gaps(args.trace_dir, args.runs, args.split_ms):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
