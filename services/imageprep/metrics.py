"""Imageprep metrics on the service's own registry (no request labels, no image identities).

Counters are incremented by the service as it prepares and serves images; gauges read the
service's admission state and the memory tier's statistics at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from services.imageprep.cache.memory import MemoryStats

PREPARE_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class ImagePrepMetrics(Collector):
    def __init__(self, registry: CollectorRegistry, *, capacity: int,
                 pending: Callable[[], int], memory: Callable[[], MemoryStats | None]) -> None:
        self._capacity = capacity
        self._pending = pending
        self._memory = memory
        self.images = Counter("helios_imageprep_images",
                              "images by outcome: prepared (decoded now), retained (cache), "
                              "refused (decode or validation error)", ["outcome"],
                              registry=registry)
        for outcome in ("prepared", "retained", "refused"):
            self.images.labels(outcome)
        self.fetched = Counter("helios_imageprep_fetched_images",
                               "images whose tensors FetchPixels streamed", registry=registry)
        self.prepare_seconds = Histogram("helios_imageprep_prepare_seconds",
                                         "Prepare calls, admission to descriptors",
                                         buckets=PREPARE_BUCKETS, registry=registry)
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        return iter(())

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("helios_imageprep_capacity_images",
                                "images that may wait or be in preparation at once",
                                value=self._capacity)
        yield GaugeMetricFamily("helios_imageprep_pending_images",
                                "images waiting for or in preparation", value=self._pending())
        stats = self._memory()
        if stats is None:
            return
        yield GaugeMetricFamily("helios_imageprep_memory_cache_bytes",
                                "bytes of prepared tensors in the memory tier",
                                value=stats.num_bytes)
        yield GaugeMetricFamily("helios_imageprep_memory_cache_budget_bytes",
                                "the memory tier's byte budget", value=stats.budget_bytes)
        yield GaugeMetricFamily("helios_imageprep_memory_cache_images",
                                "prepared images in the memory tier", value=stats.num_images)
        for name, value in (("hits", stats.hits), ("misses", stats.misses),
                            ("evictions", stats.evictions)):
            yield CounterMetricFamily(f"helios_imageprep_memory_cache_{name}",
                                      f"memory tier {name}", value=value)
