"""KVResources: the page pool, the snapshot-row pool, the prefix cache and its host tier behind
one fence timeline.

The scheduler asks for pages and snapshot rows here; under pressure this evicts unpinned cache
leaves, and storage returns to the pools only through the cache's `advance_completed(...)
.reusable` (or a pool's own retirement fence), so no id is reused before its last use.

With a host tier (`host_pages` > 0), the complete blocks an eviction drops are offered to it;
their copies down ride on the next committed step (`take_transfers`), ahead of any write to
the freed pages. `lookup` spans both tiers: a GPU hit ending on a block boundary continues
with the host tier's ready blocks of the same history (`TieredHit`).
"""

from __future__ import annotations

from dataclasses import dataclass

from services.engine.kv.fences import FenceTimeline
from services.engine.kv.pool import FencedIdPool
from services.engine.prefix.cache import PrefixCheckpointCache
from services.engine.prefix.history import BLOCK_TOKENS, PrefixHistory
from services.engine.prefix.host_tier import HostBlock, HostTier
from services.engine.prefix.records import (
    BlockEvent,
    CheckpointRef,
    PrefixHit,
    RetiredResources,
)


@dataclass(frozen=True, slots=True)
class TieredHit:
    """A two-tier lookup's answer: the GPU hit and the host blocks that continue it."""

    gpu: PrefixHit
    host_blocks: tuple[HostBlock, ...] = ()

    @property
    def endpoint(self) -> int:
        return self.gpu.endpoint + len(self.host_blocks) * BLOCK_TOKENS

    @property
    def host_tokens(self) -> int:
        return len(self.host_blocks) * BLOCK_TOKENS


class KVResources:
    def __init__(self, *, num_pages: int, page_size: int, num_snapshots: int,
                 block_reuse: bool = True, host_pages: int = 0) -> None:
        self.page_size = page_size
        self.fences = FenceTimeline()
        self.pages = FencedIdPool(num_pages, kind="page")
        self.snapshots = FencedIdPool(num_snapshots, kind="snapshot")
        # the host tier continues GPU hits at block boundaries: it needs block reuse
        self.host = HostTier(num_pages=host_pages, page_size=page_size) if \
            host_pages > 0 and block_reuse and BLOCK_TOKENS % page_size == 0 else None
        self.cache = PrefixCheckpointCache(page_size=page_size, num_pages=num_pages,
                                           num_snapshots=num_snapshots,
                                           block_reuse=block_reuse,
                                           collect_evicted=self.host is not None)

    @property
    def completed(self) -> int:
        return self.fences.completed

    def pages_for(self, num_tokens: int) -> int:
        """Pages covering `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

    # -- the two tiers ----------------------------------------------------------------------
    def lookup(self, history: PrefixHistory, limit: int) -> TieredHit:
        """The GPU cache's hit (uncounted), continued by ready host blocks while they stay
        below `limit` (a host hit always leaves a token to prefill). A GPU hit inside a block
        is cut back to that block's start (a block checkpoint) when the host tier holds the
        block: the host pages replace its partial tail."""
        gpu = self.cache.lookup(history, limit, count=False)
        host = self.host
        if host is None or not host.num_blocks:
            return TieredHit(gpu)
        first = gpu.endpoint // BLOCK_TOKENS
        room = (limit - 1) // BLOCK_TOKENS - first       # blocks ending below limit
        blocks = host.chain(history, first, room) if room > 0 else ()
        if not blocks:
            return TieredHit(gpu)
        boundary = first * BLOCK_TOKENS
        if gpu.endpoint != boundary:
            cut = self.cache.lookup(history, boundary, count=False, block_at_limit=True)
            if cut.endpoint != boundary:
                return TieredHit(gpu)
            gpu = cut
        return TieredHit(gpu, blocks)

    def take_transfers(self, fence: int) -> tuple[tuple[int, int], ...]:
        """Offloads (gpu page, host page) the step with `fence` runs before anything else."""
        if self.host is None:
            return ()
        self._offer_evicted()
        return self.host.take_offloads(fence)

    def _offer_evicted(self) -> None:
        host = self.host
        if host is None:
            return
        for block in self.cache.take_evicted_blocks():
            host.offer(block)

    # -- obtaining storage ------------------------------------------------------------------
    def reclaim(self, *, pages: int = 0, snapshots: int = 0) -> bool:
        """Make `pages` pages and `snapshots` rows free now, evicting cache leaves if needed."""
        missing_pages = max(0, pages - self.pages.num_free)
        missing_snapshots = max(0, snapshots - self.snapshots.num_free)
        if missing_pages or missing_snapshots:
            self.cache.evict(pages=missing_pages, snapshots=missing_snapshots)
            self._release_reusable()
        return self.pages.can_allocate(pages) and self.snapshots.can_allocate(snapshots)

    def reclaimable_pages(self) -> int:
        """Pages free now plus pages that evicting unpinned cache leaves could free."""
        return self.pages.num_free + self.cache.num_evictable_pages

    # -- giving storage back ----------------------------------------------------------------
    def retire_pages(self, page_ids: set[int] | list[int], fence: int) -> None:
        self.pages.retire(page_ids, fence)

    def retire_snapshots(self, snapshot_ids: list[int], fence: int) -> None:
        self.snapshots.retire(snapshot_ids, fence)

    def advance_completed(self, fence: int) -> tuple[CheckpointRef, ...]:
        """Work up to `fence` completed; returns checkpoints that joined lookup."""
        self.fences.complete(fence)
        self.pages.advance_completed(fence)
        self.snapshots.advance_completed(fence)
        if self.host is not None:
            self.host.advance_completed(fence)
        return self._release_reusable()

    def evict_all(self) -> tuple[RetiredResources, ...]:
        """Empty both tiers of everything unpinned (drain)."""
        retired = self.cache.evict_all()
        if self.host is not None:
            self.host.evict_all()
        self._release_reusable()
        return retired

    # -- block events -----------------------------------------------------------------------
    def take_block_events(self) -> list[BlockEvent]:
        """Blocks stored/removed in either tier since the last call (GPU first). An emptied
        cache is one all-cleared event, which covers the host tier's removals too."""
        events = self.cache.take_block_events()
        if self.host is None:
            return events
        host_events = self.host.take_block_events()
        if any(event.cleared for event in events) and not self.host.num_blocks:
            return events
        return events + host_events

    def cached_blocks(self) -> list[BlockEvent]:
        """Every block either tier holds, as stored events (a late subscriber's replay)."""
        blocks = self.cache.cached_blocks()
        return blocks + self.host.cached_blocks() if self.host is not None else blocks

    def _release_reusable(self) -> tuple[CheckpointRef, ...]:
        advance = self.cache.advance_completed(self.fences.completed)
        self.pages.retire(advance.reusable.page_ids, 0)
        self.snapshots.retire(advance.reusable.snapshot_ids, 0)
        return advance.published
