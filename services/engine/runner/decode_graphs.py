"""Decode CUDA graphs: one per (batch capacity, sampling mode, logprobs, grammar), captured into one
memory pool, largest capacity first, and replayed for every pure-decode step that fits.
Verification graphs: one per (batch capacity, width) and mode, for steps whose sequences
each feed and sample up to `width` rows (a pending token plus drafts, or a plain decode);
a finished choice's zero-token terminal capture rides along, as in a decode graph.

A decode step of n sequences runs in the graph of the smallest capacity c >= n. Its input
frame holds each graph field padded to c (`pack_decode`, uploaded with `GraphPacking`), so every step of capacity c lands at the
offsets the graph read when it was captured; padding rows feed token 0 at position 0 into slot
-1 (nothing written), belong to padding sequences of length 0 (attention writes zeros) and
sample into the padding state row. Graphs are captured with `max_seq_len` set to the context
limit, so one graph serves every context length (the attention kernel's split plan covers it).

A verification graph of capacity c and width w packs its sequences' rows back to back into
c x w rows (`GraphPacking` with `width`): padding sequences are empty, padding rows write no
KV and sample into the padding state row; attention runs with max_query_len = w over the
context limit, so one graph serves every mix of widths up to w and every context length.
Every packed row samples with the per-row inputs (`StepInputs.sample_*`), and the sampler
advances each slot by its emitted prefix on the device (slot_sampler.VerifyRows).

The greedy mode without logprobs is captured for every decode capacity at startup; other
modes and every verification shape on first use (one synchronisation, logged). Replays go straight to `cuGraphLaunch`
(cuda_driver.GraphLauncher: torch's replay prologue is RNG bookkeeping these graphs never use). On the CPU there are no graphs: `replay` runs the same
body eagerly on the same padded views, so the CPU tests exercise the padding and offsets.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from services.engine.kernels.pdl import graph_launches
from services.engine.runner.cuda_driver import GraphLauncher
from services.engine.runner.eager_pack import pack_rows
from services.engine.runner.frames import GraphPacking, InputFrames, PackedStep
from services.engine.runner.layout import StepLayout
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.slot_state import SamplingMode
from services.engine.runner.step_body import StepBody, StepShape
from services.engine.runner.step_inputs import GraphPads, StepInputs
from services.engine.scheduler.plan import Step

log = logging.getLogger(__name__)

# verification graphs of every width are captured at start-up up to this capacity, only the
# widest above it (capture_startup)
EXACT_WIDTHS_UP_TO = 8


def capacities(max_batch: int) -> tuple[int, ...]:
    """Power-of-two capacities 1, 2, 4 ... up to max_batch rounded up to a power of two."""
    if max_batch < 1:
        return ()
    top = 1 << (max_batch - 1).bit_length()
    return tuple(1 << i for i in range(top.bit_length()))


def pack_decode(values: StepInputs, step: Step | None, layout: StepLayout | None,
                mirror: PageTableMirror) -> None:
    """Pack a pure-decode step (one fed token per sequence, every one samples; sequences
    that only save a terminal checkpoint feed nothing and are left out); the upload pads it
    to the graph's capacity (frames.GraphPacking). None packs an all-padding step (warm-up
    and capture inputs)."""
    if step is None or layout is None:
        values.query_start_loc = [0]
        return
    pack_rows(values, step, layout, mirror)


def padding_step(frames: InputFrames, capacity: int, mirror: PageTableMirror,
                 pads: GraphPads, width: int = 1, cells: int = 0) -> PackedStep:
    """Upload an all-padding step of `capacity` (warm-up and capture inputs)."""
    values = StepInputs.empty()
    pack_decode(values, None, None, mirror)
    return frames.upload(values, GraphPacking(capacity, pads, width, cells), scratch=True)


def verify_cells(capacity: int, width: int, page_size: int) -> int:
    """Page-table update entries of a verification graph: each sequence may reach the pages
    of its `width` positions (start .. start + width - 1), one more than they span."""
    return capacity * (1 + -(-(width - 1) // page_size))


@dataclass(slots=True)
class DecodeGraphs:
    body: StepBody
    frames: InputFrames
    mirror: PageTableMirror
    capacities: tuple[int, ...]
    max_seq_len: int
    stream: torch.cuda.Stream | None
    pads: GraphPads
    graphs: dict[tuple[int, int, SamplingMode, bool, bool], GraphLauncher] | None = None
    pool: Any = None              # torch's graph pool handle (one pool for all)
    capture_seconds: float = 0.0
    page_size: int = 16           # KV page size (a verification graph's page-table updates)
    # verify_width_for's answers, for the graphs as they were (`_widths_tag`)
    _widths: dict[tuple[int, int, SamplingMode, bool, bool], int] = field(default_factory=dict)
    _widths_tag: tuple[int, int] | None = None

    @property
    def is_cuda(self) -> bool:
        return self.stream is not None

    @property
    def max_capacity(self) -> int:
        return self.capacities[-1] if self.capacities else 0

    def capacity_for(self, num_seqs: int) -> int | None:
        return next((c for c in self.capacities if c >= num_seqs), None)

    def shape(self, capacity: int, width: int = 1) -> StepShape:
        if width > 1:
            return StepShape(num_tokens=capacity * width, num_seqs=capacity,
                             max_query_len=width, max_seq_len=self.max_seq_len,
                             is_decode_graph=False, verify=True, all_rows_sample=True)
        return StepShape(num_tokens=capacity, num_seqs=capacity, max_query_len=1,
                         max_seq_len=self.max_seq_len, is_decode_graph=True)

    def packing(self, capacity: int, width: int = 1) -> GraphPacking:
        """How a step of this graph is packed (a decode graph: width 1)."""
        if width > 1:
            return GraphPacking(capacity, self.pads, width,
                                verify_cells(capacity, width, self.page_size))
        return GraphPacking(capacity, self.pads)

    def capture_startup(self, verify_width: int = 1) -> None:
        """Capture the greedy, no-logprobs graphs, largest capacity first; with speculation
        (`verify_width` = 1 + the drafts a sequence may verify) also the greedy verification
        graphs: every width at the capacities up to EXACT_WIDTHS_UP_TO (where speculation
        pays and a verification's rows cost little), the widest above, so that no greedy
        verification captures while serving (`verify_width_for`)."""
        if not self.is_cuda:
            return
        for capacity in reversed(self.capacities):
            self._capture(capacity, SamplingMode.GREEDY, False, False)
        if verify_width < 2:
            return
        for capacity in reversed(self.capacities):
            widths = range(2, verify_width + 1) if capacity <= EXACT_WIDTHS_UP_TO else \
                (verify_width,)
            for width in widths:
                if capacity * width <= self.frames.limits.tokens:
                    self._capture(capacity, SamplingMode.GREEDY, False, False, width)

    def verify_width_for(self, capacity: int, width: int, mode: SamplingMode, logprobs: bool,
                         grammar: bool) -> int:
        """The width of the graph a verification of `width` rows runs in: the narrowest
        captured one at least that wide for the capacity and mode (a wider graph serves
        every mix of narrower rows), else `width` itself (captured on first use)."""
        key = (capacity, width, mode, logprobs, grammar)
        tag = (id(self.graphs), len(self.graphs or ()))     # graphs are only ever added
        if tag != self._widths_tag:
            self._widths.clear()
            self._widths_tag = tag
        chosen = self._widths.get(key)
        if chosen is None:            # a scan of every graph: once per key and capture
            captured = [w for (c, w, m, lp, g) in (self.graphs or {}) if c == capacity and
                        w >= width and (m, lp, g) == (mode, logprobs, grammar)]
            chosen = self._widths[key] = min(captured, default=width)
        return chosen

    def replay(self, packed: PackedStep, capacity: int, mode: SamplingMode, logprobs: bool,
               grammar: bool = False, width: int = 1) -> bool:
        """Run the capacity's decode (or, width > 1, verification) on the step just uploaded
        (`packed`: its offsets are the capture's, `packing(capacity, width)`). A graph
        missing for this mode is captured first (synchronising once), then the step's inputs
        are uploaded again; True when it was (the step's GPU time then spans the capture:
        not a measurement of the graph)."""
        if not self.is_cuda:
            self.body.run(packed.views, self.shape(capacity, width), mode, logprobs, grammar)
            return False
        graph = (self.graphs or {}).get((capacity, width, mode, logprobs, grammar))
        captured = graph is None
        if graph is None:
            graph = self._capture(capacity, mode, logprobs, grammar, width)
            with torch.cuda.stream(self.stream):
                self.frames.copy(packed)
        graph.launch()
        return captured

    def _capture(self, capacity: int, mode: SamplingMode, logprobs: bool,
                 grammar: bool, width: int = 1) -> GraphLauncher:
        assert self.stream is not None
        started = time.perf_counter()
        if self.graphs is None:
            self.graphs = {}
            self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        with graph_launches():             # PDL, compiled by the warm-up run
            with torch.cuda.stream(self.stream):
                packing = self.packing(capacity, width)
                views = padding_step(self.frames, capacity, self.mirror, self.pads, width,
                                     packing.cells).views
                shape = self.shape(capacity, width)
                self.body.run(views, shape, mode, logprobs, grammar)   # warm-up
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                self.body.run(views, shape, mode, logprobs, grammar)
            torch.cuda.synchronize()
        launcher = self.graphs[(capacity, width, mode, logprobs, grammar)] = GraphLauncher(
            graph, self.stream)
        elapsed = time.perf_counter() - started
        self.capture_seconds += elapsed
        log.info("captured the %s graph b%d%s %s%s%s in %.2f s (%s replay)",
                 "verification" if width > 1 else "decode", capacity,
                 f" w{width}" if width > 1 else "",
                 mode.name.lower(), " +logprobs" if logprobs else "",
                 " +grammar" if grammar else "", elapsed,
                 "raw" if launcher.is_raw else "torch")
        return launcher
