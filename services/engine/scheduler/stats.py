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
    # speculative decoding (vLLM's spec_decode names where they exist)
    spec_rounds: int = 0              # completed generation rounds of speculating requests
    spec_depth: int = 0               # draft positions allocated over those rounds
    spec_drafts: int = 0              # rounds that verified at least one draft (num_drafts)
    spec_draft_tokens: int = 0        # drafts verified (num_draft_tokens)
    spec_accepted_tokens: int = 0     # drafts accepted and committed (num_accepted_tokens)
    spec_accepted_per_pos: list[int] = field(default_factory=list)   # by draft position
    spec_verify_steps: int = 0        # completed verification steps
    spec_drafter_steps: int = 0       # learned-proposal depth run (copy proposals: none)
    speculation_off: int = 0          # rounds the batch switch-off stripped every draft
    _minute: deque[tuple[float, int]] = field(default_factory=deque)

    def add_generated(self, count: int, now: float) -> None:
        self.generation_tokens += count
        if count:
            self._minute.append((now, count))

    def add_verification(self, offered: int, accepted: int) -> None:
        """One request round that verified `offered` drafts and committed `accepted` of them."""
        self.spec_drafts += 1
        self.spec_draft_tokens += offered
        self.spec_accepted_tokens += accepted
        while len(self.spec_accepted_per_pos) < offered:
            self.spec_accepted_per_pos.append(0)
        for position in range(accepted):
            self.spec_accepted_per_pos[position] += 1

    def tokens_last_minute(self, now: float) -> int:
        while self._minute and now - self._minute[0][0] > 60.0:
            self._minute.popleft()
        return sum(count for _, count in self._minute)
