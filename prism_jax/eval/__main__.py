"""python -m prism_jax.eval --model M --data SPEC[,SPEC...] --precision int8,bf16,fp32
[--style keys,letters,text,keys-nosys] [--limit N] [--seed S] [--out DIR]

SPEC: a .jsonl path, a file name or stem in the shared data directory, "shared" (every
labelled shared file), "olmo" (the seven olmo sets) or "olmo:arc_challenge,piqa,..." (names
after "olmo:" up to the next non-set name are olmo sets).
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from prism_jax.eval import olmo_sets, plots, report, shared_data
from prism_jax.eval.items import Item, stratified_sample
from prism_jax.eval.runner import (
    Runner,
    RunResult,
    Variant,
    load_done,
    paired,
    predictions_path,
)
from prism_jax.prompts import RenderStyle


def load_items(spec: str, data_dir: Path | None) -> tuple[list[Item], list[tuple[str, str]]]:
    items: list[Item] = []
    skipped: list[tuple[str, str]] = []
    olmo_mode = False
    for token in [t.strip() for t in spec.split(",") if t.strip()]:
        if token == "olmo" or token.startswith("olmo:"):
            names = olmo_sets.parse_spec(token)
            olmo_mode = token.startswith("olmo:")
        elif olmo_mode and token in olmo_sets.FOLDERS:
            names = [token]
        else:
            olmo_mode = False
            paths = (
                shared_data.shared_files(data_dir)
                if token == "shared"
                else [shared_data.resolve(token, data_dir)]
            )
            for path in paths:
                got, skip = shared_data.load_file(path)
                items += got
                skipped += skip
            continue
        for name in names:
            got, skip = olmo_sets.load_set(name)
            items += got
            skipped += skip
    seen: set[str] = set()
    unique = [it for it in items if not (it.id in seen or seen.add(it.id))]
    return unique, skipped


def git_commit() -> str:
    """The engine code under test: $PRISM_EVAL_COMMIT when set (a run from an exported
    snapshot), else the checkout's HEAD, marked when prism_jax has uncommitted changes."""
    if os.environ.get("PRISM_EVAL_COMMIT"):
        return os.environ["PRISM_EVAL_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[2]
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "prism_jax"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        return head + ("+uncommitted" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m prism_jax.eval",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--model", default="default", help="registered name or checkpoint path")
    p.add_argument("--data", default="shared", help="comma-separated SPECs (see above)")
    p.add_argument("--precision", default="int8,bf16,fp32")
    p.add_argument(
        "--style",
        default="keys",
        help="render styles: keys (the default), letters, text; -nosys drops the "
        "system instructions (e.g. keys,letters-nosys)",
    )
    p.add_argument("--limit", type=int, default=None, help="seeded stratified sample size")
    p.add_argument(
        "--min-per-set",
        type=int,
        default=0,
        help="with --limit: every set gets at least min(size, this) items",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=int, default=512, help="tokens per forest step")
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="stop after the step that passes this many minutes (report the rest)",
    )
    p.add_argument("--data-dir", default=None, help="shared data dir (default ../shared/data)")
    p.add_argument("--out", default="eval-out", help="output directory (resumes a run there)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="no engine: report on the predictions already in --out (a run cut short)",
    )
    return p.parse_args(argv)


def predict(args, sample, variants, precisions, out: Path) -> RunResult:
    """Each variant's probabilities of the sample: the predictions already in --out with
    --report-only, else from one engine per precision."""
    if args.report_only:  # no engine
        probs = {v.name: load_done(predictions_path(out, v)) for v in variants}
        return RunResult(probs, {}, {}, 0)
    from prism_jax.engine import Engine  # after argument errors, which need no JAX

    t = time.perf_counter()
    # Compile each step bucket on first use: a run touches a few of them, and four engines
    # warming every bucket took minutes per process on the H200 before the first item.
    engines = {p: Engine.from_pretrained(args.model, precision=p, warmup=False) for p in precisions}
    print(f"loaded {len(engines)} engines in {time.perf_counter() - t:.1f} s", file=sys.stderr)
    runner = Runner(engines, variants, args.budget)
    max_seconds = args.max_minutes * 60 if args.max_minutes else None
    return runner.run(sample, out, progress=not args.no_progress, max_seconds=max_seconds)


def write_plots(out: Path, summary: dict, title: str) -> None:
    """The reliability diagram and confidence against accuracy per set."""
    plots.reliability_diagram(
        out / "reliability.png",
        {v: summary["overall"][v]["bins"] for v in summary["variants"]},
        title,
    )
    per_set = {
        v: {s: summary["per_set"][s][v] for s in summary["per_set"]} for v in summary["variants"]
    }
    plots.confidence_vs_accuracy(out / "confidence_vs_accuracy.png", per_set, title)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data_dir = Path(args.data_dir) if args.data_dir else None
    items, skipped = load_items(args.data, data_dir)
    sample = stratified_sample(items, args.limit, args.seed, args.min_per_set)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    styles = [RenderStyle.from_name(s.strip()) for s in args.style.split(",") if s.strip()]
    variants = [Variant(p, s) for s in styles for p in precisions]
    print(
        f"{len(sample)} of {len(items)} items ({len(skipped)} without a usable label); "
        f"variants {', '.join(v.name for v in variants)}",
        file=sys.stderr,
    )
    result = predict(args, sample, variants, precisions, out)
    decided = paired(sample, result)
    info = {
        "model": args.model,
        "data": args.data,
        "precisions": precisions,
        "styles": [s.name for s in styles],
        "limit": args.limit,
        "seed": args.seed,
        "min_per_set": args.min_per_set,
        "budget_tokens": args.budget,
        "command": "python -m prism_jax.eval " + shlex.join(sys.argv[1:] if argv is None else argv),
        "commit": git_commit(),
        "sampled": len(sample),
        "available": len(items),
        "unlabelled": len(skipped),
        "stopped_early": result.stopped_early,
        "report_only": args.report_only,
    }
    summary = report.summarize(decided, variants, result, info)
    report.write(out, summary)
    if decided:
        write_plots(out, summary, f"{args.model}: {len(decided)} decisions")
    print(report.markdown(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
