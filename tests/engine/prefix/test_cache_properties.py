"""Property-based sequences of publish / pin / use / evict / retire on the checkpoint cache.

A model world drives the cache the way the scheduler does: pages and snapshot rows come from
fenced pools, use is recorded before submission, evicted storage goes back to the pools only
through `advance_completed(...).reusable`. Lookups of prompts that share a random prefix with a
cached one (then diverge) split block checkpoints out of longer ones; every hit's pages must
hold exactly the prompt's tokens at their positions, and a full-prompt hit is never a block or
tail checkpoint (no hidden state to sample from). Invariants after every step: no page or
snapshot row is handed out before the last work that used it completed, no pinned checkpoint
or ancestor is ever evicted, and the page accounting adds up.
"""

from __future__ import annotations

import hashlib

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from services.engine.kv.pool import FencedIdPool
from services.engine.prefix.cache import PrefixCheckpointCache
from services.engine.prefix.history import PrefixHistory
from services.engine.prefix.records import CheckpointRef, PublishOutcome

IDENTITY = hashlib.blake2b(b"model", digest_size=32).digest()
P = 8


class CacheWorld(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.pages = FencedIdPool(48)
        self.snapshots = FencedIdPool(10, kind="snapshot")
        self.cache = PrefixCheckpointCache(page_size=P, num_pages=48, num_snapshots=10)
        self.issued = 0
        self.completed = 0
        self.tokens: dict[int, list[int]] = {}          # checkpoint id -> its tokens
        self.refs: dict[int, CheckpointRef] = {}
        self.pins: list = []
        self.page_last_use: dict[int, int] = {}
        self.snapshot_last_use: dict[int, int] = {}
        self.page_tokens: dict[int, tuple[int, ...]] = {}   # page -> the tokens it holds

    def _chain(self, ref: CheckpointRef) -> tuple[int, ...]:
        return self.cache.page_ids(ref)

    def _use(self, ref: CheckpointRef, fence: int) -> None:
        for page in self._chain(ref):
            self.page_last_use[page] = max(self.page_last_use.get(page, 0), fence)
        if ref.snapshot_id is not None:
            self.snapshot_last_use[ref.snapshot_id] = max(
                self.snapshot_last_use.get(ref.snapshot_id, 0), fence)

    def _take(self, pool: FencedIdPool, count: int, last_use: dict[int, int]):
        ids = pool.allocate(count)
        for i in ids:
            assert last_use.get(i, 0) <= self.completed, f"id {i} reused before its fence"
        return ids

    @rule(parent_index=st.integers(0, 4), extra=st.lists(st.integers(0, 2), min_size=1,
                                                         max_size=40) | st.lists(
        st.integers(0, 2), min_size=60, max_size=140),
          delay=st.integers(0, 2), resumable=st.booleans())
    def publish(self, parent_index, extra, delay, resumable):
        live = [r for r in self.refs.values() if self.cache.contains(r)]
        # mostly extend a recent checkpoint (deep chains), sometimes start at the root
        parent = live[-parent_index] if live and 0 < parent_index <= len(live) else None
        base = self.tokens[parent.checkpoint_id] if parent else []
        tokens = base + extra
        start = parent.endpoint if parent else 0
        need = len(tokens) // P - start // P
        if not self.pages.can_allocate(need) or not self.snapshots.can_allocate(1):
            return
        pages = self._take(self.pages, need, self.page_last_use)
        (snapshot,) = self._take(self.snapshots, 1, self.snapshot_last_use)
        self.issued += 1                       # the step that writes these pages
        fence = self.issued if delay else self.completed
        for i, page in enumerate(pages):
            self.page_last_use[page] = fence
            first = (start // P + i) * P
            self.page_tokens[page] = tuple(tokens[first:first + P])
        self.snapshot_last_use[snapshot] = fence
        pub = self.cache.publish(PrefixHistory(IDENTITY, tokens), len(tokens), parent, pages,
                                 snapshot, ready_fence=fence, resumable=resumable)
        if pub.outcome is PublishOutcome.EXISTING:
            self.pages.retire(pages, fence)      # the caller keeps (and returns) them
            self.snapshots.retire([snapshot], fence)
        else:
            self.refs[pub.checkpoint.checkpoint_id] = pub.checkpoint
            self.tokens[pub.checkpoint.checkpoint_id] = tokens

    @precondition(lambda self: self.refs)
    @rule(index=st.integers(0, 3))
    def pin_and_use(self, index):
        live = [r for r in self.refs.values() if self.cache.contains(r)]
        if not live:
            return
        ref = live[-1 - index % len(live)]          # mostly recent (deep) checkpoints
        self.pins.append(self.cache.pin(ref))
        self.issued += 1
        self.cache.mark_used(ref, self.issued)       # before "submission"
        self._use(ref, self.issued)

    @precondition(lambda self: self.refs)
    @rule(index=st.integers(0, 3), keep=st.integers(40, 100), suffix=st.lists(
        st.integers(3, 4), max_size=20), pin=st.booleans())
    def lookup_shared_prefix(self, index, keep, suffix, pin):
        live = [r for r in self.refs.values() if self.cache.contains(r)]
        if not live:
            return
        live.sort(key=lambda r: r.endpoint)           # mostly the longest cached prompts
        source = self.tokens[live[-1 - index % len(live)].checkpoint_id]
        tokens = source[:keep * len(source) // 100] + suffix    # 3 and 4 never occur in source
        hit = self.cache.lookup(PrefixHistory(IDENTITY, tokens))
        if hit.checkpoint is None:
            return
        ref = hit.checkpoint
        assert ref.endpoint <= len(tokens) and len(hit.page_ids) == ref.endpoint // P
        if ref.is_block:
            assert ref.endpoint % 64 == 0 and ref.endpoint < len(tokens)
        if ref.endpoint == len(tokens):
            assert ref.resumes, "a full-prompt hit without a saved hidden state"
        for position, page in enumerate(hit.page_ids):
            assert self.page_tokens[page] == tuple(tokens[position * P:(position + 1) * P])
        self.refs[ref.checkpoint_id] = ref
        self.tokens[ref.checkpoint_id] = tokens[:ref.endpoint]
        if pin:
            self.pins.append(self.cache.pin(ref))
            self.issued += 1
            self.cache.mark_used(ref, self.issued)
            self._use(ref, self.issued)

    @precondition(lambda self: self.refs)
    @rule(index=st.integers(0, 100))
    def lookup_a_whole_prompt(self, index):
        """A prompt equal to a cached checkpoint's tokens: a full hit only where a hidden
        state was saved; a tail checkpoint there gives a shallower hit that prefills on."""
        live = [r for r in self.refs.values() if self.cache.contains(r) and not r.is_block]
        if not live:
            return
        ref = live[index % len(live)]
        tokens = self.tokens[ref.checkpoint_id]
        hit = self.cache.lookup(PrefixHistory(IDENTITY, tokens))
        if self.cache.is_ready(ref) and ref.resumes:
            assert hit.checkpoint == ref
        assert hit.checkpoint is None or hit.checkpoint.endpoint < len(tokens) or \
            hit.checkpoint.resumes

    @precondition(lambda self: self.pins)
    @rule(index=st.integers(0, 100))
    def unpin(self, index):
        self.cache.unpin(self.pins.pop(index % len(self.pins)))

    @rule(pages=st.integers(0, 20), snapshots=st.integers(0, 3))
    def evict(self, pages, snapshots):
        pinned = {p.checkpoint.checkpoint_id for p in self.pins}
        self.cache.evict(pages=pages, snapshots=snapshots)
        for pin in self.pins:
            assert self.cache.contains(pin.checkpoint), "a pinned checkpoint was evicted"
            assert pin.checkpoint.checkpoint_id in pinned
        for ref in self.refs.values():
            if not self.cache.contains(ref):
                self.tokens.pop(ref.checkpoint_id, None)

    @rule(steps=st.integers(1, 2))
    def complete(self, steps):
        self.completed = min(self.issued, self.completed + steps)
        self.pages.advance_completed(self.completed)
        self.snapshots.advance_completed(self.completed)
        reusable = self.cache.advance_completed(self.completed).reusable
        for page in reusable.page_ids:
            assert self.page_last_use.get(page, 0) <= self.completed, \
                f"page {page} released before its last use completed"
        for row in reusable.snapshot_ids:
            assert self.snapshot_last_use.get(row, 0) <= self.completed, \
                f"snapshot {row} released before its last use completed"
        self.pages.retire(reusable.page_ids, 0)          # already complete: free now
        self.snapshots.retire(reusable.snapshot_ids, 0)

    @invariant()
    def pinned_ancestors_survive(self):
        for pin in self.pins:
            assert self.cache.contains(pin.checkpoint)
            assert len(self.cache.page_ids(pin.checkpoint)) == pin.checkpoint.endpoint // P

    @invariant()
    def accounting_adds_up(self):
        cache = self.cache
        assert self.pages.num_owned >= cache.num_cached_pages + cache.num_retired_pages
        assert 0 <= cache.num_evictable_pages <= cache.num_cached_pages


CacheWorld.TestCase.settings = settings(max_examples=150, stateful_step_count=40,
                                        deadline=None)
TestCacheWorld = CacheWorld.TestCase


@settings(max_examples=150, deadline=None)
@given(shape=st.lists(st.tuples(st.integers(0, 8), st.integers(1, 30)), min_size=1,
                      max_size=12),
       uses=st.lists(st.tuples(st.integers(0, 11), st.integers(1, 20)), max_size=12))
def test_a_forest_releases_each_page_only_after_every_use_of_it(shape, uses):
    """Random checkpoint forests, random use fences, evict everything, then complete fence by
    fence: each page comes back exactly when the last work reading it (directly or through a
    descendant) has completed, not before."""
    cache = PrefixCheckpointCache(page_size=P, num_pages=400, num_snapshots=20)
    refs: list[CheckpointRef] = []
    tokens: dict[int, list[int]] = {}
    next_page = 0
    for parent_pick, extra in shape:
        parent = refs[parent_pick % len(refs)] if refs and parent_pick else None
        toks = (tokens[parent.checkpoint_id] if parent else []) + \
            [len(refs) * 100 + i for i in range(extra)]
        start = parent.endpoint if parent else 0
        need = len(toks) // P - start // P
        pub = cache.publish(PrefixHistory(IDENTITY, toks), len(toks), parent,
                            range(next_page, next_page + need), len(refs), 0)
        next_page += need
        refs.append(pub.checkpoint)
        tokens[pub.checkpoint.checkpoint_id] = toks
    last_use: dict[int, int] = {}
    for index, fence in uses:
        ref = refs[index % len(refs)]
        cache.mark_used(ref, fence)
        for page in cache.page_ids(ref):
            last_use[page] = max(last_use.get(page, 0), fence)
    retired = cache.evict_all()
    assert sum(len(r.page_ids) for r in retired) == next_page
    released: dict[int, int] = {}
    for fence in range(0, 21):
        for page in cache.advance_completed(fence).reusable.page_ids:
            released[page] = fence
    # a node's pages carry the latest use of the node or any descendant: exactly that fence
    assert released == {page: last_use.get(page, 0) for page in range(next_page)}
