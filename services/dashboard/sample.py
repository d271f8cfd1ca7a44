"""What the dashboard reads from the engine: typed samples converted from `GetLoad` (the edge).

The dashboard polls `Engine.GetLoad` every 500 ms asking for request rows, graph statistics and
the completion records after its cursor; asking keeps the engine's telemetry on (it is off when
no dashboard polls). Only this module touches protobuf.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from services.common.pb import engine_pb2, engine_pb2_grpc

RequestKey = tuple[int, int]  # (slot, generation)


@dataclass(frozen=True, slots=True)
class CompletionSample:
    sequence: int
    time_s: float
    kind: str
    label: str
    gpu_ms: float | None          # None when untimed
    requests: tuple[RequestKey, ...]
    prompt_tokens: int
    output_tokens: int


@dataclass(frozen=True, slots=True)
class RequestSample:
    key: RequestKey
    phase: str
    prompt_consumed: int
    prompt_len: int
    output_tokens: int
    gap_ms: float
    out_ms: float | None           # None before the first publication
    bursts: int


@dataclass(frozen=True, slots=True)
class GraphSample:
    kind: str
    label: str
    calls: int
    mean_gpu_ms: float
    max_gpu_ms: float
    untimed: int
    requests_total: int
    stale: bool


@dataclass(frozen=True, slots=True)
class EngineSample:
    """One GetLoad answer. Counters are cumulative since the engine started."""

    session_id: str
    engine_time_s: float
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
    requests_completed: int
    requests_failed: int
    requests_cancelled: int
    prefix_reused_tokens: int
    prompt_tokens: int
    generation_tokens: int
    admission_paused: bool
    draining: bool
    dropped_updates: int
    graphs: tuple[GraphSample, ...]
    requests: tuple[RequestSample, ...]
    completions: tuple[CompletionSample, ...]
    # MoE models: tokens routed per expert since start (summed over the sparse layers)
    expert_tokens: tuple[int, ...] = ()
    moe_layers: int = 0
    experts_per_token: int = 0
    speculative: SpeculativeSample | None = None   # None: speculative decoding off


@dataclass(frozen=True, slots=True)
class SpeculativeSample:
    drafter_steps: int
    verification_steps: int
    num_drafts: int              # rounds that verified at least one draft
    accepted_tokens: int
    rounds: int                  # generation rounds of speculating requests
    depth: int                   # draft positions allocated over them

    @property
    def acceptance_length(self) -> float | None:
        """Accepted drafts per round that offered any (the bonus token excluded)."""
        return self.accepted_tokens / self.num_drafts if self.num_drafts else None

    @property
    def mean_depth(self) -> float | None:
        """Draft positions per round, zero-draft rounds included."""
        return self.depth / self.rounds if self.rounds else None


def from_pb(snapshot: engine_pb2.LoadSnapshot) -> EngineSample:
    s = snapshot
    return EngineSample(
        session_id=s.session_id, engine_time_s=s.sample_time_s, uptime_s=s.uptime_s,
        slots_total=s.slots_total, slots_live=s.slots_live, slots_free=s.slots_free,
        slots_retiring=s.slots_retiring, num_running=s.num_running, num_waiting=s.num_waiting,
        pages_total=s.pages_total, pages_free=s.pages_free, pages_cached=s.pages_cached,
        pages_retiring=s.pages_retiring, checkpoints_cached=s.checkpoints_cached,
        requests_completed=s.requests_completed, requests_failed=s.requests_failed,
        requests_cancelled=s.requests_cancelled, prefix_reused_tokens=s.prefix_reused_tokens,
        prompt_tokens=s.prompt_tokens, generation_tokens=s.generation_tokens,
        admission_paused=s.admission_paused, draining=s.draining,
        dropped_updates=s.dropped_updates,
        graphs=tuple(GraphSample(g.kind, g.label, g.calls, g.mean_gpu_ms, g.max_gpu_ms,
                                 g.untimed, g.requests_total, g.stale) for g in s.graphs),
        requests=tuple(RequestSample((r.slot, r.generation), r.phase, r.prompt_consumed,
                                     r.prompt_len, r.output_tokens, r.gap_ms,
                                     r.out_ms if r.out_ms >= 0 else None, r.bursts)
                       for r in s.requests),
        completions=tuple(
            CompletionSample(c.sequence, c.time_s, c.kind, c.label,
                             c.gpu_ms if c.gpu_ms >= 0 else None,
                             tuple((r.slot, r.generation) for r in c.requests),
                             c.prompt_tokens, c.output_tokens)
            for c in s.completions),
        expert_tokens=tuple(s.expert_tokens), moe_layers=s.moe_layers,
        experts_per_token=s.experts_per_token,
        speculative=SpeculativeSample(
            s.speculative.drafter_steps, s.speculative.verification_steps,
            s.speculative.num_drafts, s.speculative.num_accepted_tokens,
            s.speculative.rounds, s.speculative.depth)
        if s.HasField("speculative") else None,
    )


class EngineSource:
    """Polls one engine's GetLoad with a completion cursor (synchronous; one call per sample)."""

    def __init__(self, address: str, timeout_s: float = 2.0) -> None:
        self.address = address
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(address)
        self._stub = engine_pb2_grpc.EngineStub(self._channel)
        self.cursor = 0

    def model_name(self) -> str:
        try:
            info = self._stub.GetModelInfo(engine_pb2.GetModelInfoRequest(),
                                           timeout=self._timeout_s)
        except grpc.RpcError:
            return "?"
        return next((n for n in info.served_names if n), info.model_id)

    def poll(self) -> EngineSample:
        """Raises grpc.RpcError when the engine does not answer."""
        snapshot = self._stub.GetLoad(
            engine_pb2.GetLoadRequest(include_requests=True, include_graphs=True,
                                      completions_after=self.cursor),
            timeout=self._timeout_s)
        sample = from_pb(snapshot)
        if sample.completions:
            self.cursor = max(c.sequence for c in sample.completions)
        return sample

    def close(self) -> None:
        self._channel.close()

