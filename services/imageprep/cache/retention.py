"""RetentionCache: the tiers behind four verbs (lookup_source, get, put, flush).

Reads go memory -> disk -> Redis and promote what a lower tier returns into the tiers above it.
`put` stores in memory at once and hands the disk and Redis writes to one background writer
thread (write-behind), so a Prepare never waits for a file or a network write; `flush` waits for
them (tests, shutdown). Keys:

- source key (media type + encoded bytes + processor settings) -> semantic identity
- semantic identity -> PreparedImage (tensors)

All methods are blocking and thread-safe; the service calls the slow paths from worker threads.
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Protocol

from services.imageprep.cache.memory import MemoryStats, MemoryTier
from services.imageprep.prepared import PreparedImage

log = logging.getLogger(__name__)

MAX_PENDING_WRITES = 64


class LowerTier(Protocol):
    def get(self, identity: bytes) -> PreparedImage | None: ...
    def put(self, image: PreparedImage) -> bool: ...
    def lookup_source(self, key: bytes) -> bytes | None: ...
    def bind_source(self, key: bytes, identity: bytes) -> None: ...


class RetentionCache:
    def __init__(self, memory: MemoryTier, lower: list[LowerTier] | None = None) -> None:
        self.memory = memory
        self.lower = list(lower or [])
        self._writer = concurrent.futures.ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="imageprep-cache-writer")
        self._pending: set[concurrent.futures.Future[None]] = set()
        self._pending_lock = threading.Lock()
        self.skipped_writes = 0

    def lookup_source(self, key: bytes) -> bytes | None:
        identity = self.memory.lookup_source(key)
        if identity is not None:
            return identity
        for depth, tier in enumerate(self.lower):
            identity = tier.lookup_source(key)
            if identity is not None:
                self.memory.bind_source(key, identity)
                for upper in self.lower[:depth]:
                    upper.bind_source(key, identity)
                return identity
        return None

    def get_from_memory(self, identity: bytes) -> PreparedImage | None:
        return self.memory.get(identity)

    def get(self, identity: bytes) -> PreparedImage | None:
        image = self.memory.get(identity)
        if image is not None:
            return image
        for depth, tier in enumerate(self.lower):
            image = tier.get(identity)
            if image is not None:
                self.memory.put(image)
                for upper in self.lower[:depth]:
                    upper.put(image)
                return image
        return None

    def put(self, key: bytes | None, image: PreparedImage) -> None:
        """Retain `image` (and bind `key` to it): memory now, lower tiers in the background."""
        self.memory.put(image)
        if key is not None:
            self.memory.bind_source(key, image.identity)
        if not self.lower:
            return
        with self._pending_lock:
            if len(self._pending) >= MAX_PENDING_WRITES:
                self.skipped_writes += 1  # the writer is behind: keep serving from memory
                log.warning("retention writer is %d writes behind; skipping a lower-tier write",
                            len(self._pending))
                return
            future = self._writer.submit(self._write_lower, key, image)
            self._pending.add(future)
        future.add_done_callback(self._done)

    def _write_lower(self, key: bytes | None, image: PreparedImage) -> None:
        for tier in self.lower:
            try:
                tier.put(image)
                if key is not None:
                    tier.bind_source(key, image.identity)
            except Exception:
                log.exception("retention tier %s failed to store an image", type(tier).__name__)

    def _done(self, future: concurrent.futures.Future[None]) -> None:
        with self._pending_lock:
            self._pending.discard(future)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait for background writes; True when none is left."""
        with self._pending_lock:
            pending = list(self._pending)
        _, not_done = concurrent.futures.wait(pending, timeout=timeout)
        return not not_done

    def memory_stats(self) -> MemoryStats:
        return self.memory.stats()

    def close(self, timeout: float | None = 30.0) -> None:
        self.flush(timeout)
        self._writer.shutdown(wait=False, cancel_futures=True)
        for tier in self.lower:
            close = getattr(tier, "close", None)
            if close is not None:
                close()
