"""Prometheus metrics plumbing shared by the gRPC services (no request labels, prompts or ids).

Each service keeps its metrics on its own `CollectorRegistry` (created at startup, passed
explicitly: no module-level metric globals) and serves it over HTTP on `metrics_listen`
(host:port; '' = off) from a daemon thread. `merge_exposition` lets the gateway's /metrics
show the whole single-node picture: its own text plus each upstream service's.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, generate_latest, start_http_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from services.common.errors import ValidationError
from services.common.heap import register_gc_metrics

log = logging.getLogger(__name__)

# Exposition-format families every process has; the first occurrence wins when merging.
PROCESS_PREFIXES = ("process_", "python_")


def parse_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValidationError(f"metrics_listen must be host:port, got {listen!r}",
                              param="metrics_listen")
    return host.strip("[]") or "0.0.0.0", int(port)


def service_registry(service: str) -> CollectorRegistry:
    """A fresh registry with what every service has: seconds since its listener started, and
    its garbage-collector pauses (services/common/heap.py)."""
    registry = CollectorRegistry()
    started = time.monotonic()
    Gauge(f"helios_{service}_uptime_seconds", f"seconds since the {service} listener started",
          registry=registry).set_function(lambda: time.monotonic() - started)
    register_gc_metrics(registry, service)
    return registry


@dataclass
class MetricsEndpoint:
    """The HTTP server exposing one registry (prometheus_client's threaded server)."""

    port: int
    _server: object
    _thread: object

    @classmethod
    def start(cls, listen: str, registry: CollectorRegistry) -> MetricsEndpoint:
        host, port = parse_listen(listen)
        server, thread = start_http_server(port, addr=host, registry=registry)
        bound = server.server_address[1]
        log.info("metrics listening", extra={"fields": {"metrics": f"http://{host}:{bound}/metrics"}})
        return cls(bound, server, thread)

    def stop(self) -> None:
        self._server.shutdown()  # type: ignore[attr-defined]
        self._server.server_close()  # type: ignore[attr-defined]


class _ParsedFamilies(Collector):
    def __init__(self, families: list) -> None:
        self._families = families

    def collect(self) -> Iterable:
        return iter(self._families)


def merge_exposition(texts: Iterable[str]) -> bytes:
    """One valid exposition from several: a metric family keeps its first occurrence (the
    process_/python_ families every process has), the rest are concatenated in order."""
    seen: set[str] = set()
    kept = []
    for text in texts:
        for family in text_string_to_metric_families(text):
            if family.name in seen:
                continue
            seen.add(family.name)
            kept.append(family)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_ParsedFamilies(kept))
    return generate_latest(registry)
