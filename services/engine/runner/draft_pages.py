"""What a drafter with its own paged KV keeps per request (runner/drafter.py's draft models,
runner/eagle3_drafter.py's EAGLE-3 heads both build on it).

    pages = DraftPages(num_pages)
    entry = pages.entry(handle)                  # the choice's entry (restarted on a new
    keep = common_prefix(entry.tokens, tokens)   #   slot generation)
    del entry.tokens[keep:]                      # roll back what the choice did not keep
    if not pages.reserve(handle.slot, entry, rows): ...   # pages, evicting LRU entries

One entry per live slot, keyed by slot: its slot generation, the tokens (rows) its KV holds
and the pages holding them, taken from one free list. When the list runs out, the least
recently used other entries give their pages back (they catch up again when next asked).
`forward_times` keeps a drafter's recent per-forward durations; `forward_s` is their median,
which the width policy weighs drafts by when the cost model is on.
"""

from __future__ import annotations

import collections
import statistics
from dataclasses import dataclass, field

from services.engine.scheduler.plan import SlotHandle


@dataclass(slots=True)
class DraftEntry:
    """One choice's draft KV: its slot generation, the token of each row it holds, its pages."""

    generation: int
    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)


class DraftPages:
    def __init__(self, num_pages: int, page_size: int) -> None:
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))
        self._entries: collections.OrderedDict[int, DraftEntry] = collections.OrderedDict()
        self.forward_times: collections.deque[float] = collections.deque(maxlen=9)

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def forward_s(self) -> float:
        """A draft forward's measured duration (the median of recent rounds; 0: none yet)."""
        return statistics.median(self.forward_times) if self.forward_times else 0.0

    def tokens_held(self, slot: int) -> tuple[int, ...]:
        """The tokens of the rows the slot's entry holds (tests, diagnostics)."""
        entry = self._entries.get(slot)
        return tuple(entry.tokens) if entry is not None else ()

    def entry(self, handle: SlotHandle) -> DraftEntry:
        entry = self._entries.get(handle.slot)
        if entry is not None and entry.generation != handle.generation:
            self.drop(handle.slot)            # the slot's earlier choice ended
            entry = None
        if entry is None:
            entry = self._entries[handle.slot] = DraftEntry(handle.generation)
        self._entries.move_to_end(handle.slot)
        return entry

    def reserve(self, slot: int, entry: DraftEntry, num_rows: int) -> bool:
        """Pages for `num_rows` positions, evicting the least recently used other entries
        if needed; False when even that is not enough."""
        needed = -(-num_rows // self.page_size) - len(entry.pages)
        while needed > len(self._free):
            victim = next((s for s in self._entries if s != slot), None)
            if victim is None:
                return False
            self.drop(victim)
        for _ in range(max(0, needed)):
            entry.pages.append(self._free.pop())
        return True

    def drop(self, slot: int) -> None:
        entry = self._entries.pop(slot, None)
        if entry is not None:
            self._free.extend(reversed(entry.pages))


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:                   # the usual case: every held row was kept
        return n
    return next(i for i in range(n) if a[i] != b[i])


class PagedDrafter:
    """What both drafters expose over their `pages` (a DraftPages): the free page count and
    the rows a slot holds (tests, diagnostics), and `forward_s`, a draft forward's measured
    duration, which the width policy weighs drafts by when the cost model is on."""

    pages: DraftPages

    @property
    def free_pages(self) -> int:
        return self.pages.free_pages

    def tokens_held(self, slot: int) -> tuple[int, ...]:
        return self.pages.tokens_held(slot)

    @property
    def forward_s(self) -> float:
        return self.pages.forward_s
