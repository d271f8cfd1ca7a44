"""Fences: one monotonic completion timeline shared by the runner, the pools and the cache.

Every submission to the runner gets the next fence (1, 2, 3 ...). The runner reports
completions in fence order; `completed` is the highest fence whose work (model execution and
the transfers behind it) has finished. A resource last used by work with fence `f` may be
reused only once `completed >= f`. Fence 0 means "never used": it is always complete.
"""

from __future__ import annotations

from services.common.errors import InternalError

NEVER_USED = 0


class FenceTimeline:
    """Issues fences and tracks the completed one. Plain Python, no device queries."""

    __slots__ = ("_completed", "_issued")

    def __init__(self) -> None:
        self._issued = NEVER_USED
        self._completed = NEVER_USED

    @property
    def issued(self) -> int:
        """The last fence handed out."""
        return self._issued

    @property
    def completed(self) -> int:
        """The highest fence whose work has completed."""
        return self._completed

    @property
    def next_fence(self) -> int:
        """The fence the next submission will carry (not yet issued)."""
        return self._issued + 1

    def issue(self) -> int:
        self._issued += 1
        return self._issued

    def complete(self, fence: int) -> None:
        """Record that `fence` (and so every earlier fence) completed."""
        if fence > self._issued:
            raise InternalError(f"fence {fence} completed before it was issued "
                                f"(last issued {self._issued})")
        if fence < self._completed:
            raise InternalError(f"fence {fence} completed after fence {self._completed}: "
                                "completions must arrive in order")
        self._completed = fence

    def is_complete(self, fence: int) -> bool:
        return fence <= self._completed

    @property
    def outstanding(self) -> int:
        return self._issued - self._completed
