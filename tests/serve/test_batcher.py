"""The gathering window, backpressure, cancellation and fault isolation, on the fake engine."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from prism_jax.questions import DecisionRequestError
from prism_jax.serve.batcher import Batcher, BatchPolicy, EngineClosed, QueueFull
from tests.serve.conftest import AUTH, make_client
from tests.serve.fakes import FakeEngine

NOUL = {"q": {"type": "noul", "instructions": "?"}}


def _run(coro):
    return asyncio.run(coro)


def test_requests_arriving_together_share_one_step():
    engine = FakeEngine()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.2, max_batch=8, max_queue=64))
        b.start()
        jobs = [b.submit(request=(f"s{i}", NOUL)) for i in range(5)]
        results = await asyncio.gather(*(j.future for j in jobs))
        b.close()
        return results

    results = _run(main())
    assert engine.steps == [5]
    assert all(r["answers"]["q"]["type"] == "noul" for r in results)


def test_a_lone_request_waits_at_most_the_window():
    engine = FakeEngine()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.3, max_batch=8, max_queue=64))
        b.start()
        start = time.monotonic()
        await b.submit(request=("s", NOUL)).future
        b.close()
        return time.monotonic() - start

    waited = _run(main())
    assert 0.3 <= waited < 0.3 + 0.4  # the whole window (it gathers), then no more than slack
    assert engine.steps == [1]


def test_max_batch_splits_and_work_arriving_during_a_step_is_next():
    engine = FakeEngine()
    engine.gate.clear()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.0, max_batch=4, max_queue=64))
        b.start()
        first = b.submit(request=("s", NOUL))
        await asyncio.sleep(0.1)  # the first step is now held at the gate
        rest = [b.submit(request=(f"s{i}", NOUL)) for i in range(6)]
        assert b.waiting == 6 and b.running == 1
        engine.gate.set()
        await asyncio.gather(first.future, *(j.future for j in rest))
        b.close()

    _run(main())
    assert engine.steps == [1, 4, 2]


def test_full_queue_raises_with_a_retry_hint():
    engine = FakeEngine()
    engine.gate.clear()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.0, max_batch=1, max_queue=2))
        b.start()
        held = b.submit(request=("s", NOUL))
        await asyncio.sleep(0.1)
        b.submit(request=("a", NOUL))
        b.submit(request=("b", NOUL))
        with pytest.raises(QueueFull) as err:
            b.submit(request=("c", NOUL))
        assert err.value.retry_after_s >= 1
        engine.gate.set()
        await held.future
        b.close()

    _run(main())


def test_cancelled_jobs_never_reach_the_engine():
    engine = FakeEngine()
    engine.gate.clear()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.0, max_batch=8, max_queue=64))
        b.start()
        held = b.submit(request=("s", NOUL))
        await asyncio.sleep(0.1)
        gone = [b.submit(request=(f"g{i}", NOUL)) for i in range(3)]
        kept = b.submit(request=("k", NOUL))
        for job in gone:
            b.cancel(job)
        assert b.waiting == 1
        engine.gate.set()
        await asyncio.gather(held.future, kept.future)
        b.close()

    _run(main())
    assert engine.steps == [1, 1]


def test_a_step_that_fails_is_retried_one_by_one_so_only_the_culprit_fails():
    engine = FakeEngine()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.2, max_batch=8, max_queue=64))
        b.start()
        jobs = [b.submit(request=(s, NOUL)) for s in ("ok1", "TOO-LONG", "ok2")]
        out = await asyncio.gather(*(j.future for j in jobs))
        b.close()
        return out

    ok1, bad, ok2 = _run(main())
    assert isinstance(bad, DecisionRequestError) and "too long" in bad.detail
    assert ok1["answers"] and ok2["answers"]
    assert engine.steps == [3, 1, 1, 1]


def test_close_fails_queued_jobs_and_refuses_new_ones():
    engine = FakeEngine()
    engine.gate.clear()

    async def main():
        b = Batcher(engine, BatchPolicy(window_s=0.0, max_batch=1, max_queue=8))
        b.start()
        held = b.submit(request=("s", NOUL))
        await asyncio.sleep(0.1)
        queued = b.submit(request=("q", NOUL))
        b.close()
        assert isinstance(await queued.future, EngineClosed)
        with pytest.raises(EngineClosed):
            b.submit(request=("late", NOUL))
        engine.gate.set()
        assert (await held.future)["answers"]  # the running step still finishes
        b.join(5)
        assert not b.alive

    _run(main())


def test_http_full_queue_is_429_with_retry_after():
    engine = FakeEngine()
    engine.gate.clear()
    body = {"model": "fake", "state": "s", "questions": NOUL}
    with make_client(engine, batch=BatchPolicy(window_s=0.0, max_batch=1, max_queue=1)) as c:
        statuses: list[int] = []

        def post():
            statuses.append(c.post("/v1/systemone", json=body, headers=AUTH).status_code)

        threads = [threading.Thread(target=post) for _ in range(2)]
        for t in threads:
            t.start()
            time.sleep(0.5)  # one runs (held at the gate), one waits: the queue is full
        r = c.post("/v1/systemone", json=body, headers=AUTH)
        assert r.status_code == 429
        assert int(r.headers["Retry-After"]) >= 1
        assert r.json()["detail"]["error_type"] == "rate_limit_error"
        engine.gate.set()
        for t in threads:
            t.join(10)
        assert statuses == [200, 200]
