"""The dashboard's memory: bounded buffers of samples and completions, and what they add up to.

Pure Python and clock-free (times are passed in), so every rule is testable without a terminal:
- at most 16,384 completions and 128 request rows are kept; history pushed out by these limits is
  marked truncated, and updates the engine could not record are shown as its dropped count;
- the scheduler pane totals completions over the last two seconds per graph (kind + label);
- a request row's ten-second history shows, per one-second cell, its latest prefill, decode,
  speculative or vision completion, another kind only when the cell holds none of those;
- retired requests stay visible while their history lasts;
- an MoE model's expert load is the growth of its per-expert counters over the same window as
  the throughput (tokens per expert, the most-loaded one, its share and busiest / mean).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from services.dashboard.sample import CompletionSample, EngineSample, RequestKey, RequestSample

MAX_COMPLETIONS = 16_384
MAX_REQUEST_ROWS = 128
SCHEDULER_WINDOW_S = 2.0
HISTORY_CELLS = 10
HISTORY_CELL_S = 1.0
THROUGHPUT_WINDOW_S = 2.0
PRIMARY_KINDS = {"prefill": "P", "decode": "D", "speculative": "S", "verify": "S",
                 "vision": "V"}


@dataclass(slots=True)
class RequestRowState:
    sample: RequestSample
    first_seen_s: float
    retired: bool = False


@dataclass(frozen=True, slots=True)
class GraphRow:
    kind: str
    label: str
    calls: int
    mean_ms: float | None          # over timed calls in the window
    max_ms: float | None
    share: float | None            # of the window's timed graph time
    requests_per_call: float | None
    untimed: int
    estimate_ms: float | None      # the scheduler's current estimate (None: unmeasured)


@dataclass(frozen=True, slots=True)
class ExpertLoadView:
    """Routing over the last THROUGHPUT_WINDOW_S (since start until two samples exist)."""

    tokens: tuple[int, ...]        # tokens routed to each expert in the window
    window_s: float | None         # None: cumulative since the engine started
    busiest: int                   # the most-loaded expert
    busiest_share: float           # its share of the window's routed tokens
    imbalance: float               # busiest / mean (1.0 = perfectly balanced)
    layers: int
    top_k: int


@dataclass(frozen=True, slots=True)
class Throughput:
    prefill_tps: float | None
    generation_tps: float | None


@dataclass
class DashboardState:
    completions: deque[CompletionSample] = field(
        default_factory=lambda: deque(maxlen=MAX_COMPLETIONS))
    rows: dict[RequestKey, RequestRowState] = field(default_factory=dict)
    latest: EngineSample | None = None
    latest_local_s: float | None = None
    truncated_completions: bool = False
    truncated_rows: bool = False
    error: str = ""
    _counters: deque[tuple[float, int, int]] = field(default_factory=lambda: deque(maxlen=64))
    _experts: deque[tuple[float, tuple[int, ...]]] = field(
        default_factory=lambda: deque(maxlen=64))

    # ------------------------------------------------------------------ ingest

    def ingest(self, sample: EngineSample, local_s: float) -> None:
        if self.latest is not None and sample.session_id != self.latest.session_id:
            self.__init__()  # type: ignore[misc]  # a restarted engine: start over
        self.latest, self.latest_local_s, self.error = sample, local_s, ""
        for completion in sample.completions:
            if len(self.completions) == self.completions.maxlen:
                self.truncated_completions = True
            self.completions.append(completion)
        self._counters.append((sample.engine_time_s, sample.prompt_tokens,
                               sample.generation_tokens))
        if sample.expert_tokens:
            self._experts.append((sample.engine_time_s, sample.expert_tokens))
        self._update_rows(sample)

    def ingest_error(self, message: str) -> None:
        self.error = message

    def _update_rows(self, sample: EngineSample) -> None:
        live = {r.key for r in sample.requests}
        for request in sample.requests:
            row = self.rows.get(request.key)
            if row is None:
                self.rows[request.key] = RequestRowState(request, sample.engine_time_s)
            else:
                row.sample, row.retired = request, False
        horizon = sample.engine_time_s - HISTORY_CELLS * HISTORY_CELL_S
        recent = {key for c in self.completions if c.time_s >= horizon for key in c.requests}
        for key, row in list(self.rows.items()):
            if key not in live:
                row.retired = True
                if key not in recent:
                    del self.rows[key]
        if len(self.rows) > MAX_REQUEST_ROWS:
            self.truncated_rows = True
            order = sorted(self.rows, key=lambda k: (not self.rows[k].retired,
                                                     self.rows[k].first_seen_s))
            for key in order[: len(self.rows) - MAX_REQUEST_ROWS]:
                del self.rows[key]

    # ------------------------------------------------------------------ views

    def throughput(self) -> Throughput:
        if len(self._counters) < 2:
            return Throughput(None, None)
        now, prompt_now, gen_now = self._counters[-1]
        start = self._counters[-2]
        for entry in reversed(self._counters):
            start = entry
            if now - entry[0] >= THROUGHPUT_WINDOW_S:
                break
        elapsed = now - start[0]
        if elapsed <= 0:
            return Throughput(None, None)
        return Throughput((prompt_now - start[1]) / elapsed, (gen_now - start[2]) / elapsed)

    def expert_load(self) -> ExpertLoadView | None:
        """Tokens per expert over the last window (the counter's growth between samples);
        None for a dense model."""
        if not self._experts or self.latest is None:
            return None
        now, latest = self._experts[-1]
        start: tuple[float, tuple[int, ...]] | None = None
        for entry in reversed(self._experts):
            if entry[0] < now and len(entry[1]) == len(latest):
                start = entry
                if now - entry[0] >= THROUGHPUT_WINDOW_S:
                    break
        tokens = latest if start is None else tuple(
            b - a for a, b in zip(start[1], latest, strict=True))
        total = sum(tokens)
        busiest = max(range(len(tokens)), key=lambda e: (tokens[e], -e))
        mean = total / len(tokens)
        return ExpertLoadView(
            tokens=tokens, window_s=None if start is None else now - start[0], busiest=busiest,
            busiest_share=tokens[busiest] / total if total else 0.0,
            imbalance=tokens[busiest] / mean if mean else 0.0,
            layers=self.latest.moe_layers, top_k=self.latest.experts_per_token)

    def scheduler_rows(self) -> list[GraphRow]:
        if self.latest is None:
            return []
        now = self.latest.engine_time_s
        groups: dict[tuple[str, str], list[CompletionSample]] = {}
        for graph in self.latest.graphs:
            groups.setdefault((graph.kind, graph.label), [])
        for completion in self.completions:
            if completion.time_s > now - SCHEDULER_WINDOW_S:  # the window (now - 2 s, now]
                groups.setdefault((completion.kind, completion.label), []).append(completion)
        total = sum(c.gpu_ms for cs in groups.values() for c in cs if c.gpu_ms is not None)
        estimates = {(g.kind, g.label): g.mean_gpu_ms for g in self.latest.graphs}
        rows = []
        for (kind, label), calls in groups.items():
            timed = [c.gpu_ms for c in calls if c.gpu_ms is not None]
            estimate = estimates.get((kind, label))
            rows.append(GraphRow(
                kind=kind, label=label, calls=len(calls),
                mean_ms=sum(timed) / len(timed) if timed else None,
                max_ms=max(timed) if timed else None,
                share=sum(timed) / total if timed and total > 0 else None,
                requests_per_call=(sum(len(c.requests) for c in calls) / len(calls)
                                   if calls else None),
                untimed=len(calls) - len(timed),
                estimate_ms=estimate if estimate else None,
            ))
        rows.sort(key=lambda r: (-r.calls, r.kind, r.label))
        return rows

    def history(self, key: RequestKey) -> str:
        """Ten one-second cells, oldest first: P/D/S/V for the cell's latest primary completion,
        a lowercase letter for another kind only when the cell holds none, '·' for nothing."""
        if self.latest is None:
            return "·" * HISTORY_CELLS
        end = self.latest.engine_time_s
        start = end - HISTORY_CELLS * HISTORY_CELL_S
        primary: list[tuple[float, str] | None] = [None] * HISTORY_CELLS
        other: list[tuple[float, str] | None] = [None] * HISTORY_CELLS
        for c in self.completions:
            if key not in c.requests or not start < c.time_s <= end:
                continue
            cell = min(HISTORY_CELLS - 1, int((c.time_s - start) / HISTORY_CELL_S))
            if c.kind in PRIMARY_KINDS:
                current = primary[cell]
                if current is None or c.time_s >= current[0]:
                    primary[cell] = (c.time_s, PRIMARY_KINDS[c.kind])
            else:
                current = other[cell]
                if current is None or c.time_s >= current[0]:
                    other[cell] = (c.time_s, (c.kind[:1] or "?").lower())
        return "".join((p or o or (0.0, "·"))[1] for p, o in zip(primary, other, strict=True))

    def ordered_rows(self) -> list[RequestRowState]:
        return sorted(self.rows.values(), key=lambda r: (r.retired, r.sample.key))

    def sample_age_s(self, local_now_s: float) -> float | None:
        return None if self.latest_local_s is None else local_now_s - self.latest_local_s
