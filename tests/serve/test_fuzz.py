"""Property-based fuzz of request bodies: whatever arrives, no 5xx and a JSON body.

Broad and fast on the fake engine; a smaller run on the real model, where valid-looking
bodies reach the tokenizer and the forest."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.serve.conftest import AUTH

text = st.text(st.characters(exclude_categories=()), max_size=40)  # surrogates too
json_leaf = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | text
json_value = st.recursive(
    json_leaf,
    lambda c: st.lists(c, max_size=4) | st.dictionaries(text, c, max_size=4),
    max_leaves=12,
)
content = text | st.dictionaries(text, json_leaf, max_size=3) | st.lists(text, max_size=3)
question = st.fixed_dictionaries(
    {"type": st.sampled_from(["noul", "choice", "score", "box", "boolean", ""]) | json_leaf},
    optional={
        "instructions": content | json_leaf,
        "criteria": st.dictionaries(text, content | st.none(), max_size=6)
        | st.lists(content, max_size=12)
        | json_value,
    },
)
body = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from(["jev-latest", "default", "fake", "x"]) | json_leaf,
        "state": content | json_value,
        "questions": st.dictionaries(text, question, max_size=3) | json_value,
        "assets": json_value,
    },
)
raw = body.map(lambda b: json.dumps(b).encode()) | st.binary(max_size=200)


def _check(r, payload: bytes) -> None:
    assert r.status_code < 500, payload[:300]
    assert "Traceback" not in r.text
    r.json()


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=raw)
def test_fake_engine_never_5xx(client, data):
    r = client.post(
        "/v1/systemone", content=data, headers={**AUTH, "Content-Type": "application/json"}
    )
    _check(r, data)


@pytest.mark.slow
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(data=raw)
def test_real_model_never_5xx(real_server, data):
    r = httpx.post(
        real_server.url + "/v1/systemone",
        content=data,
        timeout=300,
        headers={**AUTH, "Content-Type": "application/json"},
    )
    _check(r, data)
