"""The server's Prometheus metrics, in a registry of its own per app (two apps in one process never mix counts).

- ``inferscale_http_requests_total{route, method, status}``: requests answered, by route template (``/v1/memories``,
  ``/v1/memories/{memory_id}``; without the trailing slash, so both spellings count as one route; ``unmatched`` for
  an unknown path, never the raw path), by method (:data:`METHODS`; any other method, which a client may make up,
  counts as ``other``) and by status. Requests are counted before authentication, so no label takes a value the
  client chooses freely: the series stay few;
- ``inferscale_http_request_duration_seconds{route}``: a histogram of the time from the request's arrival to the
  last byte of its reply (a streamed chat's whole stream);
- ``inferscale_chat_prompt_tokens_total``, ``inferscale_chat_completion_tokens_total``,
  ``inferscale_chat_memory_tokens_total``: tokens of answered chats (the prompt, memory segment included; the
  generated answer; the memory segment alone);
- ``inferscale_kv_hits_total{tier}`` and ``inferscale_kv_misses_total{tier}``: fact K/V lookups answered, and not
  answered, by each tier of the K/V store (device, host, disk), read from the store's own counters at scrape time
  (:meth:`inferscale.derived.DerivedStores.kv_stats`). A lookup tries the tiers in order, so a tier's misses are the
  lookups that reached it: the hits of the tiers below it plus the lookups no tier answered.
- ``inferscale_kv_encode_pending``: a gauge of the memories the background K/V encoder has not finished (the batch it
  is encoding and those waiting, :meth:`inferscale.derived.DerivedStores.pending_encoding`), read at scrape time: a
  backlog that keeps growing means ``add`` outpaces the encoder, and chats encode on their own path.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from inferscale.async_client import AsyncMemoryClient
from inferscale.server.disconnects import CLIENT_CLOSED_REQUEST
from inferscale.types import ChatResult

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of the Prometheus text format."""

METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"})
"""The HTTP methods counted under their own name in ``inferscale_http_requests_total``; others count as
``other``."""


def method_label(method: str) -> str:
    """The ``method`` label of a request: the method when it is one of :data:`METHODS`, else ``"other"``."""
    return method if method in METHODS else "other"


def route_label(route: object, path: str = "", fixed_paths: frozenset[str] = frozenset()) -> str:
    """The ``route`` label of a request: the template of the API route that matched it (``scope["route"].path``,
    without the trailing slash); else the request's ``path`` when it is one of ``fixed_paths`` (FastAPI's
    ``/openapi.json``, ``/docs``, ``/redoc``, which leave no route in the scope); else ``"unmatched"``."""
    template = getattr(route, "path", None)
    if isinstance(template, str):
        return template.rstrip("/") or "/"
    return path if path in fixed_paths else "unmatched"


class KVCollector(Collector):
    """Reads the K/V store's hit and miss counters of ``client`` at each scrape (nothing before the first K/V use),
    and the background encoder's backlog."""

    def __init__(self, client: AsyncMemoryClient) -> None:
        self._client = client

    def collect(self) -> Iterator[Metric]:
        hits = CounterMetricFamily("inferscale_kv_hits", "Fact K/V lookups answered by a tier", labels=["tier"])
        misses = CounterMetricFamily(
            "inferscale_kv_misses", "Fact K/V lookups that reached a tier and were not answered by it", labels=["tier"]
        )
        stats = self._client.derived.kv_stats()
        if stats is not None:
            tiers = list(stats.hits)  # lookup order
            for i, tier in enumerate(tiers):
                hits.add_metric([tier], stats.hits[tier])
                misses.add_metric([tier], sum(stats.hits[t] for t in tiers[i + 1 :]) + stats.misses)
        yield hits
        yield misses
        yield GaugeMetricFamily(
            "inferscale_kv_encode_pending",
            "Memories the background K/V encoder has not finished (being encoded or waiting)",
            value=len(self._client.derived.pending_encoding()),
        )


class Metrics:
    """The metrics of one app.

    Args:
        client: the memory client, whose K/V store counters are exported.
    """

    def __init__(self, client: AsyncMemoryClient) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "inferscale_http_requests",
            "HTTP requests answered",
            ["route", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "inferscale_http_request_duration_seconds",
            "Time from a request's arrival to the end of its reply (seconds)",
            ["route"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "inferscale_chat_prompt_tokens", "Prompt tokens of answered chats, memory included", registry=self.registry
        )
        self.completion_tokens = Counter(
            "inferscale_chat_completion_tokens", "Tokens generated by answered chats", registry=self.registry
        )
        self.memory_tokens = Counter(
            "inferscale_chat_memory_tokens", "Memory-segment tokens of answered chats", registry=self.registry
        )
        self.registry.register(KVCollector(client))

    def observe_chat(self, result: ChatResult) -> None:
        """Count the tokens of one answered chat."""
        self.prompt_tokens.inc(result.prompt_tokens)
        self.completion_tokens.inc(result.generated_tokens)
        self.memory_tokens.inc(result.memory_tokens)

    def render(self) -> bytes:
        """The registry in the Prometheus text format."""
        return generate_latest(self.registry)


class RequestMetrics:
    """ASGI middleware: counts each HTTP request by route template, method and status in ``metrics``, and times
    it. ``fixed_paths``: paths of routes without a template in the scope (the docs), labelled by their path. A request
    that got no reply counts as 499 when its client disconnected (an upload cut short: the size limit stops reading),
    else as 500."""

    def __init__(self, app: ASGIApp, metrics: Metrics, fixed_paths: frozenset[str] = frozenset()) -> None:
        self.app = app
        self.metrics = metrics
        self.fixed_paths = fixed_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status: int | None = None  # no reply started
        gone = False  # the client disconnected

        async def receive_and_note() -> Message:
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive_and_note, send_and_note)
        finally:
            label = route_label(
                scope.get("route"), scope.get("path", ""), self.fixed_paths
            )  # set by the router on the scope it was given (this dict)
            if status is None:  # no reply: the client left (mid-upload, say), else the app failed before answering
                status = CLIENT_CLOSED_REQUEST if gone else 500
            self.metrics.requests.labels(label, method_label(scope["method"]), str(status)).inc()
            self.metrics.latency.labels(label).observe(time.perf_counter() - started)
