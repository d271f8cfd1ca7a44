"""Scheduler counters (monotonic since start) and the tokens-per-minute window."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field


@dataclass(slots=True)
class SchedulerCounters:
    requests_admitted: int = 0
    requests_completed: int = 0
    requests_cancelled: int = 0
    requests_failed: int = 0
    requests_rejected: int = 0
    prompt_tokens: int = 0            # consumed prompt tokens (no padding, no reuse)
    generation_tokens: int = 0        # committed output tokens
    preemptions: int = 0
    launches_by_kind: Counter[str] = field(default_factory=Counter)
    _minute: deque[tuple[float, int]] = field(default_factory=deque)

    def add_generated(self, count: int, now: float) -> None:
        self.generation_tokens += count
        if count:
            self._minute.append((now, count))

    def tokens_last_minute(self, now: float) -> int:
        while self._minute and now - self._minute[0][0] > 60.0:
            self._minute.popleft()
        return sum(count for _, count in self._minute)
