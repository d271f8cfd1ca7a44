"""Load snapshots (GetLoad) and dashboard completion records, built inside the core.

`LoadSnapshot` mirrors proto `helios.v1.LoadSnapshot` field for field (the servicer converts).
Completion records are kept only while a dashboard polls: asking for them turns telemetry on
for `TELEMETRY_WINDOW_S`; at most `MAX_RECORDS` are retained, older ones count as dropped.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from services.common.heap import GcPauses, GcSnapshot
from services.engine.prefix.host_tier import HostTier
from services.engine.scheduler.plan import Completion, SlotHandle, Step
from services.engine.scheduler.scheduler import Scheduler
from services.engine.scheduler.sequence import Phase, Sequence

if TYPE_CHECKING:     # model.moe imports torch, which the engine servicer does not
    from services.engine.model.moe import ExpertLoad

MAX_RECORDS = 1024
TELEMETRY_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class LoadQuery:
    include_requests: bool = False
    include_graphs: bool = False
    completions_after: int | None = None


@dataclass(frozen=True, slots=True)
class GraphRow:
    kind: str
    label: str
    batch_capacity: int
    token_capacity: int
    calls: int
    mean_gpu_ms: float
    max_gpu_ms: float
    untimed: int
    requests_total: int
    stale: bool
    total_gpu_ms: float


@dataclass(frozen=True, slots=True)
class RequestRow:
    slot: int
    generation: int
    phase: str
    prompt_consumed: int
    prompt_len: int
    output_tokens: int
    gap_ms: float
    out_ms: float
    bursts: int


@dataclass(frozen=True, slots=True)
class CompletionRecord:
    sequence: int
    time_s: float
    kind: str
    label: str
    gpu_ms: float
    requests: tuple[SlotHandle, ...]
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class HostTierLoad:
    """The host-memory KV tier's occupancy and counters (prefix/host_tier.py)."""

    pages_total: int
    pages_cached: int
    blocks_offloaded: int
    blocks_dropped: int
    blocks_evicted: int
    hits: int
    reused_tokens: int

    @classmethod
    def of(cls, tier: HostTier) -> HostTierLoad:
        c = tier.counters
        return cls(tier.num_pages, tier.num_used_pages, c.offloaded, c.dropped, c.evicted,
                   c.hits, c.onloaded_tokens)


@dataclass(frozen=True, slots=True)
class SpeculativeLoad:
    """Speculative decoding's counters (scheduler/stats.py; vLLM's spec_decode meanings)."""

    method: str
    num_speculative_tokens: int
    num_drafts: int
    num_draft_tokens: int
    num_accepted_tokens: int
    num_accepted_tokens_per_pos: tuple[int, ...]
    verification_steps: int
    drafter_steps: int
    rounds: int
    depth: int
    switched_off: int

    @classmethod
    def of(cls, scheduler: Scheduler) -> SpeculativeLoad | None:
        proposer = scheduler.state.config.proposer
        if proposer is None:
            return None
        c = scheduler.state.counters
        return cls(getattr(proposer, "method", "ngram"), proposer.num_tokens, c.spec_drafts,
                   c.spec_draft_tokens, c.spec_accepted_tokens,
                   tuple(c.spec_accepted_per_pos), c.spec_verify_steps, c.spec_drafter_steps,
                   c.spec_rounds, c.spec_depth, c.speculation_off)


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    session_id: str
    sample_time_s: float
    uptime_s: float
    slots_total: int
    slots_live: int
    slots_free: int
    slots_retiring: int
    num_running: int
    num_waiting: int
    pages_total: int
    pages_free: int
    pages_cached: int
    pages_retiring: int
    checkpoints_cached: int
    kv_cache_usage: float
    requests_admitted: int
    requests_completed: int
    requests_cancelled: int
    requests_failed: int
    requests_rejected: int
    prefix_lookups: int
    prefix_hits: int
    prefix_misses: int
    prefix_reused_tokens: int
    prefix_query_tokens: int
    checkpoints_published: int
    checkpoints_evicted: int
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    launches_by_kind: dict[str, int]
    tokens_last_minute: int
    admission_paused: bool
    draining: bool
    graphs: tuple[GraphRow, ...] = ()
    requests: tuple[RequestRow, ...] = ()
    dropped_updates: int = 0
    completions: tuple[CompletionRecord, ...] = ()
    expert_tokens: tuple[int, ...] = ()    # MoE: tokens routed per expert since start
    moe_layers: int = 0
    experts_per_token: int = 0
    host_tier: HostTierLoad | None = None      # None: no host tier
    speculative: SpeculativeLoad | None = None  # None: speculative decoding off
    gc: GcSnapshot | None = None     # the core process's collector pauses (common/heap.py)


@dataclass(slots=True)
class Telemetry:
    session_id: str
    started: float = field(default_factory=time.monotonic)
    records: deque[CompletionRecord] = field(default_factory=lambda: deque(maxlen=MAX_RECORDS))
    sequence: int = 0
    dropped: int = 0
    enabled_until: float = 0.0

    def record(self, step: Step, completion: Completion, prompt_len: dict[SlotHandle, int]
               ) -> None:
        """Remember one completed step (only while a dashboard is polling)."""
        now = time.monotonic()
        if now > self.enabled_until:
            return
        self.sequence += 1
        if len(self.records) == MAX_RECORDS:
            self.dropped += 1
        prompt = sum(max(0, min(s.end, prompt_len.get(s.handle, 0)) -
                         min(s.start, prompt_len.get(s.handle, 0))) for s in step.seqs)
        self.records.append(CompletionRecord(
            sequence=self.sequence, time_s=now, kind=step.kind, label=step.label,
            gpu_ms=completion.duration_s * 1e3 if completion.duration_s >= 0 else -1.0,
            requests=tuple(s.handle for s in step.seqs), prompt_tokens=prompt,
            output_tokens=sum(len(r.token_ids) for r in completion.results)))
        if completion.encoded_images:           # the vision encoder ran inside the step
            self.sequence += 1
            self.records.append(CompletionRecord(
                sequence=self.sequence, time_s=now, kind="vision",
                label=f"{completion.encoded_images} image(s)",
                gpu_ms=completion.encoder_s * 1e3, requests=tuple(s.handle for s in step.seqs),
                prompt_tokens=0, output_tokens=0))


def _phase(seq: Sequence) -> str:
    if seq.phase is Phase.RUNNING:
        return "decode" if seq.is_decoding or seq.progress.resume_snapshot is not None \
            else "prefill"
    return seq.phase.value


def snapshot(scheduler: Scheduler, telemetry: Telemetry, query: LoadQuery, *,
             paused: bool, draining: bool, experts: ExpertLoad | None = None) -> LoadSnapshot:
    state = scheduler.state
    res = state.resources
    cache = res.cache
    counters = state.counters
    now = time.monotonic()
    graphs: tuple[GraphRow, ...] = ()
    if query.include_graphs:
        graphs = tuple(GraphRow(
            kind=s.kind, label=s.label, batch_capacity=s.batch_capacity,
            token_capacity=s.token_capacity, calls=s.calls,
            mean_gpu_ms=(s.estimate_s() or 0.0) * 1e3, max_gpu_ms=s.max_s * 1e3,
            untimed=s.untimed, requests_total=s.requests_total,
            stale=s.is_stale(now, state.costs.stale_after_s), total_gpu_ms=s.total_s * 1e3)
            for s in state.costs.shapes.values())
    rows: tuple[RequestRow, ...] = ()
    if query.include_requests:
        live = [seq for record in state.requests.values() for seq in record.seqs
                if not seq.is_finished]
        rows = tuple(RequestRow(
            slot=seq.handle.slot if seq.handle and seq.is_resident else 0,
            generation=seq.handle.generation if seq.handle and seq.is_resident else 0,
            phase=_phase(seq), prompt_consumed=min(seq.num_computed, seq.prompt_len),
            prompt_len=seq.prompt_len, output_tokens=len(seq.output_ids),
            gap_ms=(now - seq.progress.last_progress) * 1e3,
            out_ms=(now - seq.output.last_output) * 1e3 if seq.output.last_output >= 0 else -1.0,
            bursts=seq.output.bursts) for seq in live[:128])
    completions: tuple[CompletionRecord, ...] = ()
    if query.completions_after is not None:
        telemetry.enabled_until = now + TELEMETRY_WINDOW_S
        completions = tuple(r for r in telemetry.records
                            if r.sequence > query.completions_after)
    # vLLM's meaning: pages neither free nor reclaimable from unpinned cache leaves
    used = res.pages.capacity - res.pages.num_free - cache.num_evictable_pages
    return LoadSnapshot(
        session_id=telemetry.session_id, sample_time_s=now, uptime_s=now - telemetry.started,
        slots_total=state.slots.num_slots, slots_live=state.slots.num_live,
        slots_free=state.slots.num_free, slots_retiring=state.slots.num_retiring,
        num_running=len(state.running), num_waiting=len(state.waiting),
        pages_total=res.pages.capacity, pages_free=res.pages.num_free,
        pages_cached=cache.num_cached_pages,
        pages_retiring=res.pages.num_retiring + cache.num_retired_pages,
        checkpoints_cached=cache.num_checkpoints,
        kv_cache_usage=used / res.pages.capacity if res.pages.capacity else 0.0,
        requests_admitted=counters.requests_admitted,
        requests_completed=counters.requests_completed,
        requests_cancelled=counters.requests_cancelled,
        requests_failed=counters.requests_failed, requests_rejected=counters.requests_rejected,
        prefix_lookups=cache.counters.lookups, prefix_hits=cache.counters.hits,
        prefix_misses=cache.counters.misses, prefix_reused_tokens=cache.counters.reused_tokens,
        prefix_query_tokens=cache.counters.query_tokens,
        checkpoints_published=cache.counters.published,
        checkpoints_evicted=cache.counters.evicted, prompt_tokens=counters.prompt_tokens,
        generation_tokens=counters.generation_tokens, preemptions=counters.preemptions,
        launches_by_kind=dict(counters.launches_by_kind),
        tokens_last_minute=counters.tokens_last_minute(now), admission_paused=paused,
        draining=draining, graphs=graphs, requests=rows, dropped_updates=telemetry.dropped,
        completions=completions,
        host_tier=HostTierLoad.of(res.host) if res.host is not None else None,
        speculative=SpeculativeLoad.of(scheduler),
        expert_tokens=experts.tokens if experts else (),
        moe_layers=experts.layers if experts else 0,
        experts_per_token=experts.top_k if experts else 0,
        gc=pauses.snapshot() if (pauses := GcPauses.current()) is not None else None)
