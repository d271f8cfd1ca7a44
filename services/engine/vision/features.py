"""FeatureCache: vision features kept on the model's device by image identity.

    features = cache.get(identity, fence)     # None: not cached; a hit is in use until fence
    cache.put(identity, features, fence)      # retained when the budget allows
    cache.complete(fence)                     # every step up to fence finished

A second request with the same image (the same semantic identity: same pixels, same
processor settings) reuses the features instead of running the encoder. Memory is a byte
budget, evicted least recently used first; an entry a submitted step still reads (its last
use is a fence not completed yet) is never evicted, so a step's inputs stay valid until the
device is done with them. An image larger than the whole budget is used by its step and not
retained.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from services.engine.model.vision.inputs import ImageFeatures


@dataclass(slots=True)
class _Entry:
    features: ImageFeatures
    nbytes: int
    last_fence: int


@dataclass(slots=True)
class FeatureCacheCounters:
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    inserted: int = 0


class FeatureCache:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = max(0, budget_bytes)
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._completed = -1
        self.bytes_used = 0
        self.counters = FeatureCacheCounters()

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, identity: bytes) -> bool:
        return identity in self._entries

    def get(self, identity: bytes, fence: int) -> ImageFeatures | None:
        entry = self._entries.get(identity)
        if entry is None:
            self.counters.misses += 1
            return None
        self.counters.hits += 1
        entry.last_fence = max(entry.last_fence, fence)
        self._entries.move_to_end(identity)
        return entry.features

    def put(self, identity: bytes, features: ImageFeatures, fence: int) -> bool:
        """Retain `features` (in use until `fence`); False when they do not fit."""
        if identity in self._entries:
            self._entries[identity].last_fence = max(self._entries[identity].last_fence, fence)
            return True
        nbytes = features.nbytes
        if nbytes > self.budget_bytes or not self._make_room(nbytes):
            return False
        self._entries[identity] = _Entry(features, nbytes, fence)
        self.bytes_used += nbytes
        self.counters.inserted += 1
        return True

    def complete(self, fence: int) -> None:
        self._completed = max(self._completed, fence)

    def clear(self) -> None:
        """Drop every entry no submitted step reads."""
        self._make_room(self.budget_bytes + 1, everything=True)

    def _make_room(self, nbytes: int, everything: bool = False) -> bool:
        victims = []
        free = self.budget_bytes - self.bytes_used
        for identity, entry in self._entries.items():          # least recent first
            if free >= nbytes and not everything:
                break
            if entry.last_fence > self._completed:
                continue                                       # a step still reads it
            victims.append(identity)
            free += entry.nbytes
        if free < nbytes and not everything:
            return False
        for identity in victims:
            self.bytes_used -= self._entries.pop(identity).nbytes
            self.counters.evictions += 1
        return True
