"""The decide API on the real default model (Gemma 3 270M from PyPI): System One answers,
exact candidate probabilities, forest batching, precision agreement, and the CLI."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from prism_jax import model
from prism_jax.cli import main as cli_main
from prism_jax.engine import Engine

TICKET = "Hi, I was charged twice for my March invoice and I need one of the charges refunded."
QUESTIONS = {
    "topic": {
        "type": "choice",
        "instructions": "What is this support ticket about?",
        "criteria": {
            "billing": "payments, invoices, refunds",
            "technical": None,
            "account": "login, profile, password",
        },
    },
    "refund": {"type": "noul", "instructions": "Does the customer ask for a refund?"},
    "urgency": {
        "type": "score",
        "instructions": "How urgent is it?",
        "criteria": ["not urgent", "somewhat urgent", "very urgent"],
    },
    "city": {
        "type": "choice",
        "instructions": "Which city would suit a holiday?",
        "criteria": {"New York": None, "Los Angeles": None, "Paris": None},
    },
}
# A fixed set for the int8-vs-bf16 agreement check: (state, question).
AGREEMENT_SET = [
    ("The printer shows error E45 and will not start.", QUESTIONS["topic"]),
    ("I forgot my password and cannot log in.", QUESTIONS["topic"]),
    ("Please send me a copy of last month's invoice.", QUESTIONS["topic"]),
    (
        "The sky is blue and the grass is green.",
        {"type": "noul", "instructions": "Is the grass green?"},
    ),
    (
        "Water boils at 100 degrees Celsius at sea level.",
        {"type": "noul", "instructions": "Does water boil at 50 degrees Celsius at sea level?"},
    ),
    (
        "The capital of France is Paris.",
        {
            "type": "choice",
            "instructions": "What is the capital of France?",
            "criteria": {"Paris": None, "Rome": None, "Berlin": None},
        },
    ),
    (
        "2 + 2 = 4",
        {
            "type": "choice",
            "instructions": "What is 2 + 2?",
            "criteria": {"3": None, "4": None, "5": None},
        },
    ),
    ("The server has been down for three hours and customers cannot pay.", QUESTIONS["urgency"]),
]


@pytest.fixture(scope="module")
def int8_engine() -> Engine:
    return Engine.from_pretrained("default", precision="int8", warmup=False)


@pytest.fixture(scope="module")
def bf16_engine() -> Engine:
    return Engine.from_pretrained("default", precision="bf16", warmup=False)


def test_system_one_response(int8_engine):
    r = int8_engine.decide(TICKET, QUESTIONS)
    assert set(r["answers"]) == set(QUESTIONS)
    topic = r["answers"]["topic"]
    assert topic["type"] == "choice"
    assert set(topic["probabilities"]) == {"billing", "technical", "account"}
    assert sum(topic["probabilities"].values()) == pytest.approx(1.0, abs=1e-12)
    assert topic["choice"] == "billing", topic
    assert 0.0 <= r["answers"]["refund"]["noul"] <= 1.0
    urgency = r["answers"]["urgency"]
    assert urgency["legend"] == {"0": "not urgent", "1": "somewhat urgent", "2": "very urgent"}
    assert 0.0 <= urgency["score"] <= 2.0 and 0.0 <= urgency["confidence"] <= 1.0
    assert r["usage"]["input_tokens"] > 0 and r["usage"]["output_tokens"] == 0


def test_question_ids_never_reach_the_model(int8_engine):
    a = int8_engine.decide(TICKET, QUESTIONS)["answers"]
    renamed = {f"x{i}": q for i, q in enumerate(QUESTIONS.values())}
    b = int8_engine.decide(TICKET, renamed)["answers"]
    for (_, qa), (_, qb) in zip(a.items(), b.items(), strict=True):
        assert qa == qb  # exact float equality


def _exact_option_probs(engine: Engine, prompt: str, options: list[str]) -> np.ndarray:
    """The usual way: one causal sequence per option, full-vocabulary softmax per token."""
    rendered = engine.renderer.render_raw(prompt, options)
    logs = []
    for option in rendered.options:
        seq = np.array(rendered.branch + option, np.int32)
        t = len(seq)
        mask = np.tril(np.ones((t, t), bool))
        positions = np.arange(t, dtype=np.int32)
        hidden = model.forward(engine.params, engine.config, seq, positions, mask)
        logp = jax.nn.log_softmax(model.full_logits(engine.params, engine.config, hidden), -1)
        start = len(rendered.branch) - 1
        logs.append(sum(float(logp[start + j, tok]) for j, tok in enumerate(option)))
    logs = np.array(logs)
    return np.exp(logs - logs.max()) / np.exp(logs - logs.max()).sum()


@pytest.mark.parametrize(
    "options", [[" Paris", " Rome", " London"], [" New York", " Los Angeles", " Paris", " Tokyo"]]
)
def test_candidate_probabilities_equal_renormalised_full_softmax(fp32_engine, options):
    # A property of the readout, so checked in fp32: in int8, XLA attention's last-bit
    # differences between the forest and separate passes get amplified (seen 1.6e-3).
    prompt = "The capital of France is"
    got = fp32_engine.score(prompt, options)
    expected = _exact_option_probs(fp32_engine, prompt, options)
    np.testing.assert_allclose([got[o] for o in options], expected, atol=1e-4)
    assert max(got, key=got.get) == " Paris"


@pytest.fixture(scope="module")
def fp32_engine() -> Engine:
    return Engine.from_pretrained("default", precision="fp32", warmup=False)


def test_forest_equals_questions_asked_alone(fp32_engine, int8_engine):
    # fp32 (XLA dots) agrees to rounding; int8 is bitwise: every reduction is a custom call.
    together = fp32_engine.decide(TICKET, QUESTIONS)["answers"]
    for qid, q in QUESTIONS.items():
        alone = fp32_engine.decide(TICKET, {qid: q})["answers"][qid]
        key = "noul" if q["type"] == "noul" else "probabilities"
        a, b = together[qid][key], alone[key]
        a, b = (list(a.values()), list(b.values())) if isinstance(a, dict) else ([a], [b])
        np.testing.assert_allclose(a, b, atol=1e-4, err_msg=qid)
    int8_engine.cache.clear()
    response = int8_engine.decide(TICKET, QUESTIONS)
    assert response["x_cached_tokens"] == 0  # cold cache
    for qid, q in QUESTIONS.items():
        alone = int8_engine.decide(TICKET, {qid: q})
        assert alone["answers"][qid] == response["answers"][qid]  # exact float equality
        assert alone["x_cached_tokens"] > 0  # the state came from the prefix cache
    shared = response["usage"]["input_tokens"]
    separate = sum(
        int8_engine.decide(TICKET, {k: v})["usage"]["input_tokens"] for k, v in QUESTIONS.items()
    )
    assert shared < separate, "the forest computes the shared state once"


def test_int8_decides_like_bf16(int8_engine, bf16_engine):
    flips, deltas = 0, []
    for state, q in AGREEMENT_SET:
        a = int8_engine.decide(state, {"q": q})["answers"]["q"]
        b = bf16_engine.decide(state, {"q": q})["answers"]["q"]
        if q["type"] == "noul":
            pa, pb = np.array([a["noul"]]), np.array([b["noul"]])
            flips += (pa[0] > 0.5) != (pb[0] > 0.5)
        else:
            pa = np.array(list(a["probabilities"].values()))
            pb = np.array(list(b["probabilities"].values()))
            flips += int(pa.argmax() != pb.argmax())
        deltas.append(np.abs(pa - pb).max())
    print(
        f"int8 vs bf16 on {len(AGREEMENT_SET)} decisions: {flips} flips, "
        f"max |dp| {max(deltas):.4f}, mean {np.mean(deltas):.4f}"
    )
    # Measured: without smoothing 1 flip in 8 (a near-tie noul), max |dp| 0.147, mean 0.056;
    # with the default smoothing 0 flips, max |dp| 0.087, mean 0.041.
    # A regression guard; the accuracy goal (|acc(int8) - acc(bf16)| <= 0.03 points on real
    # decision sets) is the accuracy issue's, with activation smoothing folded into the weights.
    assert flips <= 1 and max(deltas) < 0.2


def test_make_decide_fn_jits_and_matches_engine(int8_engine):
    from prism_jax import make_decide_fn
    from prism_jax.forest import build_forest
    from prism_jax.questions import parse_questions
    from prism_jax.scheduler import pad

    parsed = parse_questions(QUESTIONS)
    rendered = [int8_engine.renderer.render(TICKET, q) for q in parsed.values()]
    batch = {k: jnp.asarray(v) for k, v in pad(build_forest(rendered)).items()}
    probs = jax.jit(make_decide_fn(int8_engine.config))(int8_engine.params, batch)
    answers = int8_engine.decide(TICKET, QUESTIONS)["answers"]
    topic = list(answers["topic"]["probabilities"].values())
    np.testing.assert_allclose(np.asarray(probs[0, :3]), topic, rtol=1e-5)


def test_cli_json_and_table(capsys):
    args = [
        "decide",
        "--model",
        "default",
        "--state",
        TICKET,
        "--choice",
        "billing,technical",
        "--instructions",
        "What is this ticket about?",
    ]
    assert cli_main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["answers"]["answer"]["choice"] == "billing"
    assert cli_main(args) == 0
    assert "billing" in capsys.readouterr().out
    assert cli_main(["decide", "--state", "x"]) == 2
    assert "exactly one of" in capsys.readouterr().err


def test_text_the_tokenizer_refuses_is_a_request_error(int8_engine):
    from prism_jax.questions import DecisionRequestError

    with pytest.raises(DecisionRequestError, match="not valid Unicode") as err:
        int8_engine.decide("\ud800 broken", {"q": QUESTIONS["refund"]})
    assert err.value.status == 422
    ok, bad = int8_engine.decide_many(
        [(TICKET, {"q": QUESTIONS["refund"]}), ("\ud800", {"q": QUESTIONS["refund"]})]
    )
    assert "answers" in ok and isinstance(bad, DecisionRequestError)
