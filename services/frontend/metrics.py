"""Frontend metrics on the service's own registry (no request labels, prompts or ids).

The frontend's capacity is its preparation pool (`frontend_workers` threads) plus the Generate
streams it relays; latency is measured from the Generate call to the first visible event
(text, reasoning or tool call) and to the last event.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from services.common.api.events import (
    GenerationEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)
from services.frontend.generate.workers import PreparationPool

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                   60.0, 120.0, 300.0, 900.0)
OUTCOMES = ("completed", "failed", "cancelled")


class FrontendMetrics:
    def __init__(self, registry: CollectorRegistry, pool: PreparationPool,
                 active: Callable[[], float]) -> None:
        self.requests = Counter("helios_frontend_requests", "Generate requests by outcome",
                                ["outcome"], registry=registry)
        for outcome in OUTCOMES:
            self.requests.labels(outcome)  # present from the first scrape, at zero
        self.errors = Counter("helios_frontend_errors", "failed Generate requests by error kind",
                              ["kind"], registry=registry)
        self.prompt_tokens = Counter("helios_frontend_prompt_tokens",
                                     "prompt tokens of finished Generate requests",
                                     registry=registry)
        self.output_tokens = Counter("helios_frontend_output_tokens",
                                     "output tokens of finished Generate requests",
                                     registry=registry)
        self.first_event = Histogram("helios_frontend_time_to_first_token_seconds",
                                     "Generate call to its first text, reasoning or tool event",
                                     buckets=LATENCY_BUCKETS, registry=registry)
        self.duration = Histogram("helios_frontend_request_duration_seconds",
                                  "Generate call to its last event", buckets=LATENCY_BUCKETS,
                                  registry=registry)
        Gauge("helios_frontend_active_requests", "Generate streams in flight",
              registry=registry).set_function(active)
        Gauge("helios_frontend_workers", "preparation workers (frontend capacity)",
              registry=registry).set(pool.workers)
        Gauge("helios_frontend_workers_busy", "preparation workers preparing a request",
              registry=registry).set_function(lambda: pool.num_running)
        Gauge("helios_frontend_preparation_waiting", "requests waiting for a preparation worker",
              registry=registry).set_function(lambda: pool.num_waiting)

    def request(self) -> RequestTimer:
        return RequestTimer(self)


class RequestTimer:
    """Observes one Generate stream: call `event()` per event, then one of the endings."""

    def __init__(self, metrics: FrontendMetrics) -> None:
        self._metrics = metrics
        self._started = time.monotonic()
        self._first_seen = False

    def event(self, event: GenerationEvent) -> None:
        if not self._first_seen and isinstance(event, TextDelta | ReasoningDelta | ToolCallDelta):
            self._first_seen = True
            self._metrics.first_event.observe(time.monotonic() - self._started)
        elif isinstance(event, UsageReport):
            self._metrics.prompt_tokens.inc(event.usage.prompt_tokens)
            self._metrics.output_tokens.inc(event.usage.completion_tokens)

    def completed(self) -> None:
        self._metrics.requests.labels("completed").inc()
        self._metrics.duration.observe(time.monotonic() - self._started)

    def failed(self, kind: str) -> None:
        self._metrics.requests.labels("failed").inc()
        self._metrics.errors.labels(kind).inc()

    def cancelled(self) -> None:
        self._metrics.requests.labels("cancelled").inc()
