"""64 concurrent clients x 20 requests each on the real model: no errors, every client gets
the answer its own request has when sent alone, and the KV page pool returns to its size."""

from __future__ import annotations

import concurrent.futures
import re

import httpx
import pytest

pytestmark = pytest.mark.slow

CLIENTS, EACH = 64, 20
STATES = [
    f"Order {n}: the parcel arrived {w}."
    for n, w in ((1, "broken"), (2, "on time"), (3, "late"), (4, "empty"))
]
QUESTION = {"ok": {"type": "noul", "instructions": "Is the customer happy?"}}


def _pages_used(server) -> float:
    text = httpx.get(
        server.url + "/metrics", headers={"Authorization": f"Bearer {server.key}"}, timeout=30
    ).text
    return float(re.search(r"^prism:kv_cache_pages_used (\S+)$", text, re.M).group(1))


def test_64_clients_x_20_requests(real_server):
    def body(i: int) -> dict:
        return {"model": "default", "state": STATES[i % len(STATES)], "questions": QUESTION}

    alone = [real_server.post("/v1/systemone", body(i)).json()["answers"] for i in range(4)]
    pages_before = _pages_used(real_server)

    def client(c: int) -> list[tuple[int, int, dict]]:
        out = []
        with httpx.Client(
            base_url=real_server.url,
            timeout=600,
            headers={"Authorization": f"Bearer {real_server.key}"},
        ) as h:
            for k in range(EACH):
                i = c + k
                r = h.post("/v1/systemone", json=body(i))
                out.append((i, r.status_code, r.json()))
        return out

    with concurrent.futures.ThreadPoolExecutor(CLIENTS) as pool:
        results = [x for xs in pool.map(client, range(CLIENTS)) for x in xs]
    assert len(results) == CLIENTS * EACH
    bad = [(s, b) for _, s, b in results if s != 200]
    assert not bad, bad[:3]
    wrong = [i for i, _, b in results if b["answers"] != alone[i % len(STATES)]]
    assert not wrong, f"{len(wrong)} answers differ from the same request sent alone"
    assert _pages_used(real_server) == pages_before
