"""/metrics: the vLLM-style names, decisions by type, engine numbers from the snapshot."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import AUTH

NAMES = (
    "prism:num_requests_running",
    "prism:num_requests_waiting",
    "prism:kv_cache_usage_perc",
    "prism:prefix_cache_hits",
    "prism:time_to_first_token_seconds",
    "prism:e2e_request_latency_seconds",
    "prism:decisions",
    "prism:shared_prefix_tokens",
)


def scrape(client) -> dict[str, float]:
    r = client.get("/metrics", headers=AUTH)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def test_names_and_counts(client, fake_engine):
    fake_engine.pages_used = 25
    before = scrape(client)
    for family in NAMES:
        assert any(k.startswith(family) for k in before), family
    questions = {
        "a": {"type": "noul", "instructions": "?"},
        "b": {"type": "choice", "criteria": {"x": None, "y": None}},
        "c": {"type": "choice", "criteria": {"x": None, "y": None}},
    }
    body = {"model": "fake", "state": "s", "questions": questions}
    assert client.post("/v1/systemone", json=body, headers=AUTH).status_code == 200
    after = scrape(client)
    assert (
        after["prism:decisions_total{type=choice}"]
        == before["prism:decisions_total{type=choice}"] + 2
    )
    assert (
        after["prism:decisions_total{type=noul}"] == before["prism:decisions_total{type=noul}"] + 1
    )
    assert (
        after["prism:e2e_request_latency_seconds_count"]
        == before["prism:e2e_request_latency_seconds_count"] + 1
    )
    assert after["prism:time_to_first_token_seconds_count"] >= 1
    assert after["prism:kv_cache_usage_perc"] == 0.25  # the engine snapshot after the step
    assert after["prism:prefix_cache_hits_total"] == 3
    assert after["prism:shared_prefix_tokens_total"] == 7
    assert after["prism:num_requests_running"] == 0 and after["prism:num_requests_waiting"] == 0
