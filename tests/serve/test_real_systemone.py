"""The real default model behind the HTTP server: the wire contract's numbers, forest
independence over HTTP, and the limits that only the engine knows (the context)."""

from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.slow

TICKET = "Hi, I was charged twice for my March invoice and want one charge refunded."
QUESTIONS = {
    "refund": {"type": "noul", "instructions": "Does the customer ask for money back?"},
    "team": {
        "type": "choice",
        "instructions": "Which team should handle it?",
        "criteria": {"Billing": "Payments and refunds", "Technical": None, "Sales": None},
    },
    "anger": {
        "type": "score",
        "instructions": "How upset is the customer?",
        "criteria": ["Calm", "Annoyed", "Furious"],
    },
}


def ask(server, questions, state=TICKET):
    r = server.post(
        "/v1/systemone", {"model": "jev-latest", "state": state, "questions": questions}
    )
    assert r.status_code == 200, r.text
    return r.json()


def test_answers_follow_the_reference_formulas(real_server):
    body = ask(real_server, QUESTIONS)
    assert body["model"] == "default" and body["usage"]["input_tokens"] > 0
    team = body["answers"]["team"]
    p = np.array(list(team["probabilities"].values()))
    assert abs(p.sum() - 1) < 1e-9 and team["choice"] == max(
        team["probabilities"], key=team["probabilities"].get
    )
    assert team["confidence"] == pytest.approx((p.max() - 1 / 3) / (1 - 1 / 3))
    anger = body["answers"]["anger"]
    q = np.array([anger["probabilities"][str(i)] for i in range(3)])
    assert anger["score"] == pytest.approx(float(np.dot(np.arange(3), q)))
    k, spread = int(np.argmax(q)), np.mean(np.abs(np.arange(3) - 1.0))
    assert anger["confidence"] == pytest.approx(
        max(0.0, 1 - float(np.sum(q * np.abs(np.arange(3) - k))) / spread)
    )
    assert anger["legend"] == {"0": "Calm", "1": "Annoyed", "2": "Furious"}
    assert 0.0 <= body["answers"]["refund"]["noul"] <= 1.0


def test_each_answer_equals_the_question_asked_alone_and_renamed(real_server):
    together = ask(real_server, QUESTIONS)["answers"]
    for qid, q in QUESTIONS.items():
        alone = ask(real_server, {f"renamed-{qid}": q})["answers"][f"renamed-{qid}"]
        assert alone == together[qid], qid  # bit for bit, through JSON


def test_prompt_over_the_context_is_400_with_the_limit(real_server):
    r = real_server.post(
        "/v1/systemone",
        {"model": "default", "state": "word " * 40000, "questions": {"q": QUESTIONS["refund"]}},
    )
    assert r.status_code == 400
    assert "too long" in r.json()["detail"] and "32768" in r.json()["detail"]  # the context


def test_metrics_after_real_requests(real_server):
    import httpx

    text = httpx.get(
        real_server.url + "/metrics", headers={"Authorization": f"Bearer {real_server.key}"}
    ).text
    assert 'prism:decisions_total{type="choice"}' in text
    assert "prism:kv_cache_usage_perc" in text and "prism:e2e_request_latency_seconds_count" in text
