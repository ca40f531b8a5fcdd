"""ServerState: what every route needs (config, batcher, metrics), and the two steps every
route shares: admission (auth, draining) and waiting for the engine while watching the client."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from starlette.requests import Request

from prism_jax.serve import auth
from prism_jax.serve.batcher import Batcher, EngineClosed, Job, QueueFull
from prism_jax.serve.config import ServeConfig
from prism_jax.serve.errors import ApiError
from prism_jax.serve.metrics import Metrics


class ClientGone(Exception):
    """The client disconnected before its answer was ready; its work was dropped."""


@dataclasses.dataclass
class ServerState:
    config: ServeConfig
    engine: Any
    batcher: Batcher
    metrics: Metrics
    draining: bool = False
    fault: str | None = None  # set when the engine cannot serve (health -> 503)
    scorer: Any = None  # /v1/completions' jitted scorer, built on first use

    def admit(self, request: Request) -> None:
        auth.check(request, self.config.api_key)
        if self.draining:
            raise ApiError(
                503,
                "unavailable",
                "the server is shutting down; retry on another replica or after it restarts",
                {"Retry-After": "5"},
            )
        if self.fault is not None:
            raise ApiError(
                503, "unavailable", f"the engine cannot serve: {self.fault}", {"Retry-After": "30"}
            )

    def submit(self, **work: Any) -> Job:
        try:
            return self.batcher.submit(**work)
        except QueueFull as e:
            raise ApiError(
                429,
                "rate_limit_error",
                f"the server's queue is full ({self.config.batch.max_queue} requests waiting); "
                f"retry after {e.retry_after_s} s or lower your concurrency",
                {"Retry-After": str(e.retry_after_s)},
            ) from None
        except EngineClosed as e:
            raise ApiError(503, "unavailable", str(e), {"Retry-After": "5"}) from None

    async def wait(self, request: Request, job: Job) -> Any:
        """The job's result; if the client disconnects first, the job is dropped (ClientGone)."""
        watch = asyncio.ensure_future(_disconnected(request))
        try:
            await asyncio.wait({job.future, watch}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:  # the server gave up on this request (shutdown timeout)
            self.batcher.cancel(job)
            raise
        finally:
            watch.cancel()
        if not job.future.done():
            self.batcher.cancel(job)
            raise ClientGone()
        result = job.future.result()
        if isinstance(result, EngineClosed):
            raise ApiError(503, "unavailable", str(result), {"Retry-After": "5"})
        return result


async def _disconnected(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return
