"""KVResources: the page pool, the snapshot-row pool and the prefix cache behind one fence timeline.

The scheduler asks for pages and snapshot rows here; under pressure this evicts unpinned cache
leaves, and storage returns to the pools only through the cache's `advance_completed(...)
.reusable` (or a pool's own retirement fence), so no id is reused before its last use.
"""

from __future__ import annotations

from services.engine.kv.fences import FenceTimeline
from services.engine.kv.pool import FencedIdPool
from services.engine.prefix.cache import PrefixCheckpointCache
from services.engine.prefix.records import CheckpointRef, RetiredResources


class KVResources:
    def __init__(self, *, num_pages: int, page_size: int, num_snapshots: int,
                 block_reuse: bool = True) -> None:
        self.page_size = page_size
        self.fences = FenceTimeline()
        self.pages = FencedIdPool(num_pages, kind="page")
        self.snapshots = FencedIdPool(num_snapshots, kind="snapshot")
        self.cache = PrefixCheckpointCache(page_size=page_size, num_pages=num_pages,
                                           num_snapshots=num_snapshots,
                                           block_reuse=block_reuse)

    @property
    def completed(self) -> int:
        return self.fences.completed

    def pages_for(self, num_tokens: int) -> int:
        """Pages covering `num_tokens` tokens."""
        return -(-num_tokens // self.page_size)

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
        return self._release_reusable()

    def evict_all(self) -> tuple[RetiredResources, ...]:
        retired = self.cache.evict_all()
        self._release_reusable()
        return retired

    def _release_reusable(self) -> tuple[CheckpointRef, ...]:
        advance = self.cache.advance_completed(self.fences.completed)
        self.pages.retire(advance.reusable.page_ids, 0)
        self.snapshots.retire(advance.reusable.snapshot_ids, 0)
        return advance.published
