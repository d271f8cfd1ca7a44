"""PrefixCheckpointCache: immutable exact checkpoints that own KV pages and one snapshot row.

Rules (the reference design's "Prefix checkpoint policy"):

- A checkpoint at endpoint T with parent at S privately owns its tail pages, the complete pages
  [S // P, T // P) of the sequence (P = page_size), and one snapshot row holding the partial
  page [P * (T // P), T) and the final hidden state at T. Ancestor pages are shared through the
  parent link. The parent must match the history; pages and snapshot ids must lie within the
  capacities and overlap nothing the cache owns or still reserves.
- `publish` has two outcomes. CREATED transfers the proposal's resources to the cache. EXISTING
  (an equal key exists) leaves them with the caller, who must let outstanding work on them
  complete before reusing them. A created checkpoint joins lookup only after
  `advance_completed` reports its readiness fence.
- `pin` increments the checkpoint and every ancestor; direct pin accounting means unpinning an
  ancestor can never consume a descendant's reference. Pinned checkpoints are never evicted.
- `mark_used(ref, fence)` records device use before submission. Releasing pins does not imply
  that use completed.
- `evict` removes least-recently-used unpinned leaves until the page/snapshot targets are met,
  producing RetiredResources that carry their final-use fence. The ids stay reserved; only
  `advance_completed(fence).reusable` grants reuse of their storage.
- Block reuse: a lookup that finds no exact checkpoint deeper than a complete 64-token block
  of the history that some ready checkpoint's tail covers splits that checkpoint there (when
  the page size divides 64). The split-off parent is a block checkpoint (`snapshot_id` None):
  it takes the tail pages before the boundary, the pins of the checkpoint below it (it is their
  ancestor now) and its fences; it serves only hits that prefill on from its endpoint (an
  endpoint below the lookup limit), never a full-prompt hit, which needs a snapshot. Splitting
  moves no storage and changes no page's owner count, so the pin, fence and leaf-LRU rules hold
  unchanged over blocks.
- Tail checkpoints (`publish(..., resumable=False)`): a checkpoint captured inside a prefill
  chunk saves its partial page but no hidden state. Like a block checkpoint it serves only
  hits that prefill on from its endpoint, never a full-prompt hit.
- Host tier: with `collect_evicted`, evicting a ready checkpoint also records each complete
  block of its tail that no other cached checkpoint holds, with the pages holding it (the
  first may lie in an ancestor's tail), as an `EvictedBlock` for the host tier to copy down
  (`take_evicted_blocks`). `evict_all` (drain) records none.
- Checkpoint ids are monotonic and never reused. The cache never touches storage or devices.
"""

from __future__ import annotations

import heapq
import itertools
from array import array
from collections.abc import Iterable
from dataclasses import dataclass

from services.common.errors import InternalError
from services.engine.prefix.blocks import BlockIndex
from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory
from services.engine.prefix.host_tier import EvictedBlock
from services.engine.prefix.records import (
    Advance,
    BlockEvent,
    CheckpointRef,
    Pin,
    PrefixHit,
    Publication,
    PublishOutcome,
    RetiredResources,
    ReusableResources,
)


@dataclass(eq=False, slots=True)
class _Node:
    ref: CheckpointRef
    key: bytes
    anchor: bytes
    parent: _Node | None
    tail_pages: tuple[int, ...]
    ready_fence: int
    block_keys: tuple[bytes, ...]     # complete 64-token blocks first covered here
    block_parent: bytes
    block_tokens: array[int]          # their tokens, 64 per key (for KV events)
    ready: bool = False
    children: int = 0
    direct_pins: int = 0
    refs: int = 0                     # direct pins here + on every descendant
    last_use_fence: int = 0
    tick: int = 0
    evicted: bool = False


@dataclass(slots=True)
class CacheCounters:
    lookups: int = 0
    hits: int = 0
    misses: int = 0
    reused_tokens: int = 0
    query_tokens: int = 0
    published: int = 0        # unique checkpoints that joined lookup
    splits: int = 0           # block checkpoints split out of longer ones by lookups

    def reused_later(self, counted: int, reused: int) -> None:
        """A request counted at its lookup with `counted` tokens reused `reused` once
        resident (blocks another request prefilled meanwhile)."""
        if not counted:
            self.misses -= 1
            self.hits += 1
        self.reused_tokens += reused - counted
    duplicates: int = 0       # EXISTING outcomes
    evicted: int = 0


class PrefixCheckpointCache:
    def __init__(self, *, page_size: int, num_pages: int, num_snapshots: int,
                 block_reuse: bool = True, collect_evicted: bool = False) -> None:
        self.page_size = page_size
        self.num_pages = num_pages
        self.num_snapshots = num_snapshots
        self.counters = CacheCounters()
        self._ids = itertools.count(1)
        self._pins = itertools.count(1)
        self._ticks = itertools.count(1)
        self._nodes: dict[int, _Node] = {}
        self._by_key: dict[bytes, _Node] = {}
        self._by_anchor: dict[bytes, list[_Node]] = {}
        self._pending: list[_Node] = []
        self._lru: list[tuple[int, int]] = []          # heap (tick, checkpoint id), lazy
        self._open_pins: set[int] = set()
        self._reserved_pages: set[int] = set()         # owned or retired, not yet reusable
        self._reserved_snapshots: set[int] = set()
        self._retired: list[tuple[int, int, RetiredResources]] = []   # heap by fence
        self._completed = 0
        self._blocks = BlockIndex()
        self._holders: dict[bytes, list[_Node]] = {}   # block key -> ready nodes whose tail has it
        # block checkpoints need block boundaries on page boundaries (off: exact ones only)
        self.block_reuse = block_reuse and BLOCK_TOKENS % page_size == 0
        self.num_cached_pages = 0        # tail pages of live checkpoints
        self.num_evictable_pages = 0     # tail pages of ready, unpinned checkpoints
        self.num_retired_pages = 0
        self.collect_evicted = collect_evicted and BLOCK_TOKENS % page_size == 0
        self._evicted_blocks: list[EvictedBlock] = []

    # -- sizes ------------------------------------------------------------------------------
    @property
    def num_checkpoints(self) -> int:
        return len(self._nodes)

    @property
    def num_owned_snapshots(self) -> int:
        """Snapshot rows live checkpoints own (block checkpoints own none)."""
        return sum(1 for node in self._nodes.values() if not node.ref.is_block)

    @property
    def num_ready(self) -> int:
        return len(self._nodes) - len(self._pending)

    @property
    def completed_fence(self) -> int:
        return self._completed

    # -- lookup -----------------------------------------------------------------------------
    def lookup(self, history: PrefixHistory, limit: int | None = None, *,
               count: bool = True, block_at_limit: bool = False) -> PrefixHit:
        """The deepest ready checkpoint whose key matches `history` at an endpoint <= limit
        (a block checkpoint only below `limit`, or at it with `block_at_limit`: the caller
        continues from there with the host tier), splitting one at a shared block if that is
        deeper than every exact match."""
        limit = len(history) if limit is None else min(limit, len(history))
        found: _Node | None = None
        for blocks in range(limit // BLOCK_TOKENS, -1, -1):
            anchor = history.block_key(blocks - 1) if blocks else history.root_key
            for node in self._by_anchor.get(anchor, ()):
                end = node.ref.endpoint
                if end <= limit and (found is None or end > found.ref.endpoint) and \
                        (end < limit or block_at_limit or node.ref.resumes) and \
                        node.key == history.key(end):
                    found = node
            if found is None and blocks and (blocks * BLOCK_TOKENS < limit or block_at_limit):
                found = self._split_at_block(anchor, blocks * BLOCK_TOKENS)
            if found is not None:
                break
        if count:
            c = self.counters
            c.lookups += 1
            c.query_tokens += limit
            if found is None:
                c.misses += 1
            else:
                c.hits += 1
                c.reused_tokens += found.ref.endpoint
        if found is None:
            return PrefixHit(None, ())
        found.tick = next(self._ticks)
        self._push_lru(found)
        return PrefixHit(found.ref, self._chain_pages(found))

    def contains(self, ref: CheckpointRef) -> bool:
        node = self._nodes.get(ref.checkpoint_id)
        return node is not None and node.ref == ref

    def is_ready(self, ref: CheckpointRef) -> bool:
        return self._node(ref).ready

    def page_ids(self, ref: CheckpointRef) -> tuple[int, ...]:
        return self._chain_pages(self._node(ref))

    # -- publish ----------------------------------------------------------------------------
    def publish(self, history: PrefixHistory, endpoint: int, parent: CheckpointRef | None,
                page_ids: Iterable[int], snapshot_id: int, ready_fence: int, *,
                resumable: bool = True) -> Publication:
        """Propose a checkpoint at `endpoint` of `history` (see the module rules);
        `resumable` False: a tail checkpoint (its row saved no hidden state)."""
        key = history.key(endpoint)
        existing = self._by_key.get(key)
        if existing is not None:
            self.counters.duplicates += 1
            return Publication(PublishOutcome.EXISTING, existing.ref)
        pages = tuple(page_ids)
        parent_node = self._validate_proposal(history, endpoint, parent, pages, snapshot_id)
        start = parent_node.ref.endpoint if parent_node else 0
        first_block, last_block = start // BLOCK_TOKENS, endpoint // BLOCK_TOKENS
        ref = CheckpointRef(next(self._ids), endpoint, snapshot_id, resumes=resumable)
        node = _Node(
            ref=ref, key=key, anchor=history.anchor_key(endpoint), parent=parent_node,
            tail_pages=pages, ready_fence=ready_fence,
            block_keys=tuple(history.block_key(b) for b in range(first_block, last_block)),
            block_parent=history.block_key(first_block - 1) if first_block else b"",
            block_tokens=array("I", history.tokens[first_block * BLOCK_TOKENS:
                                                   last_block * BLOCK_TOKENS]),
            tick=next(self._ticks))
        self._nodes[ref.checkpoint_id] = node
        self._by_key[key] = node
        if parent_node is not None:
            parent_node.children += 1
        self._reserved_pages.update(pages)
        self._reserved_snapshots.add(snapshot_id)
        self.num_cached_pages += len(pages)
        self._pending.append(node)
        self._publish_ready()
        return Publication(PublishOutcome.CREATED, ref)

    def _validate_proposal(self, history: PrefixHistory, endpoint: int,
                           parent: CheckpointRef | None, pages: tuple[int, ...],
                           snapshot_id: int) -> _Node | None:
        if endpoint <= 0:
            raise InternalError("a checkpoint must cover at least one token")
        parent_node = None
        start = 0
        if parent is not None:
            parent_node = self._node(parent)
            start = parent.endpoint
            if start >= endpoint or parent_node.key != history.key(start):
                raise InternalError(f"checkpoint parent at {start} does not match the history "
                                    f"of the proposal at {endpoint}")
        expected = endpoint // self.page_size - start // self.page_size
        if len(pages) != expected:
            raise InternalError(f"checkpoint [{start}, {endpoint}) must own {expected} complete "
                                f"pages, {len(pages)} proposed")
        if len(set(pages)) != len(pages) or any(
                not 0 <= p < self.num_pages or p in self._reserved_pages for p in pages):
            raise InternalError(f"proposed pages {pages} overlap the cache or lie outside "
                                f"0..{self.num_pages - 1}")
        if not 0 <= snapshot_id < self.num_snapshots or snapshot_id in self._reserved_snapshots:
            raise InternalError(f"snapshot {snapshot_id} is outside the capacity or already "
                                "owned by the cache")
        return parent_node

    # -- pins and use -----------------------------------------------------------------------
    def pin(self, ref: CheckpointRef) -> Pin:
        node = self._node(ref)
        node.direct_pins += 1
        walker: _Node | None = node
        while walker is not None:
            if walker.refs == 0 and walker.ready:
                self.num_evictable_pages -= len(walker.tail_pages)
            walker.refs += 1
            walker = walker.parent
        serial = next(self._pins)
        self._open_pins.add(serial)
        return Pin(ref, serial)

    def unpin(self, pin: Pin) -> None:
        if pin.serial not in self._open_pins:
            raise InternalError(f"pin {pin.serial} on checkpoint {pin.checkpoint.checkpoint_id} "
                                "is not open (unpinned twice?)")
        node = self._node(pin.checkpoint)
        if node.direct_pins <= 0:
            raise InternalError("direct pin accounting underflow")
        self._open_pins.discard(pin.serial)
        node.direct_pins -= 1
        walker: _Node | None = node
        while walker is not None:
            walker.refs -= 1
            if walker.refs == 0 and walker.ready:
                self.num_evictable_pages += len(walker.tail_pages)
                self._push_lru(walker)
            walker = walker.parent

    def mark_used(self, ref: CheckpointRef, fence: int) -> None:
        """Work with `fence` reads this checkpoint (and its ancestors): record it first."""
        node = self._node(ref)
        if fence > node.last_use_fence:
            node.last_use_fence = fence
        node.tick = next(self._ticks)
        self._push_lru(node)

    def is_pinned(self, ref: CheckpointRef) -> bool:
        return self._node(ref).refs > 0

    # -- eviction and retirement ------------------------------------------------------------
    def evict(self, *, pages: int = 0, snapshots: int = 0) -> tuple[RetiredResources, ...]:
        """Evict LRU unpinned leaves until `pages` pages and `snapshots` rows are retired."""
        retired: list[RetiredResources] = []
        freed_pages = freed_snapshots = 0
        while (freed_pages < pages or freed_snapshots < snapshots) and self._lru:
            tick, checkpoint_id = heapq.heappop(self._lru)
            node = self._nodes.get(checkpoint_id)
            if node is None or node.tick != tick or not self._is_evictable_leaf(node):
                continue
            resources = self._evict_node(node)
            retired.append(resources)
            freed_pages += len(resources.page_ids)
            freed_snapshots += len(resources.snapshot_ids)
        return tuple(retired)

    def evict_all(self) -> tuple[RetiredResources, ...]:
        """Evict every unpinned checkpoint (drain, tests). When nothing is left, the block
        events collapse into one all-cleared event."""
        collect, self.collect_evicted = self.collect_evicted, False
        try:
            retired = self.evict(pages=self.num_pages + 1, snapshots=self.num_snapshots + 1)
        finally:
            self.collect_evicted = collect
        if retired and not self._nodes:
            self._blocks.clear()
        return retired

    def cancel_pending(self, ref: CheckpointRef) -> RetiredResources:
        """Withdraw a created checkpoint that never became ready (its producer failed).

        Its resources retire behind its readiness fence, like any other."""
        node = self._node(ref)
        if node.ready or node.refs or node.children:
            raise InternalError("only an unpinned, childless, pending checkpoint can be withdrawn")
        self._pending.remove(node)
        return self._evict_node(node, count=False)

    def advance_completed(self, fence: int) -> Advance:
        """Work up to `fence` completed: publish ready checkpoints, release retired storage."""
        if fence > self._completed:
            self._completed = fence
        published = self._publish_ready()
        page_ids: list[int] = []
        snapshot_ids: list[int] = []
        while self._retired and self._retired[0][0] <= self._completed:
            _, _, resources = heapq.heappop(self._retired)
            page_ids.extend(resources.page_ids)
            snapshot_ids.extend(resources.snapshot_ids)
        self._reserved_pages.difference_update(page_ids)
        self._reserved_snapshots.difference_update(snapshot_ids)
        self.num_retired_pages -= len(page_ids)
        return Advance(published, ReusableResources(tuple(page_ids), tuple(snapshot_ids)))

    def take_evicted_blocks(self) -> list[EvictedBlock]:
        """Complete blocks that evictions since the last call dropped from the GPU (only with
        `collect_evicted`), parents before children within one checkpoint."""
        blocks, self._evicted_blocks = self._evicted_blocks, []
        return blocks

    def take_block_events(self) -> list[BlockEvent]:
        """Blocks stored/removed since the last call (for SubscribePrefixEvents)."""
        return self._blocks.take_events()

    def cached_blocks(self) -> list[BlockEvent]:
        """Every ready checkpoint's blocks as stored events, parents first (replay)."""
        nodes = sorted((n for n in self._nodes.values() if n.ready and n.block_keys),
                       key=lambda n: n.ref.endpoint)
        return [BlockEvent(True, n.block_keys, n.block_parent, tuple(n.block_tokens))
                for n in nodes]

    # -- internals --------------------------------------------------------------------------
    def _node(self, ref: CheckpointRef) -> _Node:
        node = self._nodes.get(ref.checkpoint_id)
        if node is None or node.ref != ref:
            raise InternalError(f"checkpoint {ref.checkpoint_id} is not in the cache")
        return node

    def _chain_pages(self, node: _Node) -> tuple[int, ...]:
        chain: list[tuple[int, ...]] = []
        walker: _Node | None = node
        while walker is not None:
            chain.append(walker.tail_pages)
            walker = walker.parent
        return tuple(p for tail in reversed(chain) for p in tail)

    def _split_at_block(self, key: bytes, boundary: int) -> _Node | None:
        """A block checkpoint at `boundary` (block key `key`), split out of a ready checkpoint
        whose tail covers that block; None when none does (or the page size forbids it)."""
        holders = self._holders.get(key)
        if not self.block_reuse or not holders or key in self._by_key:
            return None
        node = holders[0]
        start = node.parent.ref.endpoint if node.parent else 0
        pages = boundary // self.page_size - start // self.page_size
        blocks = boundary // BLOCK_TOKENS - start // BLOCK_TOKENS
        block = _Node(
            ref=CheckpointRef(next(self._ids), boundary, None, resumes=False), key=key, anchor=key,
            parent=node.parent, tail_pages=node.tail_pages[:pages],
            ready_fence=node.ready_fence, block_keys=node.block_keys[:blocks],
            block_parent=node.block_parent,
            block_tokens=node.block_tokens[:blocks * BLOCK_TOKENS], ready=True, children=1,
            refs=node.refs, last_use_fence=node.last_use_fence, tick=node.tick)
        node.parent = block
        node.tail_pages = node.tail_pages[pages:]
        node.block_keys = node.block_keys[blocks:]
        node.block_tokens = node.block_tokens[blocks * BLOCK_TOKENS:]
        node.block_parent = key
        for block_key in block.block_keys:
            holding = self._holders[block_key]
            holding[holding.index(node)] = block
        self._nodes[block.ref.checkpoint_id] = block
        self._by_key[key] = block
        self._by_anchor.setdefault(key, []).append(block)
        self.counters.splits += 1
        return block

    def _is_evictable_leaf(self, node: _Node) -> bool:
        return node.ready and node.refs == 0 and node.children == 0 and not node.evicted

    def _push_lru(self, node: _Node) -> None:
        if self._is_evictable_leaf(node):
            heapq.heappush(self._lru, (node.tick, node.ref.checkpoint_id))
            if len(self._lru) > 4 * len(self._nodes) + 64:   # drop stale entries
                self._lru = [(n.tick, n.ref.checkpoint_id) for n in self._nodes.values()
                             if self._is_evictable_leaf(n)]
                heapq.heapify(self._lru)

    def _evict_node(self, node: _Node, *, count: bool = True) -> RetiredResources:
        node.evicted = True
        del self._nodes[node.ref.checkpoint_id]
        del self._by_key[node.key]
        if node.ready and self.collect_evicted and node.block_keys:
            self._collect_blocks(node)
        if node.ready:
            self._by_anchor[node.anchor].remove(node)
            if not self._by_anchor[node.anchor]:
                del self._by_anchor[node.anchor]
            self.num_evictable_pages -= len(node.tail_pages)
            self._blocks.remove(node.block_keys, node.block_parent)
            for block_key in node.block_keys:
                holding = self._holders[block_key]
                holding.remove(node)
                if not holding:
                    del self._holders[block_key]
        self.num_cached_pages -= len(node.tail_pages)
        self.num_retired_pages += len(node.tail_pages)
        fence = max(node.last_use_fence, node.ready_fence)
        parent = node.parent
        if parent is not None:
            parent.children -= 1
            parent.last_use_fence = max(parent.last_use_fence, fence)
            self._push_lru(parent)
        if count:
            self.counters.evicted += 1
        snapshots = () if node.ref.snapshot_id is None else (node.ref.snapshot_id,)
        resources = RetiredResources(node.tail_pages, snapshots, fence)
        heapq.heappush(self._retired, (fence, node.ref.checkpoint_id, resources))
        return resources

    def _collect_blocks(self, node: _Node) -> None:
        """Record the blocks of `node`'s tail that no other ready checkpoint holds."""
        chain = self._chain_pages(node)
        per_block = BLOCK_TOKENS // self.page_size
        first = node.ref.endpoint // BLOCK_TOKENS - len(node.block_keys)
        parent = node.block_parent
        for offset, key in enumerate(node.block_keys):
            index = first + offset
            if len(self._holders.get(key, ())) <= 1:    # only this node holds it
                self._evicted_blocks.append(EvictedBlock(
                    key, parent,
                    tuple(node.block_tokens[offset * BLOCK_TOKENS:(offset + 1) * BLOCK_TOKENS]),
                    chain[index * per_block:(index + 1) * per_block]))
            parent = key

    def _publish_ready(self) -> tuple[CheckpointRef, ...]:
        published: list[CheckpointRef] = []
        progress = True
        while progress:
            progress = False
            for node in list(self._pending):
                parent_ready = node.parent is None or node.parent.ready
                if node.ready_fence <= self._completed and parent_ready:
                    self._pending.remove(node)
                    node.ready = True
                    self._by_anchor.setdefault(node.anchor, []).append(node)
                    if node.refs == 0:
                        self.num_evictable_pages += len(node.tail_pages)
                    self._blocks.add(node.block_keys, node.block_parent, node.block_tokens)
                    for block_key in node.block_keys:
                        self._holders.setdefault(block_key, []).append(node)
                    self.counters.published += 1
                    self._push_lru(node)
                    published.append(node.ref)
                    progress = True
        return tuple(published)
