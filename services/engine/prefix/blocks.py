"""BlockIndex: which complete 64-token blocks the prefix cache holds, as stored/removed events.

Prefix-aware routing across replicas sees the cache as a set of block keys. Checkpoints that
share blocks (siblings over one system prompt) are reference-counted, so a block is announced
once when it first becomes cached and removed once when its last holder is evicted.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.engine.prefix.records import BlockEvent


class BlockIndex:
    def __init__(self) -> None:
        self._counts: dict[bytes, int] = {}
        self._events: list[BlockEvent] = []

    def add(self, keys: Sequence[bytes], parent: bytes) -> None:
        """A checkpoint covering `keys` (in prefix order after `parent`) became ready."""
        self._count(keys, parent, +1)

    def remove(self, keys: Sequence[bytes], parent: bytes) -> None:
        """A ready checkpoint covering `keys` was evicted."""
        self._count(keys, parent, -1)

    def take_events(self) -> list[BlockEvent]:
        events, self._events = self._events, []
        return events

    def __contains__(self, key: bytes) -> bool:
        return key in self._counts

    def _count(self, keys: Sequence[bytes], parent: bytes, delta: int) -> None:
        """One event per run of consecutive blocks that appeared (or vanished)."""
        run: list[bytes] = []
        run_parent = b""
        previous = parent
        for key in keys:
            before = self._counts.get(key, 0)
            after = before + delta
            if after:
                self._counts[key] = after
            else:
                self._counts.pop(key, None)
            if (before == 0) != (after == 0):
                if not run:
                    run_parent = previous
                run.append(key)
            elif run:
                self._events.append(BlockEvent(delta > 0, tuple(run), run_parent))
                run = []
            previous = key
        if run:
            self._events.append(BlockEvent(delta > 0, tuple(run), run_parent))
