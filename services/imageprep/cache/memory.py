"""Memory tier: prepared images by identity, least-recently-used first out, within a byte budget.

Besides the images it keeps the small source-key -> identity map (bounded by count), so a
re-sent encoded image finds its prepared tensors without decoding. An image larger than the
whole budget is not kept (the lower tiers may still hold it). Thread-safe: worker threads and
the event loop call it concurrently.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

from services.imageprep.prepared import PreparedImage

DEFAULT_MAX_SOURCES = 65_536


@dataclass(frozen=True, slots=True)
class MemoryStats:
    num_images: int
    num_bytes: int
    budget_bytes: int
    hits: int
    misses: int
    evictions: int


class MemoryTier:
    def __init__(self, budget_bytes: int, max_sources: int = DEFAULT_MAX_SOURCES) -> None:
        self.budget_bytes = budget_bytes
        self._max_sources = max_sources
        self._images: OrderedDict[bytes, PreparedImage] = OrderedDict()
        self._sources: OrderedDict[bytes, bytes] = OrderedDict()
        self._bytes = 0
        self._hits = self._misses = self._evictions = 0
        self._lock = threading.Lock()

    def get(self, identity: bytes) -> PreparedImage | None:
        with self._lock:
            image = self._images.get(identity)
            if image is None:
                self._misses += 1
                return None
            self._images.move_to_end(identity)
            self._hits += 1
            return image

    def put(self, image: PreparedImage) -> bool:
        """Keep `image` (evicting least recently used ones); False when it exceeds the budget."""
        size = image.nbytes
        with self._lock:
            if image.identity in self._images:
                self._images.move_to_end(image.identity)
                return True
            if size > self.budget_bytes:
                return False
            while self._bytes + size > self.budget_bytes and self._images:
                _, evicted = self._images.popitem(last=False)
                self._bytes -= evicted.nbytes
                self._evictions += 1
            self._images[image.identity] = image
            self._bytes += size
            return True

    def lookup_source(self, key: bytes) -> bytes | None:
        with self._lock:
            identity = self._sources.get(key)
            if identity is not None:
                self._sources.move_to_end(key)
            return identity

    def bind_source(self, key: bytes, identity: bytes) -> None:
        with self._lock:
            self._sources[key] = identity
            self._sources.move_to_end(key)
            while len(self._sources) > self._max_sources:
                self._sources.popitem(last=False)

    def stats(self) -> MemoryStats:
        with self._lock:
            return MemoryStats(len(self._images), self._bytes, self.budget_bytes, self._hits,
                               self._misses, self._evictions)
