"""Block-granular reuse: a prompt that shares complete 64-token blocks with a cached one (and
then diverges) reuses those blocks, through a block checkpoint split out of the cached one."""

from __future__ import annotations

import hashlib

from services.engine.prefix.cache import PrefixCheckpointCache
from services.engine.prefix.history import ConditioningEvent, PrefixHistory
from services.engine.prefix.records import BlockEvent

IDENTITY = hashlib.blake2b(b"model", digest_size=32).digest()
P = 16


def tokens(n: int, salt: int = 0) -> list[int]:
    return [salt * 100_000 + i for i in range(n)]


def cached(cache: PrefixCheckpointCache, prompt: list[int], first_page: int = 0,
           snapshot: int = 0):
    """Publish `prompt` whole (as a finished prefill does) and make it ready."""
    pages = range(first_page, first_page + len(prompt) // P)
    ref = cache.publish(PrefixHistory(IDENTITY, prompt), len(prompt), None, pages, snapshot,
                        ready_fence=0).checkpoint
    cache.advance_completed(0)
    return ref


def test_a_diverging_prompt_reuses_the_shared_complete_blocks():
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4)
    first = tokens(200)
    whole = cached(cache, first)
    second = first[:150] + tokens(60, salt=1)         # shares 150 tokens: two complete blocks
    hit = cache.lookup(PrefixHistory(IDENTITY, second))
    assert hit.endpoint == 128 and hit.checkpoint.is_block
    assert hit.page_ids == tuple(range(8))             # the first prompt's pages, shared
    assert cache.counters.splits == 1 and cache.counters.reused_tokens == 128
    # the original keeps serving its full-prompt hit, over the same pages
    again = cache.lookup(PrefixHistory(IDENTITY, first))
    assert again.checkpoint == whole and again.page_ids == tuple(range(12))
    # a third diverging prompt finds the block checkpoint itself: no second split
    assert cache.lookup(PrefixHistory(IDENTITY, [*first[:140], 7])).checkpoint == hit.checkpoint
    assert cache.counters.splits == 1


def test_a_block_checkpoint_never_serves_a_full_prompt_hit():
    """A full-prompt hit resumes sampling from a snapshot; a block checkpoint has none, so a
    prompt that ends on its boundary reuses one block less and computes the last one."""
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4)
    first = tokens(200)
    cached(cache, first)
    cache.lookup(PrefixHistory(IDENTITY, first[:150]))          # split at 128
    hit = cache.lookup(PrefixHistory(IDENTITY, first[:128]))
    assert hit.endpoint == 64 and hit.checkpoint.is_block


def test_a_child_can_chain_from_a_block_checkpoint_and_eviction_walks_blocks():
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4)
    first = tokens(200)
    whole = cached(cache, first)
    second = first[:150] + tokens(60, salt=1)
    block = cache.lookup(PrefixHistory(IDENTITY, second)).checkpoint
    pin = cache.pin(block)
    own = cache.publish(PrefixHistory(IDENTITY, second), 210, block, range(20, 25), 1,
                        ready_fence=1).checkpoint
    cache.advance_completed(1)
    assert cache.lookup(PrefixHistory(IDENTITY, second)).page_ids == (*range(8), *range(20, 25))
    cache.mark_used(block, 5)
    # the block is pinned: only the two leaves below it go
    retired = cache.evict_all()
    assert {r.page_ids for r in retired} == {(8, 9, 10, 11), tuple(range(20, 25))}
    assert not cache.contains(whole) and not cache.contains(own) and cache.contains(block)
    cache.unpin(pin)
    (last,) = cache.evict_all()
    assert last.page_ids == tuple(range(8)) and last.snapshot_ids == ()
    assert last.final_use_fence == 5
    reusable = cache.advance_completed(5).reusable
    assert sorted(reusable.page_ids) == [*range(12), *range(20, 25)]
    assert sorted(reusable.snapshot_ids) == [0, 1]
    assert cache.num_cached_pages == 0 and cache.num_checkpoints == 0


def test_splitting_announces_nothing_and_eviction_removes_each_block_once():
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4)
    first = tokens(200)
    history = PrefixHistory(IDENTITY, first)
    cached(cache, first)
    (stored,) = cache.take_block_events()
    assert stored == BlockEvent(True, tuple(history.block_key(b) for b in range(3)), b"",
                                tuple(first[:192]))
    cache.lookup(PrefixHistory(IDENTITY, first[:150]))
    assert cache.take_block_events() == []
    block_events = cache.cached_blocks()       # a late subscriber's replay: both holders
    assert [(e.block_keys, e.parent_key, e.token_ids) for e in block_events] == [
        ((history.block_key(0), history.block_key(1)), b"", tuple(first[:128])),
        ((history.block_key(2),), history.block_key(1), tuple(first[128:192]))]
    cache.evict(pages=1)       # the leaf: block 2 only
    (removed,) = cache.take_block_events()
    assert not removed.stored and removed.block_keys == (history.block_key(2),)
    cache.evict_all()          # the block checkpoint, the last: everything is gone
    assert cache.take_block_events() == [BlockEvent.all_cleared()]
    assert cache.cached_blocks() == []


def test_different_images_at_a_position_share_no_block_after_it():
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4)
    image_a = ConditioningEvent(70, hashlib.blake2b(b"a", digest_size=32).digest())
    image_b = ConditioningEvent(70, hashlib.blake2b(b"b", digest_size=32).digest())
    first = tokens(200)
    cache.publish(PrefixHistory(IDENTITY, first, [image_a]), 200, None, range(12), 0, 0)
    cache.advance_completed(0)
    hit = cache.lookup(PrefixHistory(IDENTITY, first[:190], [image_b]))
    assert hit.endpoint == 64          # block 0 precedes the image; block 1 holds it
    assert cache.lookup(PrefixHistory(IDENTITY, first[:190], [image_a])).endpoint == 128


def test_no_block_checkpoints_when_pages_straddle_block_boundaries():
    cache = PrefixCheckpointCache(page_size=48, num_pages=64, num_snapshots=4)
    first = tokens(200)
    cache.publish(PrefixHistory(IDENTITY, first), 200, None, range(4), 0, 0)
    cache.advance_completed(0)
    assert cache.lookup(PrefixHistory(IDENTITY, [*first[:150], 1])).checkpoint is None
    assert cache.counters.splits == 0


def test_the_switch_turns_block_reuse_off():
    """`prefix_block_reuse: false` (the benchmarks' same-run baseline): exact checkpoints only."""
    cache = PrefixCheckpointCache(page_size=P, num_pages=64, num_snapshots=4, block_reuse=False)
    first = tokens(200)
    cached(cache, first)
    assert cache.lookup(PrefixHistory(IDENTITY, first[:150])).checkpoint is None
    assert cache.lookup(PrefixHistory(IDENTITY, first)).endpoint == 200
    assert cache.counters.splits == 0
