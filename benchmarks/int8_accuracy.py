"""INT8 accuracy with and without smoothing (prism_jax/model/smoothing.py), on real weights.

For each model prints JSON lines:
  {"kind": "next_token", "model", "variant", "kl", "top1", "tokens"}  on held-out text below:
      kl = mean over scored positions of KL(p_fp32 || p_variant) over the full vocabulary,
      top1 = argmax agreement with fp32
  {"kind": "decisions", "model", "set", "variant", "flips", "max_dp", "mean_dp", "n",
   "accuracy"}: Engine.decide option probabilities against bf16's on the lead's fixed
      AGREEMENT_SET (tests/test_engine.py) and on labelled items from ../shared/data
      (--decision-files); flips = argmax changes, dp = max |p - p_bf16| per decision
  {"kind": "load", "model", "engine_smoothed_s", "engine_unsmoothed_s", "ratio",
   "first_load_calibration_s", "calibration_tokens"} with --load-times N

Variants: bf16, int8 without smoothing ("none"), int8 with every projection smoothed at each
--alphas value ("a=0.5"), and with --ablation one projection dropped or kept at --ablation-alpha
("a=0.65 -o", "a=0.65 only down", ...) and calibration on random tokens. The held-out text is
not the calibration text. --resample N adds the default alpha calibrated without passage k
of the calibration text (k < N): the spread shows how much a result hangs on the calibration.
Decisions are measured for every variant but the ablations.

    .venv/bin/python benchmarks/int8_accuracy.py --ablation --load-times 3
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prism_jax.config import ModelConfig  # noqa: E402
from prism_jax.model import forward, full_logits, params_from_hf  # noqa: E402
from prism_jax.model import smoothing as sm  # noqa: E402
from prism_jax.model.loader import load_checkpoint  # noqa: E402
from prism_jax.tokenizer import Tokenizer  # noqa: E402

# Held-out English text written for this benchmark (never used for calibration).
HELD_OUT = (
    "Our neighbour keeps bees at the bottom of his garden, three white hives under an old "
    "apple tree. Every August he knocks on our door with a jar of honey, still slightly warm, "
    "and refuses to take anything for it. This year he told us the colony in the middle hive "
    "had swarmed in June and settled in the church roof, where nobody could reach it.",
    "The committee reviewed four proposals for the new library building. Two were rejected "
    "because they exceeded the budget by more than fifteen percent. Of the remaining designs, "
    "the one with the glass reading room scored higher on accessibility, while the brick "
    "design was cheaper to heat. A final decision is expected after the public consultation.",
    "User: my laptop battery drains from 100 to 20 percent in about an hour, even when I'm "
    "only writing emails. It's two years old.\nAssistant: That sounds faster than normal. "
    "First, check the battery health report in the settings; if the capacity is below 80 "
    "percent, a replacement is usually the best fix. Also look for apps using a lot of power "
    "in the background.",
    "Ticket #5521 - Subject: Wrong delivery address\nHello, I moved last week and forgot to "
    "update my address before ordering. Order 99120 is going to my old flat. Can you redirect "
    "it to 14 Elm Street, Apartment 3? If that is not possible, please cancel the order and "
    "refund me. Thank you, Daniel",
    '{"event": "sensor_reading", "device_id": "th-0042", "timestamp": "2024-11-02T08:15:00Z", '
    '"temperature_c": 21.4, "humidity_pct": 48, "battery": 0.83, "alerts": ["door_open"], '
    '"location": {"building": "B", "floor": 2, "room": "lab"}}',
    "Volcanoes form where molten rock from deep inside the Earth reaches the surface. Most of "
    "them lie along the edges of tectonic plates, especially around the Pacific Ocean, a belt "
    "often called the Ring of Fire. Some, like those of Hawaii, sit above hot spots in the "
    "middle of a plate, and the chain of islands records the plate sliding over the plume.",
    "Honestly the hotel was fine but nothing special. The room was clean and the bed was "
    "comfortable, but the walls were thin and we could hear the lift all night. Breakfast was "
    "good value. The staff at reception were lovely and let us check out late. Would probably "
    "stay again if the price was right.",
    "To make a simple tomato sauce, warm two tablespoons of olive oil in a pan, add a chopped "
    "onion and cook it gently for ten minutes. Stir in two crushed garlic cloves, then a tin "
    "of tomatoes and a pinch of salt. Simmer for twenty minutes, stirring now and then, and "
    "finish with torn basil leaves.",
    "Question: A shop sells pencils at 3 for 60 cents. How much do 12 pencils cost?\nAnswer: "
    "12 pencils are 4 groups of 3, so they cost 4 x 60 = 240 cents, or 2.40 dollars.\n"
    "Question: Which ocean is the largest?\nAnswer: The Pacific Ocean.",
    "Dear Mr Alvarez,\n\nThank you for your application for the position of warehouse "
    "supervisor. We were impressed by your experience and would like to invite you to an "
    "interview on Monday 9 June at 11:00 at our office on Harbour Road. Please bring a form "
    "of identification. If the time does not suit you, reply to this email and we will find "
    "another slot.\n\nKind regards,\nHelen Moore, Human Resources",
    "The match was level at one goal each until the eighty-seventh minute, when the visiting "
    "striker found space at the far post and headed in a cross from the left. The home side "
    "pushed forward for the last few minutes and hit the crossbar once, but could not find an "
    "equaliser. The result lifts the visitors to third place in the table.",
    "- Status: open\n- Reported by: ops team\n- Component: payments API\n- Summary: requests "
    "to /v2/refunds time out after 30 seconds for amounts above 1,000 EUR\n- Impact: about "
    "40 customers a day cannot get refunds processed automatically\n- Workaround: support "
    "staff issue the refunds manually from the admin panel",
    "Mum: Did you remember to feed the cat before you left?\nTom: Yes! Twice actually, "
    "because she pretended she hadn't eaten.\nMum: She always does that. Are you home for "
    "dinner?\nTom: Probably around seven, the train is running late again.\nMum: Okay, I'll "
    "keep a plate warm for you.",
    "Sleep plays an important role in memory. During deep sleep the brain replays patterns "
    "of activity from the day, which seems to help move new information into long-term "
    "storage. People who are deprived of sleep after learning a task usually perform worse "
    "when tested the next day than people who slept normally, even if both groups get a "
    "full night of rest afterwards.",
)
ROW_LEN = 512
_forward = jax.jit(forward, static_argnames="config")
_logits = jax.jit(full_logits, static_argnames="config")


def held_out_rows(tok: Tokenizer) -> list[sm.Packed]:
    seqs = [[tok.bos_id, *tok.encode(p, add_bos=False)] for p in HELD_OUT]
    return sm.pack_sequences(seqs, row_len=ROW_LEN)


def logprobs(params, config, rows: list[sm.Packed]) -> np.ndarray:
    """log-softmax over the vocabulary at every scored position (one whose next token is in
    its own passage), row after row, 128 positions at a time."""
    out = []
    for r in rows:
        hidden = _forward(params, config, *map(jnp.asarray, (r.tokens, r.positions, r.mask)))
        scored = np.flatnonzero(r.valid[:-1] & (r.segment[:-1] == r.segment[1:]))
        for i in range(0, len(scored), 128):
            lg = _logits(params, config, hidden[scored[i : i + 128]])
            out.append(np.asarray(jax.nn.log_softmax(lg, axis=-1)))
    return np.concatenate(out)


def compare(ref: np.ndarray, lp: np.ndarray) -> tuple[float, float]:
    kl = float((np.exp(ref) * (ref - lp)).sum(-1).mean())
    return kl, float((ref.argmax(-1) == lp.argmax(-1)).mean())


def variants(args, config: ModelConfig, tok: Tokenizer) -> dict[str, dict]:
    """name -> params_from_hf keywords of the int8 variants."""
    out: dict[str, dict] = {} if args.no_baseline else {"none": dict(smoothing=None)}
    out.update({f"a={a:g}": dict(smoothing=a) for a in args.alphas})
    if args.ablation:
        a = args.ablation_alpha
        for p in sm.PROJECTIONS:
            out[f"a={a:g} -{p}"] = dict(smoothing={q: a for q in sm.PROJECTIONS if q != p})
            out[f"a={a:g} only {p}"] = dict(smoothing={p: a})
        random = sm.random_sequences(config)
        out[f"a={a:g} random tokens"] = dict(smoothing=a, calibration_tokens=random)
    text = sm.calibration_sequences(lambda t: tok.encode(t, add_bos=False), tok.bos_id)
    for k in range(args.resample):  # how much the result hangs on the calibration text
        subset = text[:k] + text[k + 1 :]
        out[f"a={sm.DEFAULT_ALPHA:g} w/o passage {k}"] = dict(
            smoothing=sm.DEFAULT_ALPHA, calibration_tokens=subset
        )
    return out


DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
DECISION_FILES = ("jev-style-support-tickets.jsonl", "jevify-policy-29.jsonl")


def decision_sets(files: list[str]) -> dict[str, list[tuple]]:
    """{set name: [(state, question, gold option index or None)]}: the lead's fixed
    AGREEMENT_SET (no gold) and the labelled items of ../shared/data (SOURCES.md there)."""
    from tests.test_engine import AGREEMENT_SET  # noqa: PLC0415

    sets = {"agreement_set": [(state, q, None) for state, q in AGREEMENT_SET]}
    items = []
    for name in files:
        for line in (DATA / name).read_text().splitlines():
            item = json.loads(line)
            q, gold = item["question"], item["gold"]
            if q["type"] == "choice":
                gold = list(q["criteria"]).index(gold)
            elif q["type"] == "noul":
                gold = 0 if gold else 1  # probabilities are [P(true), P(false)]
            items.append((item["state"], q, gold))
    if items:
        sets["labelled"] = items
    return sets


def option_probs(engine, items: list[tuple]) -> list[np.ndarray]:
    out = []
    for state, q, _ in items:
        a = engine.decide(state, {"q": q})["answers"]["q"]
        p = [a["noul"], 1 - a["noul"]] if q["type"] == "noul" else a["probabilities"].values()
        out.append(np.array(list(p)))
    return out


def agreement(probs, reference, items) -> dict:
    """Flips of the argmax against the reference, |dp| and accuracy where there is gold."""
    dp = [float(np.abs(a - b).max()) for a, b in zip(probs, reference, strict=True)]
    flips = sum(int(a.argmax() != b.argmax()) for a, b in zip(probs, reference, strict=True))
    golds = [(p, g) for p, (_, _, g) in zip(probs, items, strict=True) if g is not None]
    acc = float(np.mean([p.argmax() == g for p, g in golds])) if golds else None
    return dict(flips=flips, max_dp=max(dp), mean_dp=float(np.mean(dp)), n=len(dp), accuracy=acc)


def emit(**row) -> None:
    print(json.dumps(row), flush=True)


def run_model(name: str, args) -> None:
    from prism_jax.chat_template import ChatTemplate  # noqa: PLC0415
    from prism_jax.engine import Engine  # noqa: PLC0415

    ck = load_checkpoint(name)
    config = ModelConfig.from_hf_config(ck.hf_config)
    tok = Tokenizer.from_dir(ck.directory)
    template = ChatTemplate.from_dir(ck.directory)
    rows = held_out_rows(tok)
    ref = logprobs(params_from_hf(config, ck.tensors, "fp32"), config, rows)
    bf16 = params_from_hf(config, ck.tensors, "bf16")
    sets = decision_sets(args.decision_files) if args.decisions else {}
    engine = Engine(config, bf16, tok, template, name)
    ref_dec = {k: option_probs(engine, items) for k, items in sets.items()}
    todo = {"bf16": None} | variants(args, config, tok)
    for variant, kw in todo.items():
        params = bf16 if kw is None else params_from_hf(config, ck.tensors, "int8", **kw)
        kl, top1 = compare(ref, logprobs(params, config, rows))
        emit(kind="next_token", model=name, variant=variant, kl=kl, top1=top1, tokens=len(ref))
        if args.decisions and not any(w in variant for w in (" -", "only", "random")):
            engine = Engine(config, params, tok, template, name)
            for set_name, items in sets.items():
                dec = agreement(option_probs(engine, items), ref_dec[set_name], items)
                emit(kind="decisions", model=name, set=set_name, variant=variant, **dec)


def load_times(name: str, repeats: int) -> None:
    """Warm Engine.from_pretrained times, default (smoothed) vs smoothing=None, interleaved;
    and the one-off cost of a first load (tokenize the calibration text, calibrate)."""
    import prism_jax.model as pm  # noqa: PLC0415
    from prism_jax.engine import Engine  # noqa: PLC0415

    default = pm.params_from_hf
    unsmoothed = functools.partial(default, smoothing=None)
    times: dict[str, list[float]] = {"smoothed": [], "unsmoothed": []}
    Engine.from_pretrained(name)  # warm-up: fills the checkpoint, stats and XLA caches
    for _ in range(repeats):
        for key, fn in (("smoothed", default), ("unsmoothed", unsmoothed)):
            pm.params_from_hf = fn  # what Engine.from_pretrained calls
            try:
                t = time.perf_counter()
                Engine.from_pretrained(name)
                times[key].append(time.perf_counter() - t)
            finally:
                pm.params_from_hf = default
    ck = load_checkpoint(name)
    t = time.perf_counter()
    _, make_sequences = sm.text_calibration(ck.tensors)
    sequences = make_sequences()
    sm.activation_absmax(ModelConfig.from_hf_config(ck.hf_config), ck.tensors, sequences)
    med = {k: float(np.median(v)) for k, v in times.items()}
    emit(
        kind="load",
        model=name,
        repeats=repeats,
        engine_smoothed_s=med["smoothed"],
        engine_unsmoothed_s=med["unsmoothed"],
        ratio=med["smoothed"] / med["unsmoothed"],
        first_load_calibration_s=time.perf_counter() - t,
        calibration_tokens=sum(map(len, sequences)),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", nargs="+", default=["default", "smollm2-135m"])
    ap.add_argument("--alphas", nargs="+", type=float, default=[0.5, 0.65, 0.8])
    ap.add_argument("--ablation", action="store_true", help="drop / keep one projection")
    ap.add_argument("--ablation-alpha", type=float, default=0.65)
    ap.add_argument("--no-decisions", dest="decisions", action="store_false")
    ap.add_argument("--no-baseline", action="store_true", help="skip int8 without smoothing")
    ap.add_argument(
        "--resample",
        type=int,
        default=0,
        metavar="N",
        help="also the default alpha calibrated without passage k, for k < N",
    )
    ap.add_argument(
        "--decision-files",
        nargs="*",
        default=list(DECISION_FILES),
        help="labelled JSONL files in ../shared/data for the int8-vs-bf16 decision check",
    )
    ap.add_argument(
        "--load-times",
        type=int,
        default=0,
        metavar="N",
        help="also time N warm loads per model (default and unsmoothed)",
    )
    args = ap.parse_args()
    for name in args.models:
        run_model(name, args)
        if args.load_times:
            load_times(name, args.load_times)


if __name__ == "__main__":
    main()
