"""CPU decision latency on the default model: prism_jax (int8 and bf16, one forest per
request) against HF transformers (PyTorch CPU, one forward pass per question, full logits at
the last position) on the same prompts, measured in the same run.

    .venv/bin/python benchmarks/cpu_decide.py [--runs 10] [--out benchmarks/results/cpu_decide]

Prints one JSON line per measurement and writes them (plus a markdown table) under --out.
Needs `make ref-venv` for the HF baseline.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import platform
import statistics
import subprocess
import tempfile
import time

import numpy as np

from prism_jax.engine import Engine
from prism_jax.questions import parse_questions

ROOT = pathlib.Path(__file__).resolve().parents[1]
STATE = (
    "Ticket #4821 from Dana (premium plan, customer since 2019). Subject: charged twice. "
    "Hi, I was charged twice for my March invoice (order 7731) and I need one of the charges "
    "refunded before my rent is due on Friday. I also could not log in to the billing page "
    "yesterday; it said my session expired. Please help, this is the second time this year."
)
QUESTIONS = {
    "topic": {
        "type": "choice",
        "instructions": "What is this ticket mainly about?",
        "criteria": {"billing": None, "technical": None, "account": None},
    },
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["low", "medium", "high"],
    },
    "plan": {
        "type": "choice",
        "instructions": "Which plan is the customer on?",
        "criteria": {"free": None, "basic": None, "premium": None},
    },
    "login": {"type": "noul", "instructions": "Does the customer mention a login problem?"},
    "sentiment": {
        "type": "choice",
        "instructions": "What is the customer's mood?",
        "criteria": {"calm": None, "worried": None, "angry": None},
    },
    "repeat": {"type": "noul", "instructions": "Has this happened before?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "criteria": {"finance": None, "engineering": None, "sales": None},
    },
    "priority": {
        "type": "score",
        "instructions": "What priority should it get?",
        "criteria": ["P3", "P2", "P1"],
    },
    "language": {
        "type": "choice",
        "instructions": "Which language is the ticket in?",
        "criteria": {"English": None, "French": None, "German": None},
    },
}
SCENARIOS = {"one_question": ["topic"], "ten_questions": list(QUESTIONS)}


def time_engine(engine: Engine, qids: list[str], runs: int, warmup: int = 2) -> dict:
    questions = {q: QUESTIONS[q] for q in qids}
    for _ in range(warmup):
        response = engine.decide(STATE, questions)
    times = []
    for _ in range(runs):
        engine.cache.clear()  # cold: every run computes the state (HF has no prefix cache)
        start = time.perf_counter()
        response = engine.decide(STATE, questions)
        times.append(time.perf_counter() - start)
    return {
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
        "runs": runs,
        "input_tokens": response["usage"]["input_tokens"],
        "response": response,
    }


def hf_requests(engine: Engine) -> dict:
    """The same prompts as token ids: the whole prompt per question and its option tokens."""
    out = {}
    for name, qids in SCENARIOS.items():
        parsed = parse_questions({q: QUESTIONS[q] for q in qids})
        items = []
        for q in parsed.values():
            r = engine.renderer.render(STATE, q)
            assert all(len(o) == 1 for o in r.options), "baseline handles single-token options"
            items.append([list(r.prefix + r.branch), [o[0] for o in r.options]])
        out[name] = items
    return out


def run_hf(model_dir: str, dtype: str, scenarios: dict, runs: int) -> dict:
    python = ROOT / ".venv-ref" / "bin" / "python"
    if not python.exists():
        raise SystemExit("the HF baseline needs the reference venv: run `make ref-venv`")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(
            {
                "model_dir": model_dir,
                "dtype": dtype,
                "runs": runs,
                "warmup": 2,
                "scenarios": scenarios,
            },
            f,
        )
    proc = subprocess.run(
        [str(python), str(ROOT / "benchmarks" / "hf_decide_baseline.py"), f.name],
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def answer_probs(response: dict) -> list[list[float]]:
    """Each answer's probabilities in option order (noul: yes, then no)."""
    return [
        [a["noul"], 1.0 - a["noul"]] if a["type"] == "noul" else list(a["probabilities"].values())
        for a in response["answers"].values()
    ]


def scenario_row(name, qids, precision, ours, base, args, machine) -> dict:
    """One scenario's JSON row: our times, the HF baseline's, and the largest probability gap."""
    row = {
        "scenario": name,
        "questions": len(qids),
        "model": args.model,
        "precision": precision,
        "input_tokens": ours["input_tokens"],
        "median_s": ours["median_s"],
        "min_s": ours["min_s"],
        "max_s": ours["max_s"],
        "runs": args.runs,
        "baseline": "HF transformers fp32, one pass per question",
        "baseline_median_s": base["median_s"],
        "baseline_min_s": base["min_s"],
        "baseline_max_s": base["max_s"],
        "speedup": base["median_s"] / ours["median_s"],
        "machine": machine,
    }
    pairs = zip(answer_probs(ours["response"]), base["probabilities"], strict=True)
    row["max_abs_dp_vs_baseline"] = float(
        max(np.max(np.abs(np.array(a) - np.array(b))) for a, b in pairs)
    )
    return row


def write_table(out: pathlib.Path, lines: list[dict]) -> None:
    (out / "cpu_decide.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    table = [
        "| scenario | prism_jax | median (min–max) | baseline | median | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for r in lines:
        spread = f"{r['min_s'] * 1e3:.0f}–{r['max_s'] * 1e3:.0f}"
        table.append(
            f"| {r['scenario']} ({r['input_tokens']} tok) | {r['precision']} | "
            f"{r['median_s'] * 1e3:.0f} ms ({spread}) | {r['baseline']} | "
            f"{r['baseline_median_s'] * 1e3:.0f} ms | {r['speedup']:.2f}× |"
        )
    (out / "cpu_decide.md").write_text("\n".join(table) + "\n")
    print("\n".join(table))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="default")
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "cpu_decide"))
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = []
    cores = len(__import__("os").sched_getaffinity(0))
    machine = f"{platform.processor() or platform.machine()}, {cores} cores"
    from prism_jax.model.loader import load_checkpoint

    model_dir = str(load_checkpoint(args.model).directory)
    hf = None
    for precision in ("int8", "bf16"):
        engine = Engine.from_pretrained(args.model, precision=precision)
        if hf is None:  # one baseline run: HF fp32 (the usual CPU dtype), serial per question
            hf = run_hf(model_dir, "fp32", hf_requests(engine), args.runs)
        for name, qids in SCENARIOS.items():
            ours = time_engine(engine, qids, args.runs)
            row = scenario_row(name, qids, precision, ours, hf[f"{name}/serial"], args, machine)
            print(json.dumps(row), flush=True)
            lines.append(row)
    write_table(out, lines)


if __name__ == "__main__":
    main()
