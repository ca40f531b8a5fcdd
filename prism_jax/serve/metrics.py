"""Prometheus metrics, named after vLLM's (`vllm:` -> `prism:`).

Counters are exposed with the `_total` suffix Prometheus adds (as vLLM's are). Engine numbers
(KV pool, prefix cache) come from the snapshot the engine thread takes after every step, so a
scrape never touches the engine. Time to first token is arrival -> the end of the forest step
that produced the answer (a decision's answer is its first and only output); end-to-end latency
is arrival -> response ready.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
QUESTION_TYPES = ("noul", "choice", "score")


class _Live(Collector):
    """Gauges and engine counters read at scrape time from callables."""

    def __init__(
        self, queue: Callable[[], tuple[int, int]], stats: Callable[[], Mapping[str, float]]
    ) -> None:
        self.queue = queue
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        running, waiting = self.queue()
        s = self.stats()
        yield GaugeMetricFamily(
            "prism:num_requests_running", "Requests in the forest step now running.", value=running
        )
        yield GaugeMetricFamily(
            "prism:num_requests_waiting", "Requests queued for the next step.", value=waiting
        )
        yield GaugeMetricFamily(
            "prism:kv_cache_usage_perc",
            "KV-cache usage, 0..1 (1 = every page in use).",
            value=float(s.get("kv_cache_usage_perc", 0.0)),
        )
        yield GaugeMetricFamily(
            "prism:kv_cache_pages_used", "KV pages in use.", value=float(s.get("kv_pages_used", 0))
        )
        yield GaugeMetricFamily(
            "prism:kv_cache_pages_total",
            "KV pages in the pool.",
            value=float(s.get("kv_pages_total", 0)),
        )
        for name, key, doc in (
            ("prism:prefix_cache_hits", "prefix_cache_hits", "Prefix-cache lookups that hit."),
            ("prism:prefix_cache_queries", "prefix_cache_queries", "Prefix-cache lookups."),
            (
                "prism:shared_prefix_tokens",
                "shared_prefix_tokens_total",
                "Tokens computed once for several questions or requests (forest or cache).",
            ),
        ):
            yield CounterMetricFamily(name, doc, value=float(s.get(key, 0)))


class Metrics:
    """The server's registry; one per app, so several apps can live in one process."""

    def __init__(
        self, queue: Callable[[], tuple[int, int]], stats: Callable[[], Mapping[str, float]]
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Live(queue, stats))
        self.ttft = Histogram(
            "prism:time_to_first_token_seconds",
            "Arrival to the end of the step that answered.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "prism:e2e_request_latency_seconds",
            "Arrival to response ready.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.decisions = Counter(
            "prism:decisions", "Questions answered, by type.", ["type"], registry=self.registry
        )
        self.step_seconds = Histogram(
            "prism:step_seconds",
            "Seconds per engine step.",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.step_requests = Histogram(
            "prism:step_requests",
            "Requests per engine step.",
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
            registry=self.registry,
        )
        for t in QUESTION_TYPES:
            self.decisions.labels(type=t)

    def observe_step(self, requests: int, seconds: float) -> None:
        self.step_seconds.observe(seconds)
        self.step_requests.observe(requests)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
