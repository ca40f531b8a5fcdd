"""The gathering window: decisions that arrive together run as one forest step.

One worker thread owns the engine (it is not thread-safe). When it is idle, the first request
opens a window of `window_s`; everything that arrives inside it, up to `max_batch` requests,
goes into one `engine.decide_many` call. Requests that arrive while a step runs are already
gathered when it ends, so they start at once. A lone request waits at most `window_s`.

Backpressure: at most `max_queue` requests wait; the next one gets QueueFull (-> 429).
A request whose client went away is dropped before its step starts (`cancel`); if its step
is already running, its answer is discarded when the step ends.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from prism_jax.questions import DecisionRequestError

log = logging.getLogger("prism_jax.serve")


@dataclasses.dataclass(frozen=True)
class BatchPolicy:
    window_s: float = 0.005
    max_batch: int = 16
    max_queue: int = 256


class QueueFull(Exception):
    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"the queue is full; retry after {retry_after_s} s")
        self.retry_after_s = retry_after_s


class EngineClosed(Exception):
    """The server is shutting down and no longer runs new work."""


@dataclasses.dataclass(eq=False)
class Job:
    """One queued unit: a decision (batchable) or an exclusive call on the engine."""

    loop: asyncio.AbstractEventLoop
    future: asyncio.Future
    request: tuple[Any, Mapping[str, Any]] | None = None
    call: Callable[[Any], Any] | None = None
    arrived: float = dataclasses.field(default_factory=time.monotonic)
    cancelled: bool = False

    def deliver(self, result: Any) -> None:
        """Hands a result (an answer, or the exception that refuses it) to the waiting request."""

        def finish() -> None:
            if not self.future.done():
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(finish)
        except RuntimeError:
            pass  # the loop is closed: nobody is waiting any more


class Batcher:
    """Queue + worker thread around an engine with `decide_many` and `stats`."""

    def __init__(
        self, engine: Any, policy: BatchPolicy, on_step: Callable[[int, float], None] | None = None
    ) -> None:
        self.engine = engine
        self.policy = policy
        self.on_step = on_step or (lambda n, s: None)
        self._pending: collections.deque[Job] = collections.deque()
        self._cond = threading.Condition()
        self._closed = False
        self.fault: str | None = None  # why the engine thread stopped, if it did
        self.running = 0
        self.stats: dict[str, float] = dict(engine.stats())
        self.step_seconds = 0.5  # running estimate, for Retry-After
        self._thread = threading.Thread(target=self._loop, name="prism-engine", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    @property
    def waiting(self) -> int:
        return len(self._pending)

    def submit(
        self,
        request: tuple[Any, Mapping[str, Any]] | None = None,
        call: Callable[[Any], Any] | None = None,
    ) -> Job:
        """Queues a decision or an exclusive engine call (from the event loop)."""
        loop = asyncio.get_running_loop()
        job = Job(loop, loop.create_future(), request, call)
        with self._cond:
            if self._closed:
                raise EngineClosed("the server is shutting down")
            if len(self._pending) >= self.policy.max_queue:
                raise QueueFull(self._retry_after())
            self._pending.append(job)
            self._cond.notify()
        return job

    def cancel(self, job: Job) -> None:
        """The client went away: drop the job if it has not started."""
        with self._cond:
            job.cancelled = True
            try:
                self._pending.remove(job)
            except ValueError:
                pass  # already running; its result is discarded

    def close(self) -> None:
        """Stops taking work; queued jobs fail with EngineClosed, the running step finishes."""
        with self._cond:
            self._closed = True
            left = list(self._pending)
            self._pending.clear()
            self._cond.notify_all()
        for job in left:
            job.deliver(EngineClosed("the server shut down before this request ran"))

    def join(self, timeout: float | None = None) -> None:
        self._thread.join(timeout)

    def _retry_after(self) -> int:
        steps = len(self._pending) / max(1, self.policy.max_batch) + 1
        return max(1, round(steps * self.step_seconds))

    # --- worker thread --------------------------------------------------------------------

    def _take(self) -> list[Job] | None:
        """Blocks for the next batch: one exclusive call, or up to max_batch decisions."""
        with self._cond:
            while not self._pending and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            if self._pending[0].call is not None:
                return [self._pending.popleft()]
            deadline = self._pending[0].arrived + self.policy.window_s
            while len(self._decisions()) < self.policy.max_batch and not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            batch = self._decisions()[: self.policy.max_batch]
            for job in batch:
                self._pending.remove(job)
            self.running = len(batch)
            return batch

    def _decisions(self) -> list[Job]:
        out = []
        for job in self._pending:
            if job.call is not None:
                break  # keep arrival order around exclusive calls
            out.append(job)
        return out

    def _loop(self) -> None:
        batch: list[Job] | None = None
        try:
            while (batch := self._take()) is not None:
                self._step(batch)
        except BaseException as e:  # the engine thread must not die silently
            log.exception("the engine thread stopped")
            self.fault = f"the engine thread stopped: {type(e).__name__}: {e}"
            self.close()
            for job in batch or []:
                job.deliver(EngineClosed(self.fault))

    def _step(self, batch: list[Job]) -> None:
        start = time.monotonic()
        try:
            if batch[0].call is not None:
                self.running = 1
                results = [_guarded(batch[0].call, self.engine)]
            else:
                results = run_decisions(self.engine, [j.request for j in batch])
            self.stats = dict(self.engine.stats())
        finally:
            self.running = 0
        seconds = time.monotonic() - start
        self.step_seconds = 0.8 * self.step_seconds + 0.2 * seconds
        self.on_step(len(batch), seconds)
        for job, result in zip(batch, results, strict=True):
            if not job.cancelled:
                job.deliver(result)


def _guarded(fn: Callable[[Any], Any], engine: Any) -> Any:
    try:
        return fn(engine)
    except Exception as e:  # delivered to the waiting request, which turns it into a response
        return e


def run_decisions(engine: Any, requests: list[Any]) -> list[Any]:
    """decide_many with isolation: if the joint step fails (one request too long for the step,
    or a fault), each request runs alone so only the one at fault gets the error."""
    try:
        return list(engine.decide_many(requests))
    except Exception as err:
        if len(requests) == 1:
            if not isinstance(err, DecisionRequestError):
                log.exception("the engine failed on a request")
            return [err]
        log.info("a step of %d requests failed (%s); running them one by one", len(requests), err)
        return [r for req in requests for r in run_decisions(engine, [req])]
