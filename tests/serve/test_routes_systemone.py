"""POST /v1/systemone and GET /v1/models on the fake engine: shapes, limits, refusals."""

from __future__ import annotations

from tests.serve.conftest import AUTH
from tests.serve.fakes import expected_probs


def ask(client, questions, **extra):
    body = {"model": "fake", "state": "a ticket", "questions": questions, **extra}
    return client.post("/v1/systemone", json=body, headers=AUTH)


def test_answers_carry_the_wire_shapes(client):
    r = ask(
        client,
        {
            "n": {"type": "noul", "instructions": "?"},
            "c": {"type": "choice", "criteria": {"a": None, "b": "B", "c": None}},
            "s": {"type": "score", "criteria": ["low", {"x": 1}, ["y"]]},
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["model"] == "fake" and body["usage"]["output_tokens"] == 0
    assert set(body) == {"model", "answers", "usage", "x_cached_tokens"}
    c = body["answers"]["c"]
    assert c["choice"] == "c" and c["probabilities"]["c"] == expected_probs(3)[2]
    s = body["answers"]["s"]
    assert s["legend"] == {"0": "low", "1": {"x": 1}, "2": ["y"]}  # as the client sent them
    assert body["answers"]["n"]["noul"] == expected_probs(2)[0]


def test_jev_latest_is_an_alias_and_unknown_models_are_404(client):
    assert ask(client, {"q": {"type": "noul", "instructions": "?"}}, model="jev-latest")
    r = ask(client, {"q": {"type": "noul", "instructions": "?"}}, model="gpt-9")
    assert r.status_code == 404
    assert (
        r.json()["detail"]["error_type"] == "not_found" and "fake" in r.json()["detail"]["message"]
    )


def test_limits_are_400_and_state_the_limit(client):
    many = {f"o{i}": None for i in range(256)}
    r = ask(client, {"q": {"type": "choice", "criteria": many}})
    assert r.status_code == 400
    assert r.json() == {"detail": "Too many choices. Must have at most 255 choices."}
    r = ask(client, {"q": {"type": "score", "criteria": [str(i) for i in range(11)]}})
    assert r.status_code == 400 and "at most 10 levels" in r.json()["detail"]
    r = ask(client, {"q": {"type": "noul"}})
    assert r.status_code == 400 and "needs instructions" in r.json()["detail"]
    assert ask(client, {"q": {"type": "choice", "criteria": dict(list(many.items())[:255])}})


def test_schema_failures_are_422_with_locations(client):
    cases = [
        ({"q": {"instructions": "no type"}}, "union_tag_not_found"),
        ({"q": {"type": "boolean"}}, "union_tag_invalid"),
        ({"q": {"type": "score", "criteria": {"0": "a"}}}, "list_type"),
        ({"q": {"type": "choice", "criteria": {}}}, "too_short"),
        ({"q": {"type": "score", "criteria": ["a", None]}}, None),
        ({}, "too_short"),
    ]
    for questions, kind in cases:
        r = ask(client, questions)
        assert r.status_code == 422, questions
        items = r.json()["detail"]
        assert all(i["loc"][0] == "body" and i["msg"] and i["type"] for i in items)
        if kind:
            assert kind in {i["type"] for i in items}, items
    r = client.post("/v1/systemone", json={"model": "fake", "questions": {}}, headers=AUTH)
    assert ["body", "state"] in [i["loc"] for i in r.json()["detail"]]


def test_text_only_model_refuses_images_clearly(client):
    r = ask(
        client,
        {"q": {"type": "noul", "instructions": "?"}},
        assets={"img-1": {"type": "image", "part": "asset-0"}},
    )
    assert r.status_code == 400 and "text only" in r.json()["detail"]
    r = ask(client, {"q": {"type": "box", "instructions": "the dog"}})
    assert r.status_code == 400 and "box" in r.json()["detail"]
    r = client.post(
        "/v1/systemone", headers=AUTH, files={"request": ("request", b"{}", "application/json")}
    )
    assert r.status_code == 400 and "image assets" in r.json()["detail"]


def test_unknown_fields_are_ignored_and_models_are_listed(client):
    assert ask(client, {"q": {"type": "noul", "instructions": "?"}}, seed=7).status_code == 200
    models = client.get("/v1/models", headers=AUTH).json()["models"]
    assert [m["name"] for m in models] == ["fake", "jev-latest"]
    assert all(m["release_date"] == "2026-11-29" and m["description"] for m in models)


def test_unknown_routes_and_methods_are_json(client):
    r = client.get("/v1/nothing", headers=AUTH)
    assert r.status_code == 404 and r.json()["detail"]["error_type"] == "not_found"
    r = client.get("/v1/systemone", headers=AUTH)
    assert r.status_code == 405 and "POST /v1/systemone" in r.json()["detail"]["message"]


def test_engine_refusals_keep_their_status(client, fake_engine):
    from prism_jax.questions import DecisionRequestError

    def busy(requests):
        return [DecisionRequestError("KV pool busy: no free pages; retry later", status=503)]

    fake_engine.decide_many = busy
    r = ask(client, {"q": {"type": "noul", "instructions": "?"}})
    assert r.status_code == 503 and r.headers["Retry-After"] == "1"
    assert "retry later" in r.json()["detail"]["message"]


def test_a_dead_engine_thread_makes_health_503_and_requests_503(client, fake_engine):
    def broken():
        raise RuntimeError("device lost")

    fake_engine.stats = broken  # raised on the engine thread after the step
    r = ask(client, {"q": {"type": "noul", "instructions": "?"}})
    assert r.status_code == 503 and "device lost" in r.json()["detail"]["message"]
    health = client.get("/health")
    assert health.status_code == 503 and "device lost" in health.json()["reason"]
    assert ask(client, {"q": {"type": "noul", "instructions": "?"}}).status_code == 503


def test_while_draining_new_requests_get_503_and_health_says_so(client):
    client.app.state.server.draining = True
    r = ask(client, {"q": {"type": "noul", "instructions": "?"}})
    assert r.status_code == 503 and "shutting down" in r.json()["detail"]["message"]
    assert client.get("/health").status_code == 503
