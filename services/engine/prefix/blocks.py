"""BlockIndex: which complete 64-token blocks the prefix cache holds, as stored/removed events.

Prefix-aware routing across replicas sees the cache as a set of block keys. Checkpoints that
share blocks (siblings over one system prompt) are reference-counted, so a block is announced
once when it first becomes cached (with its tokens, for routers that hash tokens themselves)
and removed once when its last holder is evicted; `clear` replaces whatever is pending with one
all-cleared event.
"""

from __future__ import annotations

from collections.abc import Sequence

from services.engine.prefix.history import BLOCK_TOKENS
from services.engine.prefix.records import BlockEvent


class BlockIndex:
    def __init__(self) -> None:
        self._counts: dict[bytes, int] = {}
        self._events: list[BlockEvent] = []

    def add(self, keys: Sequence[bytes], parent: bytes, tokens: Sequence[int]) -> None:
        """A checkpoint covering `keys` (in prefix order after `parent`; `tokens`: 64 per key)
        became ready."""
        self._count(keys, parent, +1, tokens)

    def remove(self, keys: Sequence[bytes], parent: bytes) -> None:
        """A ready checkpoint covering `keys` was evicted."""
        self._count(keys, parent, -1, ())

    def clear(self) -> None:
        """Nothing is cached any more: one all-cleared event stands for everything pending."""
        self._counts.clear()
        self._events = [BlockEvent.all_cleared()]

    def take_events(self) -> list[BlockEvent]:
        events, self._events = self._events, []
        return events

    def __contains__(self, key: bytes) -> bool:
        return key in self._counts

    def _count(self, keys: Sequence[bytes], parent: bytes, delta: int,
               tokens: Sequence[int]) -> None:
        """One event per run of consecutive blocks that appeared (or vanished)."""
        run: list[bytes] = []
        run_start = 0
        run_parent = b""
        previous = parent
        for index, key in enumerate(keys):
            before = self._counts.get(key, 0)
            after = before + delta
            if after:
                self._counts[key] = after
            else:
                self._counts.pop(key, None)
            if (before == 0) != (after == 0):
                if not run:
                    run_parent, run_start = previous, index
                run.append(key)
            elif run:
                self._emit(delta > 0, run, run_parent, tokens, run_start)
                run = []
            previous = key
        if run:
            self._emit(delta > 0, run, run_parent, tokens, run_start)

    def _emit(self, stored: bool, run: list[bytes], parent: bytes, tokens: Sequence[int],
              start: int) -> None:
        span = tuple(tokens[start * BLOCK_TOKENS:(start + len(run)) * BLOCK_TOKENS]) \
            if stored else ()
        self._events.append(BlockEvent(stored, tuple(run), parent, span))
