"""Gateway Prometheus metrics on the app's own registry (no request ids, prompts or tokens).

Route labels are route *templates* (`/v1/responses/{id}`), never raw paths with ids in them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from services.common.heap import register_gc_metrics

_ROUTES = (
    "/v1/chat/completions", "/v1/completions", "/v1/messages/count_tokens", "/v1/messages",
    "/v1/models", "/api/chat", "/api/generate", "/api/tags", "/api/show", "/api/version",
    "/health", "/metrics", "/v1/embeddings", "/api/embed", "/api/embeddings", "/api/pull",
)


def route_label(path: str) -> str:
    """A bounded label for a request path."""
    if path in _ROUTES or path == "/":
        return path
    if path.startswith("/v1/models/"):
        return "/v1/models/{model}"
    if path == "/v1/responses":
        return path
    if path.startswith("/v1/responses/"):
        return "/v1/responses/{id}" + ("/" + path.rsplit("/", 1)[1]
                                       if path.count("/") > 3 else "")
    return "other"


class GatewayMetrics:
    def __init__(self, capacity: int, active: Callable[[], float]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        started = time.monotonic()
        self.requests = Counter("helios_gateway_requests", "HTTP responses by route and status",
                                ["route", "status"], registry=r)
        self.rejected = Counter("helios_gateway_admission_rejected",
                                "requests refused by HTTP admission", ["reason"], registry=r)
        self.errors = Counter("helios_gateway_errors", "failed requests by error kind",
                              ["kind"], registry=r)
        self.stream_errors = Counter("helios_gateway_stream_errors",
                                     "failures reported inside an already started stream",
                                     ["kind"], registry=r)
        self.disconnects = Counter("helios_gateway_client_disconnects",
                                   "requests cancelled because the client went away",
                                   registry=r)
        self.first_event = Histogram(
            "helios_gateway_time_to_first_event_seconds",
            "request admission to the first upstream event (prefill included)",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r)
        Gauge("helios_gateway_admission_capacity", "HTTP admission permits (queue + active)",
              registry=r).set(capacity)
        Gauge("helios_gateway_active_requests", "admitted HTTP requests in flight",
              registry=r).set_function(active)
        Gauge("helios_gateway_uptime_seconds", "seconds since the gateway started",
              registry=r).set_function(lambda: time.monotonic() - started)
        register_gc_metrics(r, "gateway")

    def watch_body_readers(self, capacity: int, active: Callable[[], float]) -> None:
        """Gauges of the body phase (requests still sending their body, `max_body_readers`)."""
        Gauge("helios_gateway_body_reader_capacity", "requests that may send their body at once",
              registry=self.registry).set(capacity)
        Gauge("helios_gateway_body_readers", "requests sending their body now",
              registry=self.registry).set_function(active)

    def render(self) -> bytes:
        return generate_latest(self.registry)


async def scrape_upstreams(urls: tuple[str, ...], timeout_s: float = 2.0) -> list[str]:
    """The /metrics texts of the other services (single-node runs); an upstream that does not
    answer is left out of this scrape rather than failing it."""
    import asyncio

    import httpx

    async def one(client: httpx.AsyncClient, url: str) -> str:
        try:
            response = await client.get(url)
        except httpx.HTTPError:
            return ""
        return response.text if response.status_code == 200 else ""

    async with httpx.AsyncClient(timeout=timeout_s) as client:
        texts = await asyncio.gather(*(one(client, url) for url in urls))
    return [text for text in texts if text]
