"""Typed objects between the scheduler and the runner: the plan, the step, the completion.

    plan = scheduler.plan()                 # which requests advance by how many tokens
    step = scheduler.commit(plan, fence)    # concrete pages, restores, captures, sampling rows
    runner.submit(step)                     # -> fence; asynchronous in shape
    completion = runner.poll() / wait()
    output = scheduler.complete(completion)

A plan is immutable; it records each participant's state epoch. Mutating or retiring a
participant (cancel, preemption, finish) bumps its epoch, and committing a plan whose epochs no
longer match raises `PlanInvalidated`. Everything here is plain Python: ids, not tensors.

Structured outputs: a sampling row of a choice with a grammar carries the bitmask of the tokens
its grammar allows (`SeqStep.allowed_tokens`, computed at commit from the committed tokens);
such a choice is never planned behind its own in-flight step.

One step semantics: per sequence a step consumes `num_tokens` fed tokens at positions
start.. (writing their K/V), and may emit up to `max_emit` tokens sampled from its last
`max_emit` rows (`sample_from` = end - max_emit is the first sampled position; a resumed
snapshot's hidden state is position start - 1). 0 is a prefill chunk, 1 an ordinary sampling
step (decode, the last prompt chunk, a resume), k + 1 a verification step over k proposed
tokens fed after the known ones (`draft_token_ids`): the runner emits the sampled tokens up
to and including the first that differs from the next draft. Its result states the tokens
emitted and the KV length consumed (= sample_from + len(emitted): rejected drafts' KV lies
past it and is overwritten later).

Prompt scoring (a request with prompt logprobs or an embedding): its steps carry
`score_targets`, the next prompt token of each of the first len(score_targets) fed rows: the
runner computes logits for those rows too and returns each target's logprob, rank and the
`score_top` best alternatives (`SeqResult.prompt_logprobs`, one per target, for positions
start + 1 ..). `pool` asks for the fed rows' final hidden states pooled (`SeqResult.pooled`:
their sum for mean pooling, the last row's state for last-token pooling). Such steps run
eagerly (never in a decode graph); every other step pays nothing.

Two-frame overlap: a decode may be planned behind a sequence's in-flight step that samples
one token (`PlannedSeq.follows`). Its one fed token is that step's sampled token, which the host does
not know yet: the step carries `PENDING_TOKEN` and the runner feeds the token it sampled last
for the slot (on the GPU straight from device memory).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NoReturn

from services.common.errors import InternalError
from services.engine.scheduler.costs import capacity
from services.engine.scheduler.requests import PromptLogprob, SampledLogprobs

PENDING_TOKEN = -1     # a fed token the runner takes from the slot's last sampled token


class PlanInvalidated(InternalError):
    """A participant changed between plan and commit: plan again."""


@dataclass(frozen=True, slots=True)
class SlotHandle:
    """A live sequence: a physical slot and that slot's positive generation."""

    slot: int
    generation: int

    def __str__(self) -> str:
        return f"{self.slot}.{self.generation}"


@dataclass(frozen=True, slots=True)
class PlannedSeq:
    handle: SlotHandle
    epoch: int            # the sequence's state epoch when planned
    start: int            # tokens whose KV exists before the step
    num_tokens: int       # tokens fed this step (0: resume sampling from a snapshot)
    max_emit: int = 0     # tokens the step may emit (0: none; 1: sample; k + 1: verify k drafts)
    follows: bool = False  # a decode behind the sequence's in-flight step (feeds its token)
    draft_token_ids: tuple[int, ...] = ()   # proposals fed after the known tokens (verify)

    @property
    def sample(self) -> bool:
        return self.max_emit > 0

    @property
    def end(self) -> int:
        return self.start + self.num_tokens


@dataclass(frozen=True, slots=True)
class Plan:
    scheduler_id: int
    seqs: tuple[PlannedSeq, ...]

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)


@dataclass(frozen=True, slots=True)
class Restore:
    """Before the forward: copy a snapshot's partial tail (num_tokens rows) into a page."""

    snapshot_id: int
    page_id: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class Capture:
    """After the forward: save the last fed row's hidden state and the partial tail page (a
    tail capture, `SeqStep.tail_captures`: the partial page alone)."""

    snapshot_id: int
    page_id: int          # page holding positions [endpoint - num_tokens, endpoint); -1 if none
    num_tokens: int       # endpoint % page_size
    endpoint: int = 0     # tokens the checkpoint covers (its hidden state is that of row
                          # endpoint - 1, even when a later decode already ran behind it)


@dataclass(frozen=True, slots=True)
class SamplingInit:
    """(Re)initialise a slot's sampling state: params, token history, seed."""

    params: Any                          # the sampler's SamplingParams
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]    # tokens already generated (after preemption)
    seed: int
    logprobs: bool
    top_logprobs: int
    multimodal: Any = None               # the request's MultimodalPrompt (vision models)


@dataclass(frozen=True, slots=True)
class SeqStep:
    handle: SlotHandle
    start: int                         # KV length before the step
    token_ids: tuple[int, ...]         # fed tokens at positions start.. (() = resume sampling;
                                       # (PENDING_TOKEN,) = the slot's last sampled token);
                                       # a verification step's drafts are the last
                                       # max_emit - 1 of them
    page_ids: tuple[int, ...]          # the sequence's page table after the step
    max_emit: int                      # tokens the step may emit (0: it samples nothing)
    output_index: int                  # index of the first token sampled now (seed counter)
    suppress_token_ids: tuple[int, ...] = ()   # ids masked before sampling (min_tokens)
    resume_snapshot: int | None = None  # sample from this snapshot's hidden state
    restore: Restore | None = None
    capture: Capture | None = None
    # checkpoints at message boundaries inside the fed rows (start < endpoint < end), in
    # order: their partial tail pages only, copied after the forward (no hidden state)
    tail_captures: tuple[Capture, ...] = ()
    init: SamplingInit | None = None
    # structured output: the tokens this choice's grammar allows now, an int32 bitmask of
    # ceil(V / 32) words (bit t % 32 of word t // 32); None: every token (no grammar). A
    # verification step's is [max_emit, words]: row o after its first o drafts
    allowed_tokens: Any = None
    # prompt scoring: the next prompt token of each of the first len(score_targets) fed rows
    # (their logprobs, ranks and score_top alternatives come back); pool: "" (none), "last"
    # (the last fed row's hidden state) or "mean" (the sum of the fed rows' hidden states)
    score_targets: tuple[int, ...] = ()
    score_top: int = 0
    pool: str = ""

    @property
    def end(self) -> int:
        return self.start + len(self.token_ids)

    @property
    def sample(self) -> bool:
        return self.max_emit > 0

    @property
    def scores(self) -> bool:
        """The runner computes more than the sampled rows' logits (runs eagerly)."""
        return bool(self.score_targets) or bool(self.pool)

    @property
    def sample_from(self) -> int:
        """Position of the first sampled row (start - 1: a resumed snapshot's state)."""
        return self.end - self.max_emit

    @property
    def draft_token_ids(self) -> tuple[int, ...]:
        """The proposals a verification step checks (fed after the known tokens)."""
        return self.token_ids[len(self.token_ids) - self.max_emit + 1:] if \
            self.max_emit > 1 else ()

    def row_bitmask(self, offset: int) -> Any:
        """The grammar bitmask of sampled row `offset` (None: unconstrained)."""
        mask = self.allowed_tokens
        if mask is None or getattr(mask, "ndim", 1) == 1:
            return mask if offset == 0 else None
        return mask[offset]

    @property
    def feeds_pending(self) -> bool:
        """The first fed token is the slot's last sampled token (not yet known to the host)."""
        return bool(self.token_ids) and self.token_ids[0] == PENDING_TOKEN


@dataclass(frozen=True, slots=True)
class KVTransfers:
    """Host-tier copies a step runs before anything else, offloads first: pages the GPU
    cache evicted (gpu page, host page), then blocks coming back (host page, gpu page) into
    pages the step's sequences own. Each pair moves one page of every layer's K and V."""

    offload: tuple[tuple[int, int], ...] = ()
    onload: tuple[tuple[int, int], ...] = ()

    def __bool__(self) -> bool:
        return bool(self.offload) or bool(self.onload)


NO_TRANSFERS = KVTransfers()


@dataclass(frozen=True, slots=True)
class Step:
    """What the runner executes under one fence."""

    fence: int
    kind: str                          # prefill, decode, mixed, resume
    seqs: tuple[SeqStep, ...]
    transfers: KVTransfers = NO_TRANSFERS

    @property
    def num_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.seqs)

    @property
    def width(self) -> int:
        """Rows per request of a verification step: 1 + the most drafts one verifies."""
        return max((len(s.token_ids) for s in self.seqs), default=0)

    @property
    def label(self) -> str:
        """Capacity label as the dashboard shows it: b<batch capacity> t<token capacity>
        (a verification step: b<batch capacity> w<target width> rows<packed target rows>,
        the rows of its graph)."""
        batch = capacity(len(self.seqs))
        if self.kind == "verify":
            return f"b{batch} w{self.width} rows{batch * self.width}"
        tokens = capacity(self.num_tokens)
        return f"b{batch} t{tokens}"


@dataclass(frozen=True, slots=True)
class SeqResult:
    handle: SlotHandle
    consumed: int                      # KV length after the step (sample_from + emitted;
                                       # start + fed tokens when nothing was sampled)
    token_ids: tuple[int, ...] = ()    # emitted tokens, in order (at most max_emit)
    logprobs: tuple[SampledLogprobs, ...] = ()   # one per emitted token, when asked
    prompt_logprobs: tuple[PromptLogprob, ...] = ()   # one per score target, in order
    pooled: tuple[float, ...] = ()     # the pooled hidden state (float32), when asked


@dataclass(frozen=True, slots=True)
class Completion:
    fence: int
    results: tuple[SeqResult, ...]
    duration_s: float                  # measured execution time; < 0 when untimed
    # the vision encoder's share of the step (images encoded, seconds; 0: none ran)
    encoded_images: int = 0
    encoder_s: float = 0.0


def check(condition: bool, message: str) -> None:
    if not condition:
        fail(message)


def fail(message: str) -> NoReturn:
    raise InternalError(f"invalid completion: {message}")
