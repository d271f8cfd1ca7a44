"""FencedIdPool: zero-based logical ids (KV pages, snapshot rows) reused only after their fence.

Verbs: `can_allocate(n)`, `allocate(n)`, `retire(ids, fence)`, `advance_completed(fence)`.
An id is FREE (allocatable), OWNED (by a request or the prefix cache) or RETIRING (given back,
but work with fence `f` may still read or write it). `retire` with a fence that is already
complete frees at once; otherwise the id waits until `advance_completed` reports that fence.
This holds on the CPU path too (where work completes before `submit` returns), so the GPU path
inherits correct lifetimes. The pool never touches storage: the runner maps ids to tensors.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable

from services.common.errors import InternalError

_FREE, _OWNED, _RETIRING = 0, 1, 2


class FencedIdPool:
    __slots__ = ("_completed", "_free", "_kind", "_order", "_retiring", "_retiring_count",
                 "_state")

    def __init__(self, capacity: int, *, kind: str = "page") -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self._kind = kind
        self._state = bytearray(capacity)          # per id: _FREE, _OWNED or _RETIRING
        # LIFO free list: recently freed ids are reused first (warm in caches).
        self._free: list[int] = list(range(capacity - 1, -1, -1))
        self._retiring: list[tuple[int, int, tuple[int, ...]]] = []  # heap (fence, seq, ids)
        self._retiring_count = 0
        self._completed = 0
        self._order = itertools.count()

    # -- sizes ------------------------------------------------------------------------------
    @property
    def capacity(self) -> int:
        return len(self._state)

    @property
    def num_free(self) -> int:
        """Ids allocatable now (their fences completed)."""
        return len(self._free)

    @property
    def num_retiring(self) -> int:
        """Ids given back whose final-use fence has not completed yet."""
        return self._retiring_count

    @property
    def num_owned(self) -> int:
        return self.capacity - self.num_free - self._retiring_count

    @property
    def completed_fence(self) -> int:
        return self._completed

    # -- verbs ------------------------------------------------------------------------------
    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> tuple[int, ...]:
        """Take `count` free ids (callers check `can_allocate` first)."""
        if count > len(self._free):
            raise InternalError(f"{self._kind} pool: {count} requested, {len(self._free)} free")
        if count <= 0:
            return ()
        ids = tuple(self._free[-count:][::-1])
        del self._free[-count:]
        state = self._state
        for i in ids:
            state[i] = _OWNED
        return ids

    def retire(self, ids: Iterable[int], fence: int) -> None:
        """Give back owned ids whose last use is the work with `fence`."""
        ids = tuple(ids)
        state = self._state
        for i in ids:
            if not 0 <= i < len(state) or state[i] != _OWNED:
                what = "out of range" if not 0 <= i < len(state) else (
                    "free" if state[i] == _FREE else "already retiring")
                raise InternalError(f"{self._kind} {i} given back but it is {what}")
        if not ids:
            return
        if fence <= self._completed:
            for i in ids:
                state[i] = _FREE
            self._free.extend(ids)
            return
        for i in ids:
            state[i] = _RETIRING
        heapq.heappush(self._retiring, (fence, next(self._order), ids))
        self._retiring_count += len(ids)

    def advance_completed(self, fence: int) -> tuple[int, ...]:
        """Work up to `fence` completed: free every id retired with a fence <= it."""
        if fence < self._completed:
            return ()
        self._completed = fence
        released: list[int] = []
        while self._retiring and self._retiring[0][0] <= fence:
            _, _, ids = heapq.heappop(self._retiring)
            released.extend(ids)
        if released:
            state = self._state
            for i in released:
                state[i] = _FREE
            self._free.extend(released)
            self._retiring_count -= len(released)
        return tuple(released)

    def is_owned(self, page_id: int) -> bool:
        return 0 <= page_id < len(self._state) and self._state[page_id] == _OWNED
