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

A prefill graph (`prefill_packing`: prefill and mixed steps) of r token rows
serves a step that feeds at most r rows of at most `prefill_seqs(r)` sequences, each any
number of rows (a prefill chunk, a decode), each sampling at most its last row; token
capacities are powers of two from MIN_PREFILL_ROWS up to the step budget, the ones the cost
model's chunk sizes fill (scheduler/costs.chunk_budget). Padding rows write no KV and belong
to no sequence, padding sequences are empty, and padding samples (the sampled rows a step
lacks) read row 0 into the padding state row; attention runs the mixed plan over r rows with
the context limit, so one graph serves every mix of lengths. Like eager steps it keeps each
fed sequence's last hidden state per slot, so a checkpoint captured at its end reads it after
the replay (`GraphRunner._captures`).

The greedy mode without logprobs is captured for every decode capacity and prefill token
capacity at startup; other modes and every verification shape on first use (one
synchronisation, logged). Replays go straight to `cuGraphLaunch`
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
# the smallest prefill graph's token rows (a shorter prefill or mixed step pads to it)
MIN_PREFILL_ROWS = 16


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


def prefill_capacities(max_tokens: int, bound: int) -> tuple[int, ...]:
    """Token capacities of the prefill graphs: powers of two from MIN_PREFILL_ROWS up to
    `max_tokens` (a step's token budget) rounded up to a power of two, none above `bound`
    (the rows the input buffers hold: a longer step runs eagerly)."""
    if max_tokens < 1:
        return ()
    top = max(MIN_PREFILL_ROWS, 1 << (max_tokens - 1).bit_length())
    return tuple(1 << i for i in range(MIN_PREFILL_ROWS.bit_length() - 1, top.bit_length())
                 if 1 << i <= bound)


def padding_step(frames: InputFrames, packing: GraphPacking, mirror: PageTableMirror
                 ) -> PackedStep:
    """Upload an all-padding step of a graph's packing (warm-up and capture inputs)."""
    values = StepInputs.empty()
    pack_decode(values, None, None, mirror)
    return frames.upload(values, packing, scratch=True)


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
    # prefill graphs: token capacities (empty: prefill and mixed steps run eagerly), the
    # most sequences one holds, a page table's width; graphs by (rows, mode, logprobs,
    # grammar)
    prefill_rows: tuple[int, ...] = ()
    max_prefill_seqs: int = 0
    table_width: int = 0
    prefill: dict[tuple[int, SamplingMode, bool, bool], GraphLauncher] = field(
        default_factory=dict)
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

    def prefill_rows_for(self, num_tokens: int) -> int | None:
        """The smallest prefill graph's token capacity that holds `num_tokens` rows."""
        return next((r for r in self.prefill_rows if r >= num_tokens), None)

    def prefill_seqs(self, rows: int) -> int:
        """Sequences a prefill graph of `rows` token rows holds (each feeds a row at least)."""
        return min(rows, self.max_prefill_seqs)

    def prefill_packing(self, rows: int) -> GraphPacking:
        """A prefill graph's packing: its page-table update entries cover one sequence's
        whole table (a new sequence behind a cached prefix uploads it all) plus a cell per
        fed row, at most every slot's table; a step that needs more runs eagerly."""
        cells = min(rows + self.table_width, self.frames.limits.table_cells)
        return GraphPacking(self.prefill_seqs(rows), self.pads, cells=cells, rows=rows)

    def shape_of(self, packing: GraphPacking) -> StepShape:
        """The launch shape of the graph that `packing` packs for."""
        if packing.is_prefill:
            return StepShape(num_tokens=packing.rows, num_seqs=packing.capacity,
                             max_query_len=packing.rows, max_seq_len=self.max_seq_len,
                             is_decode_graph=False)
        return self.shape(packing.capacity, packing.width)

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

    def capture_startup(self, verify_width: int = 1, *, discover: bool = False) -> None:
        """Capture the greedy, no-logprobs graphs, largest capacity first; with speculation
        (`verify_width` = 1 + the drafts a sequence may verify) also the greedy verification
        graphs: every width at the capacities up to EXACT_WIDTHS_UP_TO (where speculation
        pays and a verification's rows cost little), the widest above, so that no greedy
        verification captures while serving (`verify_width_for`). With `discover` only each
        graph's warm-up run happens, nothing is captured (the kernel variant discovery of
        kernels/precompile.py)."""
        if not self.is_cuda:
            return
        def warm_up_only(packing: GraphPacking, mode: SamplingMode, logprobs: bool,
                         grammar: bool) -> None:
            with graph_launches():
                self._warm_up_run(packing, mode, logprobs, grammar)

        capture = warm_up_only if discover else self._capture
        for rows in reversed(self.prefill_rows):      # the largest activations first
            capture(self.prefill_packing(rows), SamplingMode.GREEDY, False, False)
        for capacity in reversed(self.capacities):
            capture(self.packing(capacity), SamplingMode.GREEDY, False, False)
        if verify_width < 2:
            return
        for capacity in reversed(self.capacities):
            widths = range(2, verify_width + 1) if capacity <= EXACT_WIDTHS_UP_TO else \
                (verify_width,)
            for width in widths:
                if capacity * width <= self.frames.limits.tokens:
                    capture(self.packing(capacity, width), SamplingMode.GREEDY, False, False)

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

    def replay(self, packed: PackedStep, packing: GraphPacking, mode: SamplingMode,
               logprobs: bool, grammar: bool = False) -> bool:
        """Run the graph of `packing` (a decode, verification or prefill graph) on the step
        just uploaded with it (its offsets are the capture's). A graph missing for this mode
        is captured first (synchronising once), then the step's inputs are uploaded again;
        True when it was (the step's GPU time then spans the capture: not a measurement of
        the graph)."""
        if not self.is_cuda:
            self.body.run(packed.views, self.shape_of(packing), mode, logprobs, grammar)
            return False
        graph = self._graphs_of(packing).get(self._key(packing, mode, logprobs, grammar))
        captured = graph is None
        if graph is None:
            graph = self._capture(packing, mode, logprobs, grammar)
            with torch.cuda.stream(self.stream):
                self.frames.copy(packed)
        graph.launch()
        return captured

    def _graphs_of(self, packing: GraphPacking) -> dict:
        if packing.is_prefill:
            return self.prefill
        if self.graphs is None:
            self.graphs = {}
        return self.graphs

    @staticmethod
    def _key(packing: GraphPacking, mode: SamplingMode, logprobs: bool, grammar: bool
             ) -> tuple:
        if packing.is_prefill:
            return (packing.rows, mode, logprobs, grammar)
        return (packing.capacity, packing.width, mode, logprobs, grammar)

    def _warm_up_run(self, packing: GraphPacking, mode: SamplingMode, logprobs: bool,
                     grammar: bool) -> tuple[Any, Any]:
        """The graph's body once, eagerly, on padding (what its capture runs first, inside
        its `graph_launches`: every kernel variant compiles here, not inside the capture);
        synchronised."""
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            views = padding_step(self.frames, packing, self.mirror).views
            shape = self.shape_of(packing)
            self.body.run(views, shape, mode, logprobs, grammar)
        torch.cuda.synchronize()
        return views, shape

    def _capture(self, packing: GraphPacking, mode: SamplingMode, logprobs: bool,
                 grammar: bool) -> GraphLauncher:
        assert self.stream is not None
        started = time.perf_counter()
        graphs = self._graphs_of(packing)
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        with graph_launches():             # PDL, compiled by the warm-up run
            views, shape = self._warm_up_run(packing, mode, logprobs, grammar)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                self.body.run(views, shape, mode, logprobs, grammar)
            torch.cuda.synchronize()
        launcher = graphs[self._key(packing, mode, logprobs, grammar)] = GraphLauncher(
            graph, self.stream)
        elapsed = time.perf_counter() - started
        self.capture_seconds += elapsed
        if packing.is_prefill:
            name = f"prefill t{packing.rows} b{packing.capacity}"
        elif packing.width > 1:
            name = f"verification b{packing.capacity} w{packing.width}"
        else:
            name = f"decode b{packing.capacity}"
        log.info("captured the %s graph %s%s%s in %.2f s (%s replay)", name,
                 mode.name.lower(), " +logprobs" if logprobs else "",
                 " +grammar" if grammar else "", elapsed,
                 "raw" if launcher.is_raw else "torch")
        return launcher
