"""HostTier's rules: readiness behind the offload's fence, pins, last-use fences, LRU order."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import InternalError
from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory
from services.engine.prefix.host_tier import EvictedBlock, HostTier

IDENTITY = b"i" * 32
HISTORY = PrefixHistory(IDENTITY, tuple(range(10 * BLOCK_TOKENS)))


def _block(index: int, pages=(0, 1, 2, 3), history=HISTORY) -> EvictedBlock:
    parent = history.block_key(index - 1) if index else b""
    tokens = history.tokens[index * BLOCK_TOKENS:(index + 1) * BLOCK_TOKENS]
    return EvictedBlock(history.block_key(index), parent, tuple(tokens), tuple(pages))


def test_an_offered_block_is_found_only_after_its_copy_completed():
    tier = HostTier(num_pages=16, page_size=16)
    assert tier.offer(_block(0)) and not tier.offer(_block(0))    # held once
    assert tier.chain(HISTORY, 0, 4) == ()                        # not copied yet
    copies = tier.take_offloads(fence=5)
    assert [gpu for gpu, _ in copies] == [0, 1, 2, 3] and len({h for _, h in copies}) == 4
    tier.advance_completed(4)
    assert tier.chain(HISTORY, 0, 4) == ()                        # fence 5 still running
    tier.advance_completed(5)
    (block,) = tier.chain(HISTORY, 0, 4)
    assert block.host_pages == tuple(h for _, h in copies)
    (stored,) = tier.take_block_events()
    assert stored.stored and stored.medium == "CPU" and stored.token_ids == _block(0).token_ids


def test_a_chain_stops_at_the_first_missing_block_and_respects_its_limit():
    tier = HostTier(num_pages=64, page_size=16)
    for index in (0, 1, 2, 4):
        tier.offer(_block(index))
    tier.take_offloads(1)
    tier.advance_completed(1)
    assert [b.key for b in tier.chain(HISTORY, 0, 10)] == [HISTORY.block_key(i)
                                                           for i in range(3)]
    assert len(tier.chain(HISTORY, 1, 1)) == 1 and tier.chain(HISTORY, 3, 5) == ()
    other = PrefixHistory(b"o" * 32, HISTORY.tokens)               # another identity or salt
    assert tier.chain(other, 0, 10) == ()


def test_pinned_blocks_survive_pressure_and_pages_wait_for_the_last_reader():
    tier = HostTier(num_pages=8, page_size=16)                     # two blocks
    tier.offer(_block(0))
    tier.offer(_block(1))
    tier.take_offloads(1)
    tier.advance_completed(1)
    chain = tier.chain(HISTORY, 0, 2)
    tier.pin(chain)
    assert not tier.offer(_block(2)) and tier.counters.dropped == 1   # nothing evictable
    tier.release(chain[1:], fence=7)                                  # block 1 read by fence 7
    assert not tier.offer(_block(2))          # block 1 evicted, but its pages wait for fence 7
    assert HISTORY.block_key(1) not in tier
    tier.advance_completed(7)
    assert tier.offer(_block(2))                                       # now they are free
    with pytest.raises(InternalError):
        tier.release(chain[1:], fence=8)                               # unpinned twice
    tier.release(chain[:1], fence=8)


def test_a_lookup_keeps_the_head_of_a_chain_newest():
    tier = HostTier(num_pages=16, page_size=16)                        # four blocks
    for index in range(4):
        tier.offer(_block(index))
    tier.take_offloads(1)
    tier.advance_completed(1)
    tier.chain(HISTORY, 0, 4)                                          # stamps 3, 2, 1, 0
    other = PrefixHistory(IDENTITY, tuple(range(5000, 5000 + BLOCK_TOKENS)))
    assert tier.offer(_block(0, history=other))                        # evicts the deepest
    assert HISTORY.block_key(3) not in tier and HISTORY.block_key(0) in tier


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["offer", "take", "advance", "pin", "release"]),
                          st.integers(0, 9)), max_size=80))
def test_random_sequences_never_share_or_leak_a_host_page(ops):
    tier = HostTier(num_pages=12, page_size=16)                        # three blocks
    fence = completed = 0
    pinned: list = []
    readers: dict[int, int] = {}        # host page -> fence of its latest reader
    for op, arg in ops:
        if op == "offer":
            tier.offer(_block(arg))
        elif op == "take":
            fence += 1
            for _, host in tier.take_offloads(fence):
                assert readers.get(host, 0) <= completed, "a host page reused before its reader"
        elif op == "advance":
            completed = fence
            tier.advance_completed(completed)
        elif op == "pin":
            chain = tier.chain(HISTORY, arg % 3, 2)
            if chain:
                tier.pin(chain)
                pinned.append(chain)
        elif op == "release" and pinned:
            fence += 1
            chain = pinned.pop(arg % len(pinned))
            for block in chain:
                for page in block.host_pages:
                    readers[page] = fence
            tier.release(chain, fence)
        held = [p for b in tier._blocks.values() for p in b.host_pages]
        assert len(held) == len(set(held)) == tier.num_used_pages
        assert all(b.key in tier for chain in pinned for b in chain)   # pinned stay
    assert tier.pool.num_free + tier.pool.num_retiring + tier.num_used_pages == tier.num_pages
