"""Auth: every route but /health needs the key; missing -> 403, wrong -> 401, both with
error_type authentication_error. Without a key any Authorization header is ignored."""

from __future__ import annotations

import pytest

from tests.serve.conftest import AUTH, make_client

NOUL = {"model": "fake", "state": "s", "questions": {"q": {"type": "noul", "instructions": "?"}}}
ROUTES = [
    ("POST", "/v1/systemone", NOUL),
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("POST", "/v1/completions", {"model": "fake", "prompt": "x", "max_tokens": 0}),
]


@pytest.mark.parametrize(("method", "path", "body"), ROUTES)
def test_missing_and_wrong_keys_are_refused(client, method, path, body):
    missing = client.request(method, path, json=body)
    wrong = client.request(method, path, json=body, headers={"Authorization": "Bearer nope"})
    assert missing.status_code == 403 and wrong.status_code == 401
    for r in (missing, wrong):
        assert r.json()["detail"]["error_type"] == "authentication_error"
        assert "API key" in r.json()["detail"]["message"]


def test_health_is_open_and_the_right_key_passes(client):
    assert client.get("/health").status_code == 200
    assert client.get("/v1/models", headers=AUTH).status_code == 200
    assert client.post("/v1/systemone", json=NOUL, headers=AUTH).status_code == 200


def test_without_a_key_any_authorization_header_is_accepted(fake_engine):
    with make_client(fake_engine, api_key=None) as client:
        for headers in ({}, {"Authorization": "Bearer whatever"}, {"Authorization": "junk"}):
            assert client.post("/v1/systemone", json=NOUL, headers=headers).status_code == 200
