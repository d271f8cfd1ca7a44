"""PreparationPool: large jobs never hold every worker; the memory releaser coalesces trims."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.frontend import memory
from services.frontend.generate.workers import PreparationPool

pytestmark = pytest.mark.timeout(60)


async def test_small_jobs_get_a_worker_while_large_ones_run():
    pool = PreparationPool(2)
    release = threading.Event()
    started = []

    def large(i: int) -> int:
        started.append(i)
        release.wait(20)
        return i

    try:
        bigs = [asyncio.create_task(pool.run(large, i, large=True)) for i in range(3)]
        await asyncio.sleep(0.1)
        assert started == [0]                # one of the two workers; the others wait
        assert await asyncio.wait_for(pool.run(lambda: "small"), 5) == "small"
        release.set()
        assert await asyncio.gather(*bigs) == [0, 1, 2]
    finally:
        release.set()
        pool.shutdown()


async def test_one_worker_is_shared_in_order():
    pool = PreparationPool(1)
    try:
        assert pool.large_slots == 1
        results = await asyncio.gather(pool.run(lambda: 1, large=True), pool.run(lambda: 2))
        assert results == [1, 2]
    finally:
        pool.shutdown()


async def test_one_trim_after_the_last_large_request(monkeypatch):
    monkeypatch.setattr(memory, "TRIM_DELAYS_S", (0.01, 0.02))
    calls = []
    releaser = memory.MemoryReleaser(trim=lambda: calls.append(1))
    assert not releaser.started(100)                 # small: nothing to do
    assert releaser.started(memory.LARGE_REQUEST_BYTES)
    assert releaser.started(memory.LARGE_REQUEST_BYTES)
    releaser.ended()
    await asyncio.sleep(0.05)
    assert calls == []                               # one is still running
    releaser.ended()
    for _ in range(500):                             # the trims run on a thread
        if releaser.num_trims == 2:
            break
        await asyncio.sleep(0.01)
    assert calls == [1, 1] and releaser.num_trims == 2   # soon, and once more later


def test_the_c_library_trim_is_found_here():
    assert memory.MemoryReleaser().available         # glibc on the test machine


def test_the_mmap_threshold_can_be_capped_here():
    assert memory.cap_mmap_threshold()               # glibc's mallopt accepts it
