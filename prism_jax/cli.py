"""`python -m prism_jax decide`: one decision from the command line.

    python -m prism_jax decide --model default --state "My card was charged twice" \
        --choice billing,technical --instructions "What is this ticket about?"
    python -m prism_jax decide --model default --request body.json --json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

from prism_jax.config import PRECISIONS
from prism_jax.questions import DecisionRequestError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prism_jax",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("decide", help="answer questions about a state with option probabilities")
    d.add_argument(
        "--model",
        default="default",
        help="'default' (Gemma 3 270M from PyPI), a registered name, an HF "
        "safetensors directory or a .gguf file",
    )
    d.add_argument(
        "--precision",
        default="int8",
        choices=PRECISIONS,
        help="int8: two INT8 digits (decides like FP32); int8-1digit: faster; "
        "-attn: attention in INT8 digits too (tensor cores)",
    )
    d.add_argument("--state", help="the state: text, or JSON if it parses as an object/array")
    d.add_argument("--choice", help="comma-separated options of one choice question")
    d.add_argument("--noul", action="store_true", help="ask a yes/no question instead")
    d.add_argument("--score", help="comma-separated levels, lowest first, of a score question")
    d.add_argument("--instructions", help="the question's instructions")
    d.add_argument("--request", help="a System One request body (JSON file; '-' for stdin)")
    d.add_argument("--json", action="store_true", help="print the System One response as JSON")
    return parser


def _state(text: str) -> Any:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return text
    return value if isinstance(value, dict | list) else text


def request_from_args(args: argparse.Namespace) -> dict[str, Any]:
    if args.request:
        with sys.stdin if args.request == "-" else open(args.request) as f:
            return json.load(f)
    if args.state is None:
        raise DecisionRequestError("give --state TEXT (and a question), or --request FILE.json")
    q: dict[str, Any] = {"instructions": args.instructions}
    kinds = [bool(args.choice), bool(args.noul), bool(args.score)]
    if sum(kinds) != 1:
        raise DecisionRequestError("give exactly one of --choice A,B  --noul  --score L1,L2")
    if args.choice:
        q |= {"type": "choice", "criteria": {o.strip(): None for o in args.choice.split(",")}}
    elif args.noul:
        q |= {"type": "noul"}
    else:
        q |= {"type": "score", "criteria": [s.strip() for s in args.score.split(",")]}
    return {"state": _state(args.state), "questions": {"answer": q}}


def format_table(response: dict[str, Any]) -> str:
    lines = []
    for qid, a in response["answers"].items():
        if a["type"] == "noul":
            lines.append(f"{qid}: P(true) = {a['noul']:.4f}")
            continue
        head = a["choice"] if a["type"] == "choice" else f"{a['score']:.3f}"
        lines.append(f"{qid} ({a['type']}): {head}   confidence {a['confidence']:.3f}")
        legend = a.get("legend", {})
        width = max(len(legend.get(k, k)) for k in a["probabilities"])
        for key, p in sorted(a["probabilities"].items(), key=lambda kv: -kv[1]):
            label = legend.get(key, key)
            lines.append(f"  {label:<{width}}  {p:8.4f}  {'#' * round(40 * p)}")
    usage = response["usage"]
    lines.append(f"model {response['model']}, {usage['input_tokens']} input tokens")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from prism_jax.engine import Engine  # heavy import after argument errors are reported

    try:
        body = request_from_args(args)
        start = time.perf_counter()
        # One request: compile only the shapes it needs (servers warm every bucket).
        engine = Engine.from_pretrained(args.model, precision=args.precision, warmup=False)
        print(
            f"loaded {args.model} ({args.precision}) in {time.perf_counter() - start:.1f} s",
            file=sys.stderr,
        )
        start = time.perf_counter()
        response = engine.decide(body.get("state", ""), body.get("questions", {}))
        print(
            f"decided in {time.perf_counter() - start:.2f} s (first call compiles)", file=sys.stderr
        )
    except (DecisionRequestError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(response, indent=2) if args.json else format_table(response))
    return 0
