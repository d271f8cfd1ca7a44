"""Stop strings matched across token boundaries, never emitting text past a stop.

`StopMatcher.push(text)` takes newly decoded text and returns what may be emitted now. Text that
could be the beginning of a stop string (a suffix of what arrived that is a proper prefix of
some stop) is held back until the next push decides it. On a match the result carries the
stop string and the text up to it (plus the stop itself with `include_in_output`); everything
after it is discarded. `flush()` releases the held-back text when the sequence ends otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopResult:
    text: str                 # text that may be emitted now
    stop: str | None = None   # the stop string that matched (the sequence ends)


class StopMatcher:
    def __init__(self, stops: Sequence[str], *, include_in_output: bool = False) -> None:
        self.stops = tuple(dict.fromkeys(s for s in stops if s))
        self.include_in_output = include_in_output
        self._held = ""
        self.matched: str | None = None

    @property
    def held(self) -> str:
        return self._held

    def push(self, text: str) -> StopResult:
        if self.matched is not None:
            return StopResult("", self.matched)
        if not self.stops:
            return StopResult(text)
        buffer = self._held + text
        best_at, best = -1, ""
        for stop in self.stops:
            at = buffer.find(stop)
            if at >= 0 and (best_at < 0 or at < best_at or (at == best_at and len(stop) > len(best))):
                best_at, best = at, stop
        if best_at >= 0:
            self.matched = best
            self._held = ""
            end = best_at + len(best) if self.include_in_output else best_at
            return StopResult(buffer[:end], best)
        hold = self._partial_suffix(buffer)
        self._held = buffer[len(buffer) - hold:] if hold else ""
        return StopResult(buffer[:len(buffer) - hold])

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _partial_suffix(self, buffer: str) -> int:
        """Length of the longest suffix of `buffer` that is a proper prefix of a stop string."""
        longest = 0
        for stop in self.stops:
            for size in range(min(len(stop) - 1, len(buffer)), longest, -1):
                if buffer.endswith(stop[:size]):
                    longest = size
                    break
        return longest
