"""Live state of one request and of each of its choices (sequences), in parts with owners.

A `Sequence` is one choice: its `Choice` (request, index, seed: never changes), its
lifecycle (phase, slot handle, epoch), and three parts, each changed only through its own
methods, by one stage of the scheduler:

| part | holds | changed by |
|---|---|---|
| `Progress` | KV tokens computed, steps in flight, restore / resume / init owed to the runner | the step verbs: `commit` (scheduler.py) submits, `complete` (completion.py) completes, residency.py starts and resets |
| `CacheHold` | the page table, private pages, pins, the base checkpoint, checkpoint targets and their snapshot rows | residency.py (hold, reserve, release), commit (pages), publication.py (publish, terminal capture) |
| `Output` | generated tokens, the finish reason, the grammar matcher, output timing | completion.py (commit tokens, finish) |

Every change that invalidates plans bumps `Sequence.epoch`.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from services.engine.grammar.matcher import GrammarMatcher
from services.engine.prefix.history import PrefixHistory
from services.engine.prefix.host_tier import HostBlock
from services.engine.prefix.records import CheckpointRef, Pin, PrefixHit
from services.engine.scheduler.plan import SlotHandle
from services.engine.scheduler.requests import (
    EngineRequest,
    FinishReason,
    PromptLogprob,
    StopRules,
)
from services.engine.scheduler.speculation import AcceptanceStats


class Phase(enum.Enum):
    QUEUED = "queued"          # waiting for a slot (never ran)
    PREEMPTED = "preempted"    # waiting for a slot again; generated tokens kept
    RUNNING = "running"        # resident in a slot (prefill or decode: see counts)
    CAPTURING = "capturing"    # finished for the caller; one step saves its terminal state
    FINISHED = "finished"      # done; resources retire behind `last_fence`


@dataclass(frozen=True, slots=True)
class Choice:
    """Which request and choice this is, and its sampling seed."""

    request: RequestState
    index: int
    seed: int


@dataclass(eq=False, slots=True)
class Progress:
    """How far the choice's KV got and what the runner still owes it."""

    num_computed: int = 0               # tokens whose KV is in the page table
    in_flight_fences: list[int] = field(default_factory=list)  # submitted, not completed
    last_fence: int = 0                 # fence of the last submitted step using it
    scheduled_end: int = 0              # KV length after the last submitted step
    can_follow: bool = False            # the last submitted step emits one token, captures none
    needs_init: bool = True             # the runner must (re)initialise sampling state
    resume_snapshot: int | None = None  # full hit: sample from this snapshot next
    restore: tuple[int, int] | None = None   # (snapshot id, tokens) to restore before prefill
    last_progress: float = field(default_factory=time.monotonic)

    def start(self, computed: int, restore: tuple[int, int] | None,
              resume_snapshot: int | None) -> None:
        """Resident again (residency): KV from a prefix hit, sampling state to install."""
        self.num_computed = computed
        self.restore = restore
        self.resume_snapshot = resume_snapshot
        self.needs_init = True

    def released(self) -> None:
        """Out of its slot: nothing is owed to the runner any more."""
        self.restore = self.resume_snapshot = None

    def reset(self) -> None:
        """Preempted: the KV is gone; in-flight steps will be discarded."""
        self.num_computed = 0
        self.in_flight_fences.clear()
        self.restore = self.resume_snapshot = None
        self.needs_init = True

    def take_restore(self) -> tuple[int, int] | None:
        restore, self.restore = self.restore, None
        return restore

    def take_init(self) -> bool:
        needs, self.needs_init = self.needs_init, False
        return needs

    def submitted(self, fence: int, end: int, can_follow: bool) -> None:
        self.in_flight_fences.append(fence)
        self.last_fence = fence
        self.scheduled_end = end
        self.can_follow = can_follow

    def owns_completion(self, fence: int) -> bool:
        """The oldest in-flight step is `fence` (else the result is stale: discard it)."""
        return bool(self.in_flight_fences) and self.in_flight_fences[0] == fence

    def discarded(self) -> None:
        """The oldest in-flight step's result is dropped (it ran behind the finishing token)."""
        self.in_flight_fences.pop(0)

    def completed(self, consumed: int, *, fed: bool, resumed: bool, now: float) -> None:
        self.in_flight_fences.pop(0)
        self.num_computed = consumed
        if resumed:
            self.resume_snapshot = None
        if fed:
            self.last_progress = now

    def pending_last(self, total_len: int) -> None:
        """After emitted tokens: the last one's KV comes with the next step (and KV of drafts
        behind a finishing token is never used)."""
        self.num_computed = min(self.num_computed, total_len - 1)

    @property
    def in_flight(self) -> int:
        """Fence of the latest submitted step still running (0: none)."""
        return self.in_flight_fences[-1] if self.in_flight_fences else 0


@dataclass(eq=False, slots=True)
class CacheHold:
    """The pages and checkpoints a resident choice holds."""

    page_ids: list[int] = field(default_factory=list)
    private_pages: set[int] = field(default_factory=set)   # pages this sequence owns
    pins: list[Pin] = field(default_factory=list)
    base: CheckpointRef | None = None   # deepest checkpoint on this sequence's history
    targets: list[int] = field(default_factory=list)       # checkpoint endpoints to capture
    target_snapshots: dict[int, int] = field(default_factory=dict)   # endpoint -> snapshot row
    # host-tier blocks this choice brings back (pinned until the step that copies them
    # commits) and their copies (host page, gpu page) into its private pages
    host_blocks: tuple[HostBlock, ...] = ()
    onload: tuple[tuple[int, int], ...] = ()

    def hold(self, hit: PrefixHit, pin: Pin | None) -> None:
        """Start from a prefix hit: its pages (shared, read-only) front the page table."""
        self.page_ids = list(hit.page_ids)
        self.private_pages = set()
        self.base = hit.checkpoint
        self.pins = [pin] if pin is not None else []

    def bring_back(self, blocks: tuple[HostBlock, ...], pages: tuple[int, ...]) -> None:
        """Host blocks continue the hit: `pages` (private) receive them before the first
        step's forward."""
        self.grow(pages)
        self.host_blocks = blocks
        self.onload = tuple((host, gpu) for host, gpu in zip(
            (p for block in blocks for p in block.host_pages), pages, strict=True))

    def take_onload(self) -> tuple[tuple[tuple[int, int], ...], tuple[HostBlock, ...]]:
        """The copies the committing step runs and the blocks they read (to unpin)."""
        taken = (self.onload, self.host_blocks)
        self.onload, self.host_blocks = (), ()
        return taken

    def grow(self, pages: Iterable[int]) -> None:
        pages = list(pages)
        self.page_ids.extend(pages)
        self.private_pages.update(pages)

    def reserve(self, endpoint: int, row: int) -> None:
        self.target_snapshots[endpoint] = row
        self.targets = sorted(self.target_snapshots)

    def take_target(self, endpoint: int) -> int:
        """The snapshot row reserved for `endpoint`, which is no longer a target."""
        self.targets.remove(endpoint)
        return self.target_snapshots.pop(endpoint)

    def published(self, tail: list[int], pin: Pin, checkpoint: CheckpointRef) -> list[Pin]:
        """The tail pages moved to a new checkpoint that the sequence now pins (as its base);
        returns the pins it held before."""
        self.private_pages.difference_update(tail)
        previous, self.pins = self.pins, [pin]
        self.base = checkpoint
        return previous

    def owns(self, start: int, end: int, page_size: int) -> bool:
        """Whether the pages over positions [start, end) are all private."""
        return all(page in self.private_pages
                   for page in self.page_ids[start // page_size:end // page_size])

    def release(self) -> tuple[list[Pin], set[int], list[int]]:
        """Give everything back: (pins, private pages, snapshot rows) for the caller to
        retire behind the last fence."""
        held = (list(self.pins), self.private_pages, list(self.target_snapshots.values()))
        self.pins = []
        self.private_pages = set()
        self.target_snapshots = {}
        self.targets = []
        self.page_ids = []
        self.base = None
        self.onload = ()
        return held


@dataclass(eq=False, slots=True)
class Output:
    """What the choice generated and how it ended."""

    token_ids: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    matcher: GrammarMatcher | None = None   # structured output: this choice's grammar state
    last_output: float = -1.0
    bursts: int = 0                     # completed steps whose tokens were published
    prompt_scored: int = 0              # prompt logprobs reported (positions 1..this)
    pool_sum: list[float] | None = None  # embedding: pooled state so far (this residency)

    def append(self, token: int) -> None:
        self.token_ids.append(token)

    def published(self, now: float) -> None:
        self.last_output = now
        self.bursts += 1

    def scored(self, entries: tuple[PromptLogprob, ...]) -> tuple[PromptLogprob, ...]:
        """The prompt logprobs not reported yet (a replay after preemption repeats some)."""
        fresh = tuple(e for e in entries if e.position > self.prompt_scored)
        if fresh:
            self.prompt_scored = fresh[-1].position
        return fresh

    def pool(self, pooled: tuple[float, ...], *, restart: bool, accumulate: bool) -> None:
        """Fold a step's pooled state in (a restart from position 0 forgets earlier ones)."""
        if restart or self.pool_sum is None or not accumulate:
            self.pool_sum = list(pooled)
        else:
            self.pool_sum = [a + b for a, b in zip(self.pool_sum, pooled, strict=True)]

    def finish(self, reason: FinishReason | None) -> None:
        if self.finish_reason is None:
            self.finish_reason = reason
        self.matcher = None


@dataclass(eq=False, slots=True)
class Sequence:
    choice: Choice
    phase: Phase = Phase.QUEUED
    epoch: int = 0
    handle: SlotHandle | None = None
    progress: Progress = field(default_factory=Progress)
    cache: CacheHold = field(default_factory=CacheHold)
    output: Output = field(default_factory=Output)
    # choice 0 of a request with prompt logprobs or an embedding: it prefills from position 0
    # and its steps score every prompt row (fixed at admission)
    scoring: bool = False
    # speculative decoding: this choice's draft acceptance by depth and source (policy.py)
    speculation: AcceptanceStats = field(default_factory=AcceptanceStats)

    # -- identity -----------------------------------------------------------------------------
    @property
    def request(self) -> RequestState:
        return self.choice.request

    @property
    def index(self) -> int:
        return self.choice.index

    @property
    def seed(self) -> int:
        return self.choice.seed

    # -- token arithmetic -------------------------------------------------------------------
    @property
    def num_computed(self) -> int:
        return self.progress.num_computed

    @property
    def output_ids(self) -> list[int]:
        return self.output.token_ids

    @property
    def page_ids(self) -> list[int]:
        return self.cache.page_ids

    @property
    def matcher(self) -> GrammarMatcher | None:
        return self.output.matcher

    @property
    def finish_reason(self) -> FinishReason | None:
        return self.output.finish_reason

    @property
    def prompt_len(self) -> int:
        return len(self.request.request.prompt_token_ids)

    @property
    def total_len(self) -> int:
        """Prompt plus generated tokens: the sequence's known tokens."""
        return self.prompt_len + len(self.output.token_ids)

    def token_at(self, index: int) -> int:
        prompt = self.request.request.prompt_token_ids
        return prompt[index] if index < len(prompt) else \
            self.output.token_ids[index - len(prompt)]

    def tokens(self, start: int, end: int) -> tuple[int, ...]:
        prompt = self.request.request.prompt_token_ids
        if end <= len(prompt):
            return tuple(prompt[start:end])
        head = tuple(prompt[start:]) if start < len(prompt) else ()
        outputs = self.output.token_ids
        return head + tuple(outputs[max(0, start - len(prompt)):end - len(prompt)])

    @property
    def in_flight(self) -> int:
        return self.progress.in_flight

    @property
    def scores_prompt(self) -> bool:
        """Choice 0 of a request with prompt logprobs or an embedding (`scoring`)."""
        return self.scoring

    @property
    def prompt_only(self) -> bool:
        """max_tokens 0: the prompt is scored, nothing is generated."""
        return self.request.stop.max_tokens == 0

    @property
    def is_decoding(self) -> bool:
        return bool(self.output.token_ids) and self.progress.num_computed >= self.total_len - 1

    @property
    def is_finished(self) -> bool:
        """Finished for the caller (its last token and finish reason were reported)."""
        return self.output.finish_reason is not None

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
    cached_tokens: int = 0             # prompt tokens served from cache (both tiers)
    cached_tokens_host: int = 0        # of them, brought back from the host tier
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
