"""The start-up heap freeze and the collector-pause histogram (services/common/heap.py)."""

from __future__ import annotations

import gc
import pickle

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from services.common import heap


@pytest.fixture
def unfrozen():
    """Leave the test process's heap as it was: unfreeze whatever a test froze."""
    before = gc.get_freeze_count()
    assert before == 0, "the test process's heap is frozen already"
    yield
    gc.unfreeze()


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_freeze_moves_the_live_heap_out_of_collections(unfrozen):
    alive = [_Cycle() for _ in range(1000)]
    frozen = heap.freeze_startup_heap("test")
    assert frozen == gc.get_freeze_count() > len(alive)
    # a full collection now scans only what was made after the freeze
    made_after = [_Cycle() for _ in range(10)]
    del made_after
    assert gc.collect() >= 10            # the cycles made after the freeze are still freed
    assert alive[0].me is alive[0]


def test_freeze_can_be_switched_off(unfrozen, monkeypatch):
    monkeypatch.setenv(heap.FREEZE_ENV, "0")
    assert heap.freeze_startup_heap("test") == 0
    assert gc.get_freeze_count() == 0


def test_every_collection_is_timed_by_generation():
    pauses = heap.GcPauses.install()
    assert heap.GcPauses.install() is pauses and heap.GcPauses.current() is pauses
    assert gc.callbacks.count(pauses._callback) == 1
    before = pauses.snapshot()
    for generation in (0, 1, 2, 2):
        gc.collect(generation)
    after = pauses.snapshot()
    counts = [after.collections(g) - before.collections(g) for g in range(3)]
    assert counts[0] >= 1 and counts[1] >= 1 and counts[2] >= 2
    assert after.seconds[2] > before.seconds[2]
    assert 0 < after.longest[2] <= after.seconds[2]
    assert pickle.loads(pickle.dumps(after)) == after     # it travels in the load snapshot


def test_the_histogram_exposes_cumulative_buckets():
    snap = heap.GcSnapshot(
        buckets=((3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), (0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0),
                 (0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1)),
        seconds=(0.0003, 0.0016, 0.74), longest=(0.0002, 0.0009, 0.7), frozen=1234)
    registry = CollectorRegistry()

    class Fixed(heap.GcCollector):
        def collect(self):
            yield from heap.gc_families(self.prefix, snap, self.owner)

    registry.register(Fixed("helios_probe", "probe process"))
    families = {f.name: f for f in text_string_to_metric_families(
        generate_latest(registry).decode())}
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for s in families["helios_probe_gc_pause_seconds"].samples}
    assert samples[("helios_probe_gc_pause_seconds_count", (("generation", "2"),))] == 2
    assert samples[("helios_probe_gc_pause_seconds_sum", (("generation", "2"),))] == 0.74
    assert samples[("helios_probe_gc_pause_seconds_bucket",
                    (("generation", "2"), ("le", "0.05")))] == 1
    assert samples[("helios_probe_gc_pause_seconds_bucket",
                    (("generation", "2"), ("le", "0.5")))] == 1
    assert samples[("helios_probe_gc_pause_seconds_bucket",
                    (("generation", "2"), ("le", "+Inf")))] == 2
    assert samples[("helios_probe_gc_pause_seconds_bucket",
                    (("generation", "0"), ("le", "0.0005")))] == 3
    longest = {s.labels["generation"]: s.value
               for s in families["helios_probe_gc_pause_longest_seconds"].samples}
    assert longest == {"0": 0.0002, "1": 0.0009, "2": 0.7}
    (frozen,) = families["helios_probe_gc_frozen_objects"].samples
    assert frozen.value == 1234
