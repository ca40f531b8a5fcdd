"""/v1/completions on the real model: echo + logprobs agree with greedy continuation, and the
unimplemented parts are refused with a 400 that says what to send instead."""

from __future__ import annotations

import math

import pytest

pytestmark = pytest.mark.slow


def complete(server, **fields):
    return server.post("/v1/completions", {"model": "default", **fields})


def test_echo_logprobs_and_greedy_continuation(real_server):
    r = complete(
        real_server, prompt="The capital of France is", max_tokens=2, echo=True, logprobs=3
    )
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    lp = choice["logprobs"]
    assert choice["text"].startswith("The capital of France is")
    assert "".join(lp["tokens"]) == choice["text"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"])
    assert all(x <= 0 and math.isfinite(x) for x in lp["token_logprobs"])
    for token, top in zip(lp["tokens"][-2:], lp["top_logprobs"][-2:], strict=True):
        assert max(top, key=top.get) == token  # greedy: each generated token is the top one
    for token, value, top in zip(
        lp["tokens"], lp["token_logprobs"], lp["top_logprobs"], strict=True
    ):
        assert value <= max(top.values()) + 1e-6
        if token in top:
            assert top[token] == pytest.approx(value, abs=1e-5)
    usage = r.json()["usage"]
    assert usage["completion_tokens"] == 2
    assert usage["total_tokens"] == usage["prompt_tokens"] + 2


def test_scoring_only_matches_the_echoed_prefix(real_server):
    full = complete(
        real_server, prompt="The capital of France is Paris", max_tokens=0, echo=True, logprobs=0
    ).json()["choices"][0]["logprobs"]
    part = complete(
        real_server, prompt="The capital of France is", max_tokens=0, echo=True, logprobs=0
    ).json()["choices"][0]["logprobs"]
    n = len(part["token_logprobs"])
    assert full["token_logprobs"][:n] == pytest.approx(part["token_logprobs"], abs=1e-5)


def test_unimplemented_options_are_refused_clearly(real_server):
    for fields, needle in (
        ({"temperature": 0.7}, "temperature 0"),
        ({"n": 2}, "n = 1"),
        ({"stream": True}, "stream = false"),
        ({"max_tokens": 5000}, "at most 1024 tokens"),
    ):
        r = complete(real_server, prompt="Hello", **fields)
        assert r.status_code == 400 and needle in r.json()["detail"], (fields, r.text)
