"""Live state of one request and of each of its choices (sequences). Mutated only by the
scheduler; every mutation that invalidates plans bumps `Sequence.epoch`."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field

from services.engine.grammar.matcher import GrammarMatcher
from services.engine.prefix.history import PrefixHistory
from services.engine.prefix.records import CheckpointRef, Pin
from services.engine.scheduler.plan import SlotHandle
from services.engine.scheduler.requests import EngineRequest, FinishReason, StopRules


class Phase(enum.Enum):
    QUEUED = "queued"          # waiting for a slot (never ran)
    PREEMPTED = "preempted"    # waiting for a slot again; generated tokens kept
    RUNNING = "running"        # resident in a slot (prefill or decode: see counts)
    CAPTURING = "capturing"    # finished for the caller; one step saves its terminal state
    FINISHED = "finished"      # done; resources retire behind `last_fence`


@dataclass(eq=False, slots=True)
class Sequence:
    request: RequestState
    index: int                          # choice index
    seed: int
    phase: Phase = Phase.QUEUED
    epoch: int = 0
    handle: SlotHandle | None = None
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0               # tokens whose KV is in the page table
    page_ids: list[int] = field(default_factory=list)
    private_pages: set[int] = field(default_factory=set)   # pages this sequence owns
    pins: list[Pin] = field(default_factory=list)
    base: CheckpointRef | None = None   # deepest checkpoint on this sequence's history
    resume_snapshot: int | None = None  # full hit: sample from this snapshot next
    restore: tuple[int, int] | None = None   # (snapshot id, tokens) to restore before prefill
    targets: list[int] = field(default_factory=list)        # checkpoint endpoints to capture
    target_snapshots: dict[int, int] = field(default_factory=dict)   # endpoint -> snapshot row
    needs_init: bool = True             # the runner must (re)initialise sampling state
    in_flight_fences: list[int] = field(default_factory=list)  # submitted, not completed
    last_fence: int = 0                 # fence of the last submitted step using it
    scheduled_end: int = 0              # KV length after the last submitted step
    can_follow: bool = False            # the last submitted step samples and captures nothing
    finish_reason: FinishReason | None = None
    last_progress: float = field(default_factory=time.monotonic)
    last_output: float = -1.0
    bursts: int = 0
    matcher: GrammarMatcher | None = None   # structured output: this choice's grammar state

    # -- token arithmetic -------------------------------------------------------------------
    @property
    def prompt_len(self) -> int:
        return len(self.request.request.prompt_token_ids)

    @property
    def total_len(self) -> int:
        """Prompt plus generated tokens: the sequence's known tokens."""
        return self.prompt_len + len(self.output_ids)

    def token_at(self, index: int) -> int:
        prompt = self.request.request.prompt_token_ids
        return prompt[index] if index < len(prompt) else self.output_ids[index - len(prompt)]

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        prompt = self.request.request.prompt_token_ids
        if end <= len(prompt):
            return tuple(prompt[start:end])
        head = tuple(prompt[start:]) if start < len(prompt) else ()
        return head + tuple(self.output_ids[max(0, start - len(prompt)):end - len(prompt)])

    @property
    def in_flight(self) -> int:
        """Fence of the latest submitted step still running (0: none)."""
        return self.in_flight_fences[-1] if self.in_flight_fences else 0

    @property
    def is_decoding(self) -> bool:
        return bool(self.output_ids) and self.num_computed >= self.total_len - 1

    @property
    def is_finished(self) -> bool:
        """Finished for the caller (its last token and finish reason were reported)."""
        return self.finish_reason is not None

    @property
    def is_resident(self) -> bool:
        return self.phase is Phase.RUNNING or self.phase is Phase.CAPTURING

    def bump(self) -> None:
        self.epoch += 1


@dataclass(eq=False, slots=True)
class RequestState:
    request: EngineRequest
    history: PrefixHistory
    stop: StopRules                    # with max_tokens resolved
    arrival: float                     # monotonic seconds, shifted earlier by priority
    serial: int = 0                    # admission order
    seqs: list[Sequence] = field(default_factory=list)
    admission_pin: Pin | None = None
    cached_tokens: int = 0
    cancelled: bool = False

    @property
    def request_id(self) -> str:
        return self.request.request_id

    @property
    def completion_tokens(self) -> int:
        return sum(len(s.output_ids) for s in self.seqs)

    @property
    def is_finished(self) -> bool:
        return all(s.is_finished for s in self.seqs)
