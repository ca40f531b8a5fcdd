"""A client that disconnects while waiting: its job is dropped before it reaches the engine."""

from __future__ import annotations

import asyncio

from prism_jax.serve.batcher import Batcher, BatchPolicy
from prism_jax.serve.config import ServeConfig
from prism_jax.serve.metrics import Metrics
from prism_jax.serve.state import ClientGone, ServerState
from tests.serve.fakes import FakeEngine


class _Request:
    """Just enough of a Starlette request: receive() reports a disconnect after `after` s."""

    def __init__(self, after: float) -> None:
        self.after = after

    async def receive(self) -> dict:
        await asyncio.sleep(self.after)
        return {"type": "http.disconnect"}


def test_disconnect_cancels_the_queued_job():
    engine = FakeEngine()
    engine.gate.clear()

    async def main():
        batcher = Batcher(engine, BatchPolicy(window_s=0.0, max_batch=8, max_queue=8))
        state = ServerState(ServeConfig(), engine, batcher, Metrics(lambda: (0, 0), dict))
        batcher.start()
        held = batcher.submit(request=("held", {"q": {"type": "noul", "instructions": "?"}}))
        await asyncio.sleep(0.1)
        job = state.submit(request=("gone", {"q": {"type": "noul", "instructions": "?"}}))
        try:
            await state.wait(_Request(after=0.05), job)
            raise AssertionError("the wait should end with ClientGone")
        except ClientGone:
            pass
        assert job.cancelled and batcher.waiting == 0
        engine.gate.set()
        await held.future
        await asyncio.sleep(0.1)
        batcher.close()

    asyncio.run(main())
    assert engine.steps == [1]  # only the held request ever ran
