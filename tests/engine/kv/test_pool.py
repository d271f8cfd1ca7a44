"""FencedIdPool: ids are reused only after the fence of their last use completed."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InternalError
from services.engine.kv.fences import FenceTimeline
from services.engine.kv.pool import FencedIdPool


def test_allocate_and_retire_behind_a_fence():
    pool = FencedIdPool(4)
    pages = pool.allocate(3)
    assert len(set(pages)) == 3 and pool.num_free == 1 and pool.num_owned == 3
    pool.retire(pages[:2], fence=5)
    assert pool.num_retiring == 2 and pool.num_free == 1
    assert not pool.can_allocate(2)
    assert pool.advance_completed(4) == ()
    assert sorted(pool.advance_completed(5)) == sorted(pages[:2])
    assert pool.num_free == 3 and pool.num_retiring == 0


def test_retire_with_completed_fence_frees_at_once():
    pool = FencedIdPool(2)
    pool.advance_completed(7)
    (page,) = pool.allocate(1)
    pool.retire([page], fence=7)
    assert pool.num_free == 2


def test_double_retire_and_foreign_ids_are_refused():
    pool = FencedIdPool(2)
    (page,) = pool.allocate(1)
    pool.retire([page], fence=3)
    with pytest.raises(InternalError, match="already retiring"):
        pool.retire([page], fence=4)
    with pytest.raises(InternalError, match="free"):
        pool.retire([1], fence=0)
    with pytest.raises(InternalError, match="out of range"):
        pool.retire([9], fence=0)
    with pytest.raises(InternalError):
        pool.allocate(5)


def test_fence_timeline_orders_completions():
    timeline = FenceTimeline()
    first, second = timeline.issue(), timeline.issue()
    assert (first, second, timeline.next_fence) == (1, 2, 3)
    timeline.complete(first)
    assert timeline.is_complete(1) and not timeline.is_complete(2)
    with pytest.raises(InternalError):
        timeline.complete(3)
    timeline.complete(2)
    with pytest.raises(InternalError):
        timeline.complete(1)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["alloc", "retire", "advance"]),
                          st.integers(1, 4)), max_size=60))
def test_no_id_is_reused_before_its_fence(ops):
    """Model: each retired id remembers its fence; an allocated id's fence must be complete."""
    pool = FencedIdPool(6)
    owned: list[int] = []
    last_fence: dict[int, int] = {}
    issued = completed = 0
    for op, n in ops:
        if op == "alloc" and pool.can_allocate(n):
            for page in pool.allocate(n):
                assert last_fence.get(page, 0) <= completed, "reused before its fence"
                owned.append(page)
        elif op == "retire" and owned:
            issued += 1
            fence = issued - (n % 2)       # sometimes an older, already issued fence
            batch, owned = owned[:n], owned[n:]
            pool.retire(batch, fence)
            for page in batch:
                last_fence[page] = fence
        elif op == "advance":
            completed = min(issued, completed + n)
            pool.advance_completed(completed)
        assert pool.num_free + pool.num_retiring + pool.num_owned == pool.capacity
        assert pool.num_owned == len(owned)
