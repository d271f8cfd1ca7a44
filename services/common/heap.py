"""A serving process's heap and Python's cyclic garbage collector.

A full (generation 2) collection scans every object the collector tracks. After start-up a
service holds 40,000-200,000 of them (its imports, torch and the model in the engine core,
templates, protobuf descriptors), so one full collection pauses the whole process: on the
2-core development box 45 ms in the gateway, 100 ms in imageprep and 100-140 ms in the engine
core (benchmarks/RESULTS.md, 2026-12-07). While serving, the collector starts one whenever
enough new objects have outlived two younger collections, which a burst of concurrent
requests makes likely. A pause in the gateway, the frontend or imageprep lands in the requests'
time to first token; one in the engine core stops the step loop, and the GPU runs dry once its
two submitted frames finish.

`freeze_startup_heap(service)` runs once, when a service is ready: it collects, then
`gc.freeze()` moves everything still alive into the permanent generation, which collections
never scan. What a process makes while serving is collected as before, and reference counting
still frees frozen objects that lose their last reference. `HELIOS_GC_FREEZE=0` leaves the heap
alone (the before of a benchmark).

`GcPauses` times every collection by generation through `gc.callbacks` into plain counters.
It takes no lock: a callback runs inside whatever allocation set the collection off, and a
lock that the interrupted code holds (a Prometheus value's, say) would deadlock it. The
counters become a Prometheus histogram when scraped (`gc_families`).
"""

from __future__ import annotations

import bisect
import gc
import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

log = logging.getLogger(__name__)

FREEZE_ENV = "HELIOS_GC_FREEZE"
# upper bounds (seconds) of the pause histogram's buckets; +Inf is added when exposed
PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
GENERATIONS = 3


@dataclass(frozen=True, slots=True)
class GcSnapshot:
    """Collections so far, per generation: counts per pause bucket (the last is above every
    bound), seconds in all and the longest pause; and the objects frozen at start-up."""

    buckets: tuple[tuple[int, ...], ...]
    seconds: tuple[float, ...]
    longest: tuple[float, ...]
    frozen: int

    def collections(self, generation: int) -> int:
        return sum(self.buckets[generation])


class GcPauses:
    """The process's collection timer (one per process: `GcPauses.install()`)."""

    _installed: GcPauses | None = None

    def __init__(self) -> None:
        self._buckets = [[0] * (len(PAUSE_BUCKETS) + 1) for _ in range(GENERATIONS)]
        self._seconds = [0.0] * GENERATIONS
        self._longest = [0.0] * GENERATIONS
        self._started = 0.0

    @classmethod
    def install(cls) -> GcPauses:
        """The process's timer, its callback registered on the first call."""
        if cls._installed is None:
            cls._installed = cls()
            gc.callbacks.append(cls._installed._callback)
        return cls._installed

    @classmethod
    def current(cls) -> GcPauses | None:
        """The process's timer if one was installed."""
        return cls._installed

    def _callback(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        pause = time.perf_counter() - self._started
        generation = info["generation"]
        self._buckets[generation][bisect.bisect_left(PAUSE_BUCKETS, pause)] += 1
        self._seconds[generation] += pause
        if pause > self._longest[generation]:
            self._longest[generation] = pause

    def snapshot(self) -> GcSnapshot:
        return GcSnapshot(tuple(tuple(b) for b in self._buckets), tuple(self._seconds),
                          tuple(self._longest), gc.get_freeze_count())


def freeze_startup_heap(service: str) -> int:
    """Collect, then freeze what survives (module docstring); the objects frozen (0 when
    `HELIOS_GC_FREEZE=0`)."""
    if os.environ.get(FREEZE_ENV, "1").strip() == "0":
        log.info("%s: the start-up heap stays unfrozen (%s=0)", service, FREEZE_ENV)
        return 0
    started = time.perf_counter()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.info("%s: froze the start-up heap", service,
             extra={"fields": {"objects": frozen,
                               "ms": round(1e3 * (time.perf_counter() - started), 1)}})
    return frozen


def gc_families(prefix: str, snap: GcSnapshot, owner: str) -> Iterator[Metric]:
    """`{prefix}_gc_pause_seconds` (a histogram by generation), `{prefix}_gc_pause_longest_seconds`
    and `{prefix}_gc_frozen_objects` for the process `owner` names in the help text."""
    pauses = HistogramMetricFamily(
        f"{prefix}_gc_pause_seconds", f"garbage-collector pauses of the {owner}, by "
        "generation (2: full collections)", labels=["generation"])
    for generation in range(GENERATIONS):
        cumulative, rows = 0, []
        for bound, count in zip((*PAUSE_BUCKETS, float("inf")), snap.buckets[generation],
                                strict=True):
            cumulative += count
            rows.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        pauses.add_metric([str(generation)], rows, sum_value=snap.seconds[generation])
    yield pauses
    longest = GaugeMetricFamily(f"{prefix}_gc_pause_longest_seconds", f"the {owner}'s longest "
                                "collector pause since it started, by generation",
                                labels=["generation"])
    for generation in range(GENERATIONS):
        longest.add_metric([str(generation)], snap.longest[generation])
    yield longest
    yield GaugeMetricFamily(f"{prefix}_gc_frozen_objects", f"objects the {owner} froze at "
                            "start-up (collections skip them)", value=snap.frozen)


class GcCollector(Collector):
    """This process's pauses on a registry, as `{prefix}_gc_*`."""

    def __init__(self, prefix: str, owner: str) -> None:
        self.prefix = prefix
        self.owner = owner
        self.pauses = GcPauses.install()

    def describe(self) -> Iterator[Metric]:
        return iter(())  # read at scrape time

    def collect(self) -> Iterator[Metric]:
        yield from gc_families(self.prefix, self.pauses.snapshot(), self.owner)


def register_gc_metrics(registry: CollectorRegistry, service: str) -> None:
    """`helios_{service}_gc_*` for this process on `registry`."""
    registry.register(GcCollector(f"helios_{service}", f"{service} process"))
