"""SchedulerState: everything the scheduler's verbs share (no logic beyond bookkeeping)."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from services.engine.scheduler.costs import DurationEstimator
from services.engine.scheduler.inflight import InflightBlocks
from services.engine.scheduler.plan import SlotHandle, Step
from services.engine.scheduler.proposals import Proposer, SequenceProposer
from services.engine.scheduler.resources import KVResources
from services.engine.scheduler.sequence import RequestState, Sequence
from services.engine.scheduler.slots import SlotTable
from services.engine.scheduler.stats import SchedulerCounters

PRIORITY_STEP_S = 1.0   # one priority unit counts as having arrived this much earlier


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    max_num_seqs: int = 64                # live request slots
    max_waiting: int = 256                # bounded waiting queue (requests)
    prefill_chunk_size: int = 512         # prompt tokens per sequence per step (64-aligned)
    max_num_batched_tokens: int = 576     # tokens per step across sequences
    max_model_len: int = 4096             # effective context limit
    vocab_size: int = 0
    eos_token_ids: frozenset[int] = frozenset()
    checkpoint_extra_fraction: float = 0.05
    # prefill stops at each checkpoint target (the reference design); False: a chunk runs past
    # a message boundary and captures its partial page only (a "tail" checkpoint, which saves
    # no hidden state: a hit on it always prefills on). A chat then costs no extra forward for
    # its assistant header, a decode-sized step: 4.6 ms at the Qwen3-8B shape on an H200
    # (docs/engine.md, "Tail checkpoints")
    checkpoint_stops: bool = False
    context_hint: str = ""
    capacity_hint: str = ""
    supports_images: bool = False
    max_image_tokens: int = 0             # the longest image span the oldest prefill may take
                                          # whole past the budget (vision models: the context)
    overlap: bool = False                 # plan a decode behind a sequence's in-flight step
    cost_model: bool = False              # size prefill chunks by measured step durations
    # an output token's value in prompt tokens (costs.chunk_budget). At 64, prefill graphs
    # made a 64-token chunk beside 64 decodes cost 1.9 ms more than the decodes alone, so
    # the 64 x 64 outputs' value picked 64-token chunks: new prompts entered one at a time
    # over 16 steps each, TTFT p50 rose from 0.59 to 2.16 s and C=64 1024/1024 fell from
    # 4,603 to 4,254 tok/s (H100, RESULTS.md 2026-12-06). At 4 a step fills the budget unless
    # prefill costs far more per token than the decodes beside it.
    output_token_value: float = 4.0
    proposer: Proposer | SequenceProposer | None = None   # drafts for verification steps
                                          # (None: decode 1)
    pooling: str = "last"                 # embeddings: "last" token, "mean" over the prompt,
                                          # "" none (pooling_hint says why)
    pooling_hint: str = ""
    normalize_embeddings: bool = True     # embeddings are L2-normalized

    def __post_init__(self) -> None:
        if self.max_num_seqs < 1 or self.max_waiting < 0:
            raise ValueError("max_num_seqs must be >= 1 and max_waiting >= 0")
        if self.prefill_chunk_size < 64 or self.prefill_chunk_size % 64:
            raise ValueError("prefill_chunk_size must be a positive multiple of 64")
        if self.max_num_batched_tokens < max(64, self.max_num_seqs):
            raise ValueError("max_num_batched_tokens must be >= 64 and >= max_num_seqs")


def order_key(seq: Sequence) -> tuple[float, int, int]:
    """Fairness order: earlier (priority-shifted) arrival first, then admission order."""
    return (seq.request.arrival, seq.request.serial, seq.index)


@dataclass(eq=False, slots=True)
class SchedulerState:
    config: SchedulerConfig
    resources: KVResources
    slots: SlotTable
    requests: dict[str, RequestState] = field(default_factory=dict)
    waiting: list[Sequence] = field(default_factory=list)     # sorted by order_key
    running: dict[int, Sequence] = field(default_factory=dict)  # slot -> resident sequence
    in_flight: dict[int, Step] = field(default_factory=dict)    # fence -> committed step
    counters: SchedulerCounters = field(default_factory=SchedulerCounters)
    costs: DurationEstimator = field(default_factory=DurationEstimator)
    inflight: InflightBlocks = field(default_factory=InflightBlocks)   # prefill being shared
    next_serial: int = 0
    # (decoding choices, widest rows) of the last batch switch-off while it holds: no choice
    # proposes while the batch is at least that large (policy.batch_switched_off)
    speculation_off_at: tuple[int, int] | None = None

    def enqueue(self, seq: Sequence) -> None:
        keys = [order_key(s) for s in self.waiting]
        self.waiting.insert(bisect.bisect(keys, order_key(seq)), seq)

    def resident(self, handle: SlotHandle) -> Sequence | None:
        seq = self.running.get(handle.slot)
        return seq if seq is not None and seq.handle == handle else None

    @property
    def page_size(self) -> int:
        return self.resources.page_size
