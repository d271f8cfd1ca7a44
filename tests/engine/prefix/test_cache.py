"""PrefixCheckpointCache rules, one test per rule of the reference design."""

from __future__ import annotations

import hashlib

import pytest

from services.common.errors import InternalError
from services.engine.prefix.cache import PrefixCheckpointCache
from services.engine.prefix.history import ConditioningEvent, PrefixHistory
from services.engine.prefix.records import PublishOutcome

IDENTITY = hashlib.blake2b(b"model", digest_size=32).digest()
P = 16  # page size


def make_cache(pages: int = 64, snapshots: int = 8) -> PrefixCheckpointCache:
    return PrefixCheckpointCache(page_size=P, num_pages=pages, num_snapshots=snapshots)


def history(n: int, offset: int = 0) -> PrefixHistory:
    return PrefixHistory(IDENTITY, [offset + i for i in range(n)])


def test_publish_created_joins_lookup_only_after_its_fence():
    cache = make_cache()
    h = history(100)
    pub = cache.publish(h, 100, None, range(6), snapshot_id=0, ready_fence=3)
    assert pub.outcome is PublishOutcome.CREATED and pub.checkpoint.endpoint == 100
    assert cache.lookup(h).checkpoint is None          # reserved but not ready
    assert cache.advance_completed(2).published == ()
    assert cache.lookup(h).checkpoint is None
    advance = cache.advance_completed(3)
    assert advance.published == (pub.checkpoint,)
    hit = cache.lookup(h)
    assert hit.checkpoint == pub.checkpoint and hit.page_ids == tuple(range(6))


def test_a_tail_checkpoint_serves_only_hits_that_prefill_on():
    """A checkpoint published with resumable=False (its row saved no hidden state) is never
    a full-prompt hit; a longer prompt on its history hits it, and so does a host-tier cut at
    its endpoint (block_at_limit)."""
    cache = make_cache()
    h = history(100)
    below = cache.publish(h, 40, None, range(2), snapshot_id=0, ready_fence=1)
    tail = cache.publish(h, 70, below.checkpoint, range(2, 4), snapshot_id=1, ready_fence=1,
                         resumable=False)
    cache.advance_completed(1)
    assert below.checkpoint.resumes and not tail.checkpoint.resumes
    assert not tail.checkpoint.is_block and tail.checkpoint.snapshot_id == 1
    assert cache.lookup(h).checkpoint == tail.checkpoint               # 100 > 70: prefill on
    assert cache.lookup(h, 71).page_ids == tuple(range(4))
    assert cache.lookup(h, 70, block_at_limit=True).checkpoint == tail.checkpoint
    exact = cache.lookup(h, 70).checkpoint     # exactly 70: not it, the block below it
    assert exact is not None and exact.is_block and exact.endpoint == 64


def test_existing_outcome_leaves_resources_with_the_caller():
    cache = make_cache()
    h = history(40)
    first = cache.publish(h, 40, None, (0, 1), 0, ready_fence=0)
    again = cache.publish(h, 40, None, (5, 6), 1, ready_fence=0)
    assert again.outcome is PublishOutcome.EXISTING and again.checkpoint == first.checkpoint
    # pages 5, 6 and snapshot 1 were not taken: they can be proposed again elsewhere
    other = cache.publish(history(40, offset=1000), 40, None, (5, 6), 1, ready_fence=0)
    assert other.outcome is PublishOutcome.CREATED
    assert cache.counters.duplicates == 1 and cache.counters.published == 2


def test_parent_links_share_ancestor_pages_and_children_own_their_tail():
    cache = make_cache()
    h = history(130)
    root = cache.publish(h, 50, None, (0, 1, 2), 0, 0).checkpoint      # pages [0, 3)
    child = cache.publish(h, 130, root, (3, 4, 5, 6, 7), 1, 0).checkpoint  # pages [3, 8)
    assert cache.lookup(h).page_ids == (0, 1, 2, 3, 4, 5, 6, 7)
    # below the child's endpoint, its second complete block is the deepest match: a block
    # checkpoint split out of it (tests/engine/prefix/test_block_reuse.py)
    block = cache.lookup(h, limit=129)
    assert block.endpoint == 128 and block.checkpoint.is_block
    assert block.page_ids == (0, 1, 2, 3, 4, 5, 6, 7)
    assert cache.lookup(h, limit=127).page_ids == (0, 1, 2, 3)    # and its first block
    assert cache.lookup(h, limit=63).checkpoint == root
    assert cache.lookup(history(60)).checkpoint == root     # a shorter prompt shares the root
    assert child.checkpoint_id > root.checkpoint_id


def test_proposals_are_validated():
    cache = make_cache(pages=8, snapshots=2)
    h = history(100)
    with pytest.raises(InternalError, match="must own 3 complete pages"):
        cache.publish(h, 50, None, (0, 1), 0, 0)
    with pytest.raises(InternalError, match="overlap"):
        cache.publish(h, 50, None, (0, 1, 9), 0, 0)
    with pytest.raises(InternalError, match="snapshot"):
        cache.publish(h, 50, None, (0, 1, 2), 5, 0)
    root = cache.publish(h, 50, None, (0, 1, 2), 0, 0).checkpoint
    with pytest.raises(InternalError, match="overlap"):
        cache.publish(history(50, 7), 50, None, (2, 3, 4), 1, 0)
    with pytest.raises(InternalError, match="snapshot"):
        cache.publish(history(50, 7), 50, None, (3, 4, 5), 0, 0)
    with pytest.raises(InternalError, match="does not match"):
        cache.publish(history(100, 3), 100, root, (3, 4, 5), 1, 0)


def test_pins_cover_ancestors_and_block_eviction():
    cache = make_cache()
    h = history(130)
    root = cache.publish(h, 64, None, (0, 1, 2, 3), 0, 0).checkpoint
    child = cache.publish(h, 130, root, (4, 5, 6, 7), 1, 0).checkpoint
    pin = cache.pin(child)
    assert cache.is_pinned(root) and cache.evict(pages=100) == ()
    cache.unpin(pin)
    retired = cache.evict(pages=1)
    assert [r.page_ids for r in retired] == [(4, 5, 6, 7)]     # the leaf goes first
    assert cache.contains(root) and not cache.contains(child)


def test_direct_pin_accounting_an_ancestor_unpin_keeps_the_descendants_pin():
    cache = make_cache()
    h = history(130)
    root = cache.publish(h, 64, None, (0, 1, 2, 3), 0, 0).checkpoint
    child = cache.publish(h, 130, root, (4, 5, 6, 7), 1, 0).checkpoint
    child_pin = cache.pin(child)
    root_pin = cache.pin(root)
    cache.unpin(root_pin)
    with pytest.raises(InternalError, match="not open"):
        cache.unpin(root_pin)       # the root has no direct pin left to take
    assert cache.is_pinned(root) and cache.evict(pages=100) == ()
    cache.unpin(child_pin)
    assert len(cache.evict(pages=100)) == 2


def test_leaf_lru_eviction_order_and_retirement_fences():
    cache = make_cache()
    a = cache.publish(history(32, 0), 32, None, (0, 1), 0, 0).checkpoint
    b = cache.publish(history(32, 100), 32, None, (2, 3), 1, 0).checkpoint
    c = cache.publish(history(32, 200), 32, None, (4, 5), 2, 0).checkpoint
    cache.mark_used(a, 7)            # a is now the most recently used
    cache.lookup(history(32, 200))   # then c
    retired = cache.evict(pages=2)
    assert [r.page_ids for r in retired] == [(2, 3)]     # b: least recently used
    assert retired[0].final_use_fence == 0
    retired = cache.evict(pages=2, snapshots=1)
    assert [r.page_ids for r in retired] == [(0, 1)] and retired[0].final_use_fence == 7
    assert not cache.contains(a) and cache.contains(c) and b.checkpoint_id < c.checkpoint_id


def test_retired_ids_stay_reserved_until_their_final_use_fence():
    cache = make_cache()
    h = history(32)
    ref = cache.publish(h, 32, None, (0, 1), 0, ready_fence=0).checkpoint
    pin = cache.pin(ref)
    cache.mark_used(ref, 9)
    cache.unpin(pin)                  # releasing pins says nothing about completion
    (retired,) = cache.evict(pages=1)
    assert retired.final_use_fence == 9 and cache.num_retired_pages == 2
    with pytest.raises(InternalError, match="overlap"):
        cache.publish(history(32, 5), 32, None, (0, 1), 1, 0)     # still reserved
    assert cache.advance_completed(8).reusable.page_ids == ()
    reusable = cache.advance_completed(9).reusable
    assert sorted(reusable.page_ids) == [0, 1] and reusable.snapshot_ids == (0,)
    assert cache.publish(history(32, 5), 32, None, (0, 1), 0, 0).outcome is \
        PublishOutcome.CREATED


def test_descendant_use_protects_the_ancestor_after_the_leaf_is_evicted():
    cache = make_cache()
    h = history(100)
    root = cache.publish(h, 40, None, (0, 1), 0, 0).checkpoint
    child = cache.publish(h, 100, root, (2, 3, 4, 5), 1, 0).checkpoint
    cache.mark_used(child, 12)        # reading the child reads the root's pages too
    retired = cache.evict(pages=10)
    assert [r.final_use_fence for r in retired] == [12, 12]


def test_checkpoint_ids_are_monotonic_and_never_reused():
    cache = make_cache()
    seen = []
    for i in range(5):
        ref = cache.publish(history(16, i * 100), 16, None, (0,), 0, 0).checkpoint
        seen.append(ref.checkpoint_id)
        cache.evict_all()
        cache.advance_completed(0)
    assert seen == sorted(set(seen))


def test_pending_cancellation_observes_the_fence():
    cache = make_cache()
    ref = cache.publish(history(32), 32, None, (0, 1), 0, ready_fence=4).checkpoint
    retired = cache.cancel_pending(ref)
    assert retired.final_use_fence == 4
    assert cache.advance_completed(3).reusable.page_ids == ()
    advance = cache.advance_completed(4)
    assert advance.published == () and sorted(advance.reusable.page_ids) == [0, 1]
    assert advance.reusable.snapshot_ids == (0,) and not cache.contains(ref)


def test_child_waits_for_its_parent_to_become_ready():
    cache = make_cache()
    h = history(100)
    root = cache.publish(h, 40, None, (0, 1), 0, ready_fence=5).checkpoint
    child = cache.publish(h, 100, root, (2, 3, 4, 5), 1, ready_fence=3).checkpoint
    assert cache.advance_completed(3).published == ()
    assert cache.advance_completed(5).published == (root, child)


def test_lookup_with_images_and_partial_endpoints():
    cache = make_cache()
    cat = ConditioningEvent(10, hashlib.blake2b(b"cat", digest_size=32).digest())
    dog = ConditioningEvent(10, hashlib.blake2b(b"dog", digest_size=32).digest())
    tokens = list(range(90))
    cache.publish(PrefixHistory(IDENTITY, tokens, [cat]), 70, None, (0, 1, 2, 3), 0, 0)
    assert cache.lookup(PrefixHistory(IDENTITY, tokens, [cat])).endpoint == 70
    assert cache.lookup(PrefixHistory(IDENTITY, tokens, [dog])).checkpoint is None
    assert cache.lookup(PrefixHistory(IDENTITY, tokens)).checkpoint is None
    assert cache.counters.lookups == 3 and cache.counters.hits == 1
    assert cache.counters.reused_tokens == 70


def test_block_events_follow_block_coverage():
    cache = make_cache()
    h = history(200)
    root = cache.publish(h, 70, None, (0, 1, 2, 3), 0, 0).checkpoint
    events = cache.take_block_events()
    assert [(e.stored, e.block_keys, e.parent_key) for e in events] == \
        [(True, (h.block_key(0),), b"")]
    cache.publish(h, 200, root, tuple(range(4, 12)), 1, 0)
    (event,) = cache.take_block_events()
    assert event.block_keys == (h.block_key(1), h.block_key(2)) and \
        event.parent_key == h.block_key(0)
    # a sibling with the same first block adds no stored event for it
    h2 = PrefixHistory(IDENTITY, [*range(64), *range(500, 520)])
    cache.publish(h2, 84, None, (12, 13, 14, 15, 16), 2, 0)
    assert cache.take_block_events() == []
    cache.evict(pages=8)             # the child: blocks 1, 2 (the root and sibling hold 0)
    removed = cache.take_block_events()
    assert {k for e in removed for k in e.block_keys} == {h.block_key(1), h.block_key(2)}
    assert all(not e.stored for e in removed)
    cache.evict_all()                # the last holder: one all-cleared event
    assert [e.cleared for e in cache.take_block_events()] == [True]
