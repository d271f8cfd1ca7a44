"""HostTier: complete 64-token blocks evicted from the GPU, kept in pinned host memory.

    tier.offer(block)                      # a block the GPU cache evicted: copy it down
    transfers = tier.take_offloads(fence)  # (gpu page, host page) copies the step with `fence` runs
    blocks = tier.chain(history, first, n) # ready blocks continuing a GPU hit, in prefix order
    tier.pin(blocks) / tier.release(blocks, fence)   # held from lookup to the onload's step
    tier.advance_completed(fence)          # offloads behind it are readable; pages reusable

Rules (the GPU cache's, one tier down):
- A block is keyed by its `PrefixHistory` block key (salt and image conditioning included), so
  a chain of host blocks continues exactly one history. Each block owns `pages_per_block` host
  pages holding the K/V of every layer for its 64 positions.
- An offered block is copied on the step that next commits (`take_offloads`: the GPU pages it
  reads were freed by the eviction, and no step writes them before that step's prologue); it
  joins lookup only once that step's fence completes (both directions are fenced).
- A block read by an onload is pinned from the lookup until the step that copies it is
  committed, and its last-use fence is that step's: a host page is reused only after the
  onload that read it completed. Pinned blocks are never evicted.
- Eviction is least-recently-used over ready, unpinned blocks; a lookup stamps the blocks of a
  chain deepest-first, so a chain's tail leaves before its head (which other chains share).
- An offer that finds no free pages after evicting is dropped (counted): the tier never waits.
Plain Python: ids, no storage (runner/host_kv.py moves the bytes).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

from services.common.errors import InternalError
from services.engine.kv.pool import FencedIdPool
from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory
from services.engine.prefix.records import BlockEvent


@dataclass(frozen=True, slots=True)
class EvictedBlock:
    """A complete block the GPU cache stopped holding: what the host tier may keep."""

    key: bytes
    parent_key: bytes                 # b"" for the first block of a history
    token_ids: tuple[int, ...]        # its 64 tokens (for KV events)
    gpu_pages: tuple[int, ...]        # the pages holding it, in order


@dataclass(eq=False, slots=True)
class HostBlock:
    key: bytes
    parent_key: bytes
    token_ids: tuple[int, ...]
    host_pages: tuple[int, ...]
    ready_fence: int = -1             # the step that copies it down (-1: not committed yet)
    ready: bool = False
    pins: int = 0
    last_use_fence: int = 0


@dataclass(slots=True)
class HostCounters:
    offered: int = 0          # evicted GPU blocks offered to the tier
    offloaded: int = 0        # blocks copied down
    dropped: int = 0          # offers refused for lack of free host pages
    hits: int = 0             # residencies that brought blocks back
    hit_blocks: int = 0
    onloaded_tokens: int = 0  # prompt tokens brought back instead of recomputed
    evicted: int = 0


@dataclass(slots=True)
class _Pending:
    blocks: list[HostBlock] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)   # (gpu page, host page)


class HostTier:
    def __init__(self, *, num_pages: int, page_size: int) -> None:
        if BLOCK_TOKENS % page_size:
            raise InternalError(f"the host tier needs page_size to divide {BLOCK_TOKENS}")
        self.pages_per_block = BLOCK_TOKENS // page_size
        self.pool = FencedIdPool(num_pages, kind="host page")
        self.counters = HostCounters()
        self._blocks: dict[bytes, HostBlock] = {}
        self._lru: OrderedDict[bytes, None] = OrderedDict()   # ready, unpinned; oldest first
        self._unsubmitted = _Pending()
        self._submitted: list[HostBlock] = []                  # copied by a step in flight
        self._events: list[BlockEvent] = []
        self._ticks = itertools.count()

    # -- sizes ------------------------------------------------------------------------------
    @property
    def num_pages(self) -> int:
        return self.pool.capacity

    @property
    def num_blocks(self) -> int:
        return len(self._blocks)

    @property
    def num_used_pages(self) -> int:
        return len(self._blocks) * self.pages_per_block

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    # -- offload ----------------------------------------------------------------------------
    def offer(self, block: EvictedBlock) -> bool:
        """Keep `block` (copied by the next committed step); False if it is held already or
        no host pages are free."""
        if len(block.gpu_pages) != self.pages_per_block:
            raise InternalError(f"an evicted block spans {self.pages_per_block} pages, "
                                f"{len(block.gpu_pages)} given")
        self.counters.offered += 1
        held = self._blocks.get(block.key)
        if held is not None:
            if held.key in self._lru:
                self._lru.move_to_end(held.key)
            return False
        if not self._make_room(self.pages_per_block):
            self.counters.dropped += 1
            return False
        pages = self.pool.allocate(self.pages_per_block)
        host = HostBlock(block.key, block.parent_key, block.token_ids, pages)
        self._blocks[block.key] = host
        self._unsubmitted.blocks.append(host)
        self._unsubmitted.copies.extend(zip(block.gpu_pages, pages, strict=True))
        return True

    def take_offloads(self, fence: int) -> tuple[tuple[int, int], ...]:
        """The copies (gpu page, host page) the step with `fence` runs first."""
        pending, self._unsubmitted = self._unsubmitted, _Pending()
        for host in pending.blocks:
            host.ready_fence = fence
            self._submitted.append(host)
        self.counters.offloaded += len(pending.blocks)
        return tuple(pending.copies)

    def advance_completed(self, fence: int) -> None:
        """Work up to `fence` completed: blocks it copied down join lookup; retired host
        pages become reusable."""
        self.pool.advance_completed(fence)
        still: list[HostBlock] = []
        for host in self._submitted:
            if host.ready_fence <= fence and host.key in self._blocks:
                host.ready = True
                self._lru[host.key] = None
                self._events.append(BlockEvent(True, (host.key,), host.parent_key,
                                               host.token_ids, medium="CPU"))
            elif host.key in self._blocks:
                still.append(host)
        self._submitted = still

    # -- lookup and onload ------------------------------------------------------------------
    def chain(self, history: PrefixHistory, first_block: int, max_blocks: int
              ) -> tuple[HostBlock, ...]:
        """Ready blocks `first_block`, `first_block + 1`, ... of `history` (at most
        `max_blocks`), stopping at the first the tier does not hold."""
        found: list[HostBlock] = []
        for index in range(first_block, first_block + max_blocks):
            host = self._blocks.get(history.block_key(index))
            if host is None or not host.ready:
                break
            found.append(host)
        for host in reversed(found):          # deepest first: the head stays newest
            if host.key in self._lru:
                self._lru.move_to_end(host.key)
        return tuple(found)

    def pin(self, blocks: Sequence[HostBlock]) -> None:
        for host in blocks:
            if self._blocks.get(host.key) is not host or not host.ready:
                raise InternalError("only a ready block the tier holds can be pinned")
            host.pins += 1
            self._lru.pop(host.key, None)

    def release(self, blocks: Sequence[HostBlock], fence: int) -> None:
        """Unpin blocks whose last reader is the work with `fence` (0: none ran)."""
        for host in blocks:
            if host.pins <= 0:
                raise InternalError("host block unpinned more often than pinned")
            host.pins -= 1
            host.last_use_fence = max(host.last_use_fence, fence)
            if not host.pins and self._blocks.get(host.key) is host:
                self._lru[host.key] = None

    def count_hit(self, blocks: int) -> None:
        self.counters.hits += 1
        self.counters.hit_blocks += blocks
        self.counters.onloaded_tokens += blocks * BLOCK_TOKENS

    def take_block_events(self) -> list[BlockEvent]:
        events, self._events = self._events, []
        return events

    def cached_blocks(self) -> list[BlockEvent]:
        return [BlockEvent(True, (h.key,), h.parent_key, h.token_ids, medium="CPU")
                for h in self._blocks.values() if h.ready]

    # -- eviction ---------------------------------------------------------------------------
    def evict_all(self) -> None:
        """Evict every ready, unpinned block (drain)."""
        while self._lru:
            key, _ = self._lru.popitem(last=False)
            self._evict(self._blocks[key])

    def _make_room(self, pages: int) -> bool:
        while not self.pool.can_allocate(pages) and self._lru:
            key, _ = self._lru.popitem(last=False)
            self._evict(self._blocks[key])
        return self.pool.can_allocate(pages)

    def _evict(self, host: HostBlock) -> None:
        del self._blocks[host.key]
        self.pool.retire(host.host_pages, host.last_use_fence)
        self.counters.evicted += 1
        self._events.append(BlockEvent(False, (host.key,), host.parent_key, medium="CPU"))
