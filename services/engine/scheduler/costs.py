"""Per-shape step duration estimates: the cost model's measurement half (issue 5 builds on it).

Each step shape (kind + capacity label) keeps the median of its last nine valid observations.
An estimate starts unmeasured (None); after `stale_after_s` without an observation it is
stale but still available. Host delays and queueing never enter: callers pass device time.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

WINDOW = 9
STALE_AFTER_S = 30.0


@dataclass(slots=True)
class ShapeStats:
    kind: str
    label: str
    batch_capacity: int
    token_capacity: int
    calls: int = 0
    untimed: int = 0
    requests_total: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    last_observed: float = -1.0
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=WINDOW))

    def estimate_s(self) -> float | None:
        return statistics.median(self.recent) if self.recent else None

    def is_stale(self, now: float, stale_after_s: float = STALE_AFTER_S) -> bool:
        return self.last_observed < 0 or now - self.last_observed > stale_after_s


class DurationEstimator:
    def __init__(self, stale_after_s: float = STALE_AFTER_S) -> None:
        self.stale_after_s = stale_after_s
        self.shapes: dict[tuple[str, str], ShapeStats] = {}

    def observe(self, *, kind: str, label: str, batch_capacity: int, token_capacity: int,
                num_requests: int, duration_s: float, now: float) -> None:
        key = (kind, label)
        stats = self.shapes.get(key)
        if stats is None:
            stats = self.shapes[key] = ShapeStats(kind, label, batch_capacity, token_capacity)
        stats.calls += 1
        stats.requests_total += num_requests
        if duration_s < 0:
            stats.untimed += 1
            return
        if stats.is_stale(now, self.stale_after_s):
            stats.recent.clear()          # the next valid observation replaces a stale one
        stats.recent.append(duration_s)
        stats.total_s += duration_s
        stats.max_s = max(stats.max_s, duration_s)
        stats.last_observed = now

    def estimated_duration_s(self, kind: str, label: str) -> float | None:
        stats = self.shapes.get((kind, label))
        return stats.estimate_s() if stats else None
