"""Which captured graph serves a step: a decode graph, a verification graph or a prefill
graph (decode_graphs.py), or none (the step runs eagerly).

    choice = GraphChoice(graphs, mirror, max_tokens=frames.limits.tokens, page_size=16)
    packing = choice.packing_for(step, mode, logprobs, grammar)   # GraphPacking | None

- A decode graph: every fed sequence feeds one token and samples it, uploads at most one
  page-table cell, and neither restores nor captures.
- A verification graph: every fed sequence feeds and samples all of its rows (a pending
  token plus drafts, or one decode token); the graph is the narrowest captured one at least
  the step's width (`DecodeGraphs.verify_width_for`). Why a verification ran eagerly is
  counted in `eager_verify_reasons` (diagnostics).
- A prefill graph: the fed rows and sequences fit a token capacity, every fed sequence
  samples at most its last row and captures its hidden state only at its end (tail captures
  inside the chunk copy pages after the graph), nothing scores the prompt, and the page-table
  cells to upload fit the graph's.
In every graph a finished choice that only saves its terminal checkpoint (no tokens) rides
along: its capture copies state after the graph (`GraphRunner._captures`).
"""

from __future__ import annotations

from collections import Counter

from services.engine.runner.decode_graphs import DecodeGraphs, verify_cells
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.slot_state import SamplingMode
from services.engine.runner.step_inputs import GraphPacking
from services.engine.scheduler.plan import SeqStep, Step


def _rides_along(seq: SeqStep) -> bool:
    """A sequence that feeds nothing may join a graph step only to save its terminal
    checkpoint (not sample, restore or resume)."""
    return (not seq.sample and seq.capture is not None and seq.restore is None and
            seq.resume_snapshot is None)


class GraphChoice:
    def __init__(self, graphs: DecodeGraphs, mirror: PageTableMirror, *, max_tokens: int,
                 page_size: int) -> None:
        self.graphs = graphs
        self.mirror = mirror
        self.max_tokens = max_tokens          # fed rows the input buffers hold
        self.page_size = page_size
        # why verification steps ran eagerly (no graph serves them), by reason: diagnostics
        self.eager_verify_reasons: Counter[str] = Counter()

    def packing_for(self, step: Step, mode: SamplingMode, logprobs: bool,
                    grammar: bool) -> GraphPacking | None:
        """The graph that serves `step` (its packing), or None (run it eagerly)."""
        if any(seq.max_emit > 1 for seq in step.seqs):
            return self._verify(step, mode, logprobs, grammar)
        capacity = self._decode_capacity(step)
        if capacity is not None:
            return self.graphs.packing(capacity)
        return self._prefill(step)

    def _decode_capacity(self, step: Step) -> int | None:
        """The decode capacity that serves `step`, or None."""
        graphs = self.graphs
        if not graphs.capacities:
            return None
        fed = 0
        for seq in step.seqs:
            if seq.scores:
                return None                      # prompt scoring runs eagerly
            if not seq.token_ids:
                if not _rides_along(seq):
                    return None
                continue
            if (len(seq.token_ids) != 1 or not seq.sample or seq.restore is not None or
                    seq.capture is not None or
                    self.mirror.pending(seq.handle, seq.page_ids) > 1):
                return None
            fed += 1
        if not fed or fed > graphs.max_capacity:
            return None
        return graphs.capacity_for(fed)

    def _verify(self, step: Step, mode: SamplingMode, logprobs: bool,
                grammar: bool) -> GraphPacking | None:
        """The verification graph for `step`, or None (the reason counted)."""
        graphs = self.graphs
        reasons = self.eager_verify_reasons
        fed = [seq for seq in step.seqs if seq.token_ids]
        for seq in step.seqs:
            if not seq.token_ids:
                if not _rides_along(seq):
                    reasons["a resume from a snapshot"] += 1
                    return None
            elif seq.scores or seq.max_emit != len(seq.token_ids):
                reasons["a prefill chunk or prompt scoring beside it (mixed)"] += 1
                return None
            elif seq.restore is not None or seq.capture is not None or seq.tail_captures:
                reasons["a snapshot restore or capture of a fed sequence"] += 1
                return None
        if not graphs.capacities or len(fed) > graphs.max_capacity:
            reasons["batch above the graphs"] += 1
            return None
        capacity = graphs.capacity_for(len(fed))
        if capacity is None or capacity * step.width > self.max_tokens:
            reasons["rows above the token capacity"] += 1
            return None
        width = graphs.verify_width_for(capacity, step.width, mode, logprobs, grammar)
        cells = verify_cells(1, width, self.page_size)
        if any(self.mirror.pending(seq.handle, seq.page_ids) > cells for seq in fed):
            reasons["page-table updates above the graph's cells"] += 1
            return None
        return graphs.packing(capacity, width)

    def _prefill(self, step: Step) -> GraphPacking | None:
        """The prefill graph for a prefill or mixed step, or None."""
        graphs = self.graphs
        if not graphs.prefill_rows:
            return None
        tokens = fed = cells = 0
        for seq in step.seqs:
            count = len(seq.token_ids)
            if not count:
                if not _rides_along(seq):
                    return None
                continue
            if seq.scores or seq.max_emit > 1 or (
                    seq.capture is not None and seq.capture.endpoint != seq.end):
                return None
            tokens += count
            fed += 1
            cells += self.mirror.pending(seq.handle, seq.page_ids)
        rows = graphs.prefill_rows_for(tokens)
        if rows is None or not fed or fed > graphs.prefill_seqs(rows):
            return None
        packing = graphs.prefill_packing(rows)
        return packing if cells <= packing.update_cells else None
