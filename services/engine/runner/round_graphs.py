"""CUDA graphs of a drafting round: one catch-up forward over a choice's newest rows, then the
chained one-row forwards, each draft greedy, all in one replay. Both drafters with their own
paged KV use it: the EAGLE-3 head (runner/eagle3_graphs.py) and the draft model
(runner/drafter.py) each give the round's body; this module owns the shapes, the static
inputs, the capture and the replay.

    graphs = Eagle3RoundGraphs(...) / DraftRoundGraphs(...)     # a RoundGraphs subclass
    graphs.capture()                          # CUDA: every (rows, drafts) shape, at start-up
    if graphs.fits(len(pages), len(feed_ids), limit):
        drafts = graphs.run(pages, start, feed_ids, extra_rows, limit)   # tuple of ids

Why: a round is 1 + (k - 1) forwards of a small model plus its lm_head. Run eagerly they
cost the host's launch latency, not the GPU's time (the H200 measured 1.5-2.0 ms per eager
forward of the EAGLE-3 head's one layer, which reads ~0.5 GB: about 0.1 ms of bandwidth; a
28-layer draft model launches ~200 kernels a forward), and the round runs between two
verification steps, so nothing hides it.

Shapes: after the first round, a round catches up on the tokens the last verification kept
(its accepted drafts plus the correction or bonus token: 1 .. k + 1 rows), or on the plain
rounds since its last drafts, so the catch-up forward is captured at every power-of-two row
capacity up to capacity(max(k + 1, CATCH_UP_ROWS)), and the chain for every draft count
1 .. k: a graph per (rows, drafts). A longer catch-up (the first round, over the whole
prompt, or a catch-up past the largest capacity after a preemption or a long zero-width
stretch) feeds all but the last capacity's rows eagerly, in chunks
(`PagedDrafter._catch_up`), and then replays a graph.

Every input sits in two static device buffers at fixed offsets (int32: the page table row,
the catch-up's query starts and KV length, each chained row's KV length; int64: the fed ids,
positions, KV slots and per-row extra values of the catch-up (EAGLE-3: the target-state
rows), its last real row, each chained row's slot and position), filled from one pinned
staging copy per buffer. Row p of an entry sits at position p. Padding rows of the catch-up
feed token 0 at position 0 into KV slot -1 (nothing written), read the `padding_extra` row,
and sit past `query_start_loc[1]` (attention returns zeros for them); the draft is taken from
the last real row. Attention is launched with `max_seq_len` = the drafter's position limit,
so one graph serves every context length (kernels/attention.py). On the CPU there are no
graphs: `run` executes the same body eagerly on the same padded buffers, so the CPU tests
exercise the padding and offsets.
"""

from __future__ import annotations

import abc
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from services.engine.kernels.pdl import graph_launches
from services.engine.model.attention import AttentionMetadata, kv_slot
from services.engine.runner.decode_graphs import capacities

log = logging.getLogger(__name__)

# catch-ups up to this many rows replay a graph: a zero-width stretch between probes leaves
# the drafter behind by one row per plain round, and an eager catch-up costs the launch
# latency again. At 32 the H100's all-rejected Qwen3-0.6B draft (bench_speculative_draft)
# probed about every 36 tokens: 7 of its 10 rounds caught up eagerly, 23 ms each against
# 1.5 ms for a graph round, and the row ran at 0.89x of plain decoding
CATCH_UP_ROWS = 64


class RoundGraphs(abc.ABC):
    """A drafter's round graphs; subclasses give `_body` (module docstring)."""

    kind = "drafting"                       # for the capture's log line

    def __init__(self, device: torch.device, *, max_positions: int, num_tokens: int,
                 page_size: int, padding_extra: int = 0) -> None:
        self.device = device
        self.max_positions = max_positions  # positions the drafter's rotary tables cover
        self.num_tokens = num_tokens
        self.page_size = page_size
        self.padding_extra = padding_extra  # the extra value of a padding row
        self.row_capacities = capacities(max(num_tokens + 1, CATCH_UP_ROWS))
        rows = self.row_capacities[-1]
        chained = max(0, num_tokens - 1)
        self.max_pages = -(-(max_positions + num_tokens) // page_size) + 1
        self._host = RoundBuffers.allocate(rows, self.max_pages, chained, torch.device("cpu"),
                                           pinned=device.type == "cuda")
        self._host.one_row[1] = 1
        self._dev = RoundBuffers.allocate(rows, self.max_pages, chained, device)
        self.out = torch.zeros(max(1, num_tokens), dtype=torch.int64, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._fill_padding(rows, 0)
        self._upload()
        self.graphs: dict[tuple[int, int], Any] = {}
        self.pool: Any = None
        self.capture_seconds = 0.0
        self.rounds = 0                     # rounds run here (replays on CUDA)

    @abc.abstractmethod
    def _body(self, rows: int, drafts: int) -> None:
        """The round on the static buffers (`self._dev`): the catch-up forward of `rows`
        rows, the draft from row `last`, then `drafts` - 1 chained forwards (`catch_up_meta`,
        `chained_meta`); the drafts into `self.out`."""

    def fits(self, num_pages: int, rows: int, drafts: int) -> bool:
        """Whether a round of one catch-up forward of `rows` rows and `drafts` drafts over
        `num_pages` pages has a graph (else it runs eagerly)."""
        return (1 <= rows <= self.row_capacities[-1] and 1 <= drafts <= self.num_tokens and
                num_pages <= self.max_pages)

    def capture(self) -> None:
        """Capture every (rows, drafts) graph into one pool (CUDA only): a warm-up run, then
        the capture, with every KV slot at -1 (nothing written)."""
        if self.stream is None:
            return
        started = time.perf_counter()
        self.pool = torch.cuda.graph_pool_handle()
        torch.cuda.synchronize()
        for rows in reversed(self.row_capacities):
            for drafts in range(self.num_tokens, 0, -1):
                with graph_launches():         # PDL, compiled by the warm-up run
                    with torch.cuda.stream(self.stream):
                        self._body(rows, drafts)               # warm-up (compiles kernels)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                        self._body(rows, drafts)
                self.graphs[(rows, drafts)] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - started
        log.info("captured %d %s round graphs in %.2f s", len(self.graphs), self.kind,
                 self.capture_seconds)

    def run(self, pages: Sequence[int], start: int, ids: Sequence[int],
            extra: Sequence[int] | None, drafts: int) -> tuple[int, ...]:
        """The drafts of a round that feeds `ids` at positions start.. (their `extra`
        values, None: zeros) over the entry's `pages`, then chains to `drafts` drafts."""
        n = len(ids)
        rows = next(c for c in self.row_capacities if c >= n)
        self._fill(pages, start, ids, extra, rows, drafts)
        self.rounds += 1
        if self.stream is None:
            self._upload()
            self._body(rows, drafts)
            return tuple(self.out[:drafts].tolist())
        with torch.cuda.stream(self.stream):
            self._upload()
            graph = self.graphs.get((rows, drafts))
            if graph is None:                               # not captured: eager, same body
                self._body(rows, drafts)
            else:
                graph.replay()
            host = self.out[:drafts].to("cpu")              # waits for this stream
        return tuple(host.tolist())

    def catch_up_meta(self, rows: int) -> AttentionMetadata:
        """The catch-up forward's attention metadata (device views, a graph's static shapes)."""
        dev = self._dev
        return AttentionMetadata(query_start_loc=dev.query_starts, seq_lens=dev.seq_len,
                                 page_table=dev.page_table, slot_mapping=dev.slots[:rows],
                                 max_query_len=rows, max_seq_len=self.max_positions)

    def chained_meta(self, j: int) -> AttentionMetadata:
        """Chained row j's attention metadata (one row at position last + j + 1)."""
        dev = self._dev
        return AttentionMetadata(query_start_loc=dev.one_row, seq_lens=dev.chain_seq_lens[j, :1],
                                 page_table=dev.page_table, slot_mapping=dev.chain_slots[j, :1],
                                 max_query_len=1, max_seq_len=self.max_positions)

    def _fill(self, pages: Sequence[int], start: int, ids: Sequence[int],
              extra: Sequence[int] | None, rows: int, drafts: int) -> None:
        n, size, host = len(ids), self.page_size, self._host
        table = host.page_table.numpy()[0]
        table[:] = 0
        table[:len(pages)] = pages
        host.query_starts[1] = n
        host.seq_len[0] = start + n
        last = start + n - 1
        chain_lens = host.chain_seq_lens.numpy()
        chain_slots, chain_positions = host.chain_slots.numpy(), host.chain_positions.numpy()
        for j in range(drafts - 1):                         # chained row j: position last+j+1
            chain_lens[j, 0] = last + j + 2
            chain_slots[j, 0] = kv_slot(pages, last + j + 1, size)
            chain_positions[j, 0] = last + j + 1
        host.ids.numpy()[:n] = ids
        host.positions.numpy()[:n] = range(start, start + n)
        host.slots.numpy()[:n] = [kv_slot(pages, p, size) for p in range(start, start + n)]
        host.extra.numpy()[:n] = extra if extra is not None else 0
        host.last[0] = n - 1
        self._fill_padding(rows, n)

    def _fill_padding(self, rows: int, n: int) -> None:
        """Padding rows n..rows-1 of the catch-up (module doc); n = 0 (capture): every row
        padding and no chained row writes KV."""
        host = self._host
        for field, value in ((host.ids, 0), (host.positions, 0), (host.slots, -1),
                             (host.extra, self.padding_extra)):
            field.numpy()[n:rows] = value
        if n == 0:
            host.chain_slots.numpy()[:, 0] = -1

    def _upload(self) -> None:
        blocking = self.stream is None
        self._dev.int32.copy_(self._host.int32, non_blocking=not blocking)
        self._dev.int64.copy_(self._host.int64, non_blocking=not blocking)


@dataclass(frozen=True, slots=True)
class RoundBuffers:
    """A round's inputs: views into one int32 and one int64 tensor (on the device, or the
    pinned host copy the round fills), each field on a 16-byte boundary and each chained
    row's value at the start of a 16-byte cell of its own (an unaligned view compiles other
    kernel variants)."""

    int32: torch.Tensor
    int64: torch.Tensor
    page_table: torch.Tensor       # int32 [1, max_pages]: the entry's pages, then zeros
    query_starts: torch.Tensor     # int32 [2]: the catch-up's [0, n]
    seq_len: torch.Tensor          # int32 [1]: its KV length
    one_row: torch.Tensor          # int32 [2]: a chained row's [0, 1]
    chain_seq_lens: torch.Tensor   # int32 [chained, 4]: [j, 0] chained row j's KV length
    ids: torch.Tensor              # int64 [rows]: the catch-up's fed tokens
    positions: torch.Tensor        # int64 [rows]
    slots: torch.Tensor            # int64 [rows]: KV slots (-1: padding, nothing written)
    extra: torch.Tensor            # int64 [rows]: the drafter's per-row values
    last: torch.Tensor             # int64 [1]: the catch-up's last real row
    chain_slots: torch.Tensor      # int64 [chained, 2]: [j, 0] chained row j's KV slot
    chain_positions: torch.Tensor  # int64 [chained, 2]: [j, 0] its position

    @classmethod
    def allocate(cls, rows: int, max_pages: int, chained: int, device: torch.device, *,
                 pinned: bool = False) -> RoundBuffers:
        table = -(-max_pages // 4) * 4
        rows64 = -(-rows // 2) * 2
        int32 = torch.zeros(table + 12 + 4 * chained, dtype=torch.int32, device=device,
                            pin_memory=pinned)
        int64 = torch.zeros(4 * rows64 + 2 + 4 * chained, dtype=torch.int64, device=device,
                            pin_memory=pinned)
        c64 = 4 * rows64 + 2
        return cls(
            int32, int64, page_table=int32[:max_pages].view(1, max_pages),
            query_starts=int32[table:table + 2], seq_len=int32[table + 4:table + 5],
            one_row=int32[table + 8:table + 10],
            chain_seq_lens=int32[table + 12:].view(chained, 4),
            ids=int64[:rows], positions=int64[rows64:rows64 + rows],
            slots=int64[2 * rows64:2 * rows64 + rows],
            extra=int64[3 * rows64:3 * rows64 + rows],
            last=int64[4 * rows64:4 * rows64 + 1],
            chain_slots=int64[c64:c64 + 2 * chained].view(chained, 2),
            chain_positions=int64[c64 + 2 * chained:].view(chained, 2))
