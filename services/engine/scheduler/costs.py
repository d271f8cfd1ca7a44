"""Per-shape step duration estimates and the choice they feed (the scheduler's cost model).

Each step shape (kind + capacity label) keeps the median of its last nine valid observations.
An estimate starts unmeasured (None); after `stale_after_s` without an observation it is
stale but still available. Host delays and queueing never enter: callers pass device time
(the GPU runner measures each step between CUDA events).

`chunk_budget` uses them: among the token capacities a step's prefill could fill, it picks the
one with the most useful work (an output token is worth `output_value` prompt tokens) per
estimated duration. An unmeasured capacity ranks ahead of every measured one (largest first),
so each shape gets measured once before the measurements decide.
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

    def fresh_duration_s(self, kind: str, label: str, now: float) -> float | None:
        """The shape's estimate, or None when it is unmeasured or stale."""
        if self.is_stale(kind, label, now):
            return None
        return self.estimated_duration_s(kind, label)

    def is_stale(self, kind: str, label: str, now: float) -> bool:
        """No valid observation of the shape within `stale_after_s` (or none at all)."""
        stats = self.shapes.get((kind, label))
        return stats is None or not stats.recent or stats.is_stale(now, self.stale_after_s)


def capacity(count: int) -> int:
    """The power-of-two capacity that holds `count` (batches and tokens bucket by it)."""
    return 1 << max(0, count - 1).bit_length()


def shape_label(num_seqs: int, num_tokens: int) -> str:
    """A step's capacity label (as `Step.label`): b<batch capacity> t<token capacity>."""
    batch, tokens = capacity(num_seqs), capacity(num_tokens)
    return f"b{batch} t{tokens}"


def chunk_budget(costs: DurationEstimator, *, num_seqs: int, num_outputs: int, num_tokens: int,
                 budget: int, min_chunk: int, output_value: float) -> int:
    """Prefill tokens to add to a step that already feeds `num_tokens` tokens of `num_seqs`
    sequences and samples `num_outputs` tokens: `budget` or a smaller capacity that fills a
    power-of-two token capacity, whichever does the most useful work per estimated second."""
    kind = "mixed" if num_tokens else "prefill"
    candidates: list[int] = []
    size = capacity(num_tokens + min_chunk)
    while size - num_tokens < budget:
        candidates.append(size - num_tokens)
        size *= 2
    candidates.append(budget)
    best, best_rate = budget, -1.0
    for chunk in reversed(candidates):             # largest first: unmeasured ones explore
        estimate = costs.estimated_duration_s(kind, shape_label(num_seqs + 1, num_tokens + chunk))
        if estimate is None:
            return chunk
        rate = (output_value * num_outputs + chunk) / max(estimate, 1e-9)
        if rate > best_rate:
            best, best_rate = chunk, rate
    return best
