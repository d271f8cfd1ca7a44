"""CUDA graphs of an EAGLE-3 drafting round (runner/eagle3_drafter.py): one catch-up forward
over the target's newest rows, then the chained one-row forwards, each draft greedy, all in
one replay.

    graphs = RoundGraphs(head, embedding, kv, store, beyond, num_tokens=k, page_size=16)
    graphs.capture()                          # CUDA: every (rows, drafts) shape, at start-up
    if graphs.fits(len(pages), len(feed_ids), limit):
        drafts = graphs.run(pages, start, feed_ids, feed_rows, limit)   # tuple of ids

Why: a round is 1 + (k - 1) forwards of one small decoder layer plus the draft lm_head, each
about fifteen launches. Run eagerly they cost the host's launch latency, not the GPU's time
(the H200 benchmark measured 1.5-2.0 ms per forward for a layer that reads ~0.5 GB: about
0.1 ms of bandwidth), and the round runs between two verification steps, so nothing hides it.

Shapes: after the first round, a round catches up on the tokens the last verification kept
(its accepted drafts plus the correction or bonus token: 1 .. k + 1 rows), or on the plain
rounds since its last drafts, so the catch-up forward is captured at every power-of-two row
capacity up to capacity(max(k + 1, CATCH_UP_ROWS)), and the chain for every draft count
1 .. k: a graph per (rows, drafts). A round outside them (the first,
over the whole prompt, or a catch-up longer than the largest capacity after a preemption)
runs eagerly in chunks (eagle3_drafter.py).

Every input sits in two static device buffers at fixed offsets (int32: the page table row,
the catch-up's query starts and KV length, each chained row's KV length; int64: the fed ids,
positions, KV slots and target-state rows of the catch-up, its last real row, each chained
row's slot and position), filled from one pinned staging copy per buffer. Padding rows of
the catch-up feed token 0 at position 0 into KV slot -1 (nothing written), read the store's
padding row, and sit past `query_start_loc[1]` (attention returns zeros for them); the draft
is taken from the last real row. Attention is launched with `max_seq_len` = the head's
position limit, so one graph serves every context length (kernels/attention.py). On the CPU
there are no graphs: `run` executes the same body eagerly on the same padded buffers, so the
CPU tests exercise the padding and offsets.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from services.engine.model import KVCache
from services.engine.model.attention import AttentionMetadata, kv_slot
from services.engine.model.eagle3 import Eagle3Head
from services.engine.model.layers import Embedding
from services.engine.runner.decode_graphs import capacities

log = logging.getLogger(__name__)

# catch-ups up to this many rows replay a graph: a zero-width stretch between probes leaves
# the head behind by one row per plain round, and an eager catch-up costs the launch latency
# again (and compiles attention variants for new row counts while serving)
CATCH_UP_ROWS = 32


class RoundGraphs:
    def __init__(self, head: Eagle3Head, embedding: Embedding, kv: KVCache, store: Any,
                 beyond: torch.Tensor, *, num_tokens: int, page_size: int) -> None:
        self.head = head
        self.embedding = embedding
        self.kv = kv
        self.store = store                  # TargetHiddenStore: .rows, .padding_row
        self.beyond = beyond                # bool [draft_vocab]: never proposed
        self.num_tokens = num_tokens
        self.page_size = page_size
        device = head.fc.weight.device
        self.device = device
        self.row_capacities = capacities(max(num_tokens + 1, CATCH_UP_ROWS))
        rows = self.row_capacities[-1]
        chained = max(0, num_tokens - 1)
        self.max_pages = -(-(head.max_positions + num_tokens) // page_size) + 1
        # every field starts on a 16-byte boundary (an unaligned view compiles other kernel
        # variants): int32 in fours, int64 in twos
        at32: dict[str, tuple[int, int]] = {}
        at64: dict[str, tuple[int, int]] = {}

        def put(at: dict[str, tuple[int, int]], name: str, size: int, per_16_bytes: int
                ) -> None:
            end = max((offset + length for offset, length in at.values()), default=0)
            at[name] = (-(-end // per_16_bytes) * per_16_bytes, size)

        put(at32, "page_table", self.max_pages, 4)
        put(at32, "query_starts", 2, 4)          # the catch-up's [0, n]
        put(at32, "seq_len", 1, 4)               # its KV length
        put(at32, "one_row", 2, 4)               # a chained row's [0, 1]
        for j in range(chained):
            put(at32, f"seq_len{j}", 1, 4)
        for name in ("ids", "positions", "slots", "target_rows"):
            put(at64, name, rows, 2)
        put(at64, "last", 1, 2)                  # the catch-up's last real row
        for j in range(chained):
            put(at64, f"slot{j}", 1, 2)
            put(at64, f"position{j}", 1, 2)
        self._at32 = {name: offset for name, (offset, _) in at32.items()}
        self._at64 = {name: offset for name, (offset, _) in at64.items()}
        size32 = max(offset + length for offset, length in at32.values())
        size64 = max(offset + length for offset, length in at64.values())
        pinned = device.type == "cuda"
        self._host32 = torch.zeros(size32, dtype=torch.int32, pin_memory=pinned)
        self._host64 = torch.zeros(size64, dtype=torch.int64, pin_memory=pinned)
        self._np32, self._np64 = self._host32.numpy(), self._host64.numpy()
        self._np32[self._at32["one_row"] + 1] = 1
        self._dev32 = torch.zeros(size32, dtype=torch.int32, device=device)
        self._dev64 = torch.zeros(size64, dtype=torch.int64, device=device)
        self.out = torch.zeros(max(1, num_tokens), dtype=torch.int64, device=device)
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None
        self._fill_padding(rows, 0)
        self._upload()
        self.graphs: dict[tuple[int, int], Any] = {}
        self.pool: Any = None
        self.capture_seconds = 0.0
        self.rounds = 0                     # rounds run here (replays on CUDA)

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
                with torch.cuda.stream(self.stream):
                    self._body(rows, drafts)               # warm-up (compiles kernels)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=self.pool, stream=self.stream):
                    self._body(rows, drafts)
                self.graphs[(rows, drafts)] = graph
        torch.cuda.synchronize()
        self.capture_seconds = time.perf_counter() - started
        log.info("captured %d EAGLE-3 round graphs in %.2f s", len(self.graphs),
                 self.capture_seconds)

    def run(self, pages: Sequence[int], start: int, ids: Sequence[int],
            target_slots: Sequence[int], drafts: int) -> tuple[int, ...]:
        """The drafts of a round that feeds `ids` at positions start.. (their target states
        at `target_slots`) over the entry's `pages`, then chains to `drafts` drafts."""
        n = len(ids)
        rows = next(c for c in self.row_capacities if c >= n)
        self._fill(pages, start, ids, target_slots, rows, drafts)
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

    def _fill(self, pages: Sequence[int], start: int, ids: Sequence[int],
              target_slots: Sequence[int], rows: int, drafts: int) -> None:
        n, size = len(ids), self.page_size
        np32, np64, at32, at64 = self._np32, self._np64, self._at32, self._at64
        table = at32["page_table"]
        np32[table:table + self.max_pages] = 0
        np32[table:table + len(pages)] = pages
        np32[at32["query_starts"] + 1] = n
        np32[at32["seq_len"]] = start + n
        last = start + n - 1
        for j in range(drafts - 1):                         # chained row j: position last+j+1
            np32[at32[f"seq_len{j}"]] = last + j + 2
            np64[at64[f"slot{j}"]] = kv_slot(pages, last + j + 1, size)
            np64[at64[f"position{j}"]] = last + j + 1
        ids_at, positions_at = at64["ids"], at64["positions"]
        slots_at, rows_at = at64["slots"], at64["target_rows"]
        np64[ids_at:ids_at + n] = ids
        np64[positions_at:positions_at + n] = range(start, start + n)
        np64[slots_at:slots_at + n] = [kv_slot(pages, p, size) for p in range(start, start + n)]
        np64[rows_at:rows_at + n] = target_slots
        np64[at64["last"]] = n - 1
        self._fill_padding(rows, n)

    def _fill_padding(self, rows: int, n: int) -> None:
        """Padding rows n..rows-1 of the catch-up (module doc); n = 0 (capture): every row
        padding and no chained row writes KV."""
        np64, at64 = self._np64, self._at64
        for name, value in (("ids", 0), ("positions", 0), ("slots", -1),
                            ("target_rows", self.store.padding_row)):
            np64[at64[name] + n:at64[name] + rows] = value
        if n == 0:
            for j in range(max(0, self.num_tokens - 1)):
                np64[at64[f"slot{j}"]] = -1

    def _upload(self) -> None:
        blocking = self.stream is None
        self._dev32.copy_(self._host32, non_blocking=not blocking)
        self._dev64.copy_(self._host64, non_blocking=not blocking)

    @torch.inference_mode()
    def _body(self, rows: int, drafts: int) -> None:
        """The round on the static buffers: the catch-up forward of `rows` rows, the draft
        from its last real row, then `drafts` - 1 chained forwards; drafts into `out`."""
        d32, d64, at32, at64 = self._dev32, self._dev64, self._at32, self._at64

        def i32(name: str, size: int = 1) -> torch.Tensor:
            return d32[at32[name]:at32[name] + size]

        def i64(name: str, size: int = 1) -> torch.Tensor:
            return d64[at64[name]:at64[name] + size]

        max_positions = self.head.max_positions
        page_table = i32("page_table", self.max_pages).view(1, self.max_pages)
        meta = AttentionMetadata(query_start_loc=i32("query_starts", 2),
                                 seq_lens=i32("seq_len"), page_table=page_table,
                                 slot_mapping=i64("slots", rows), max_query_len=rows,
                                 max_seq_len=max_positions)
        hidden = self.store.rows.index_select(0, i64("target_rows", rows))
        normed, prenorm = self.head(self.embedding(i64("ids", rows)), hidden,
                                    i64("positions", rows), self.kv, meta)
        last = i64("last")
        normed, prenorm = normed.index_select(0, last), prenorm.index_select(0, last)
        draft = self._greedy(normed)
        self.out[0:1].copy_(draft)
        for j in range(drafts - 1):
            meta = AttentionMetadata(query_start_loc=i32("one_row", 2),
                                     seq_lens=i32(f"seq_len{j}"), page_table=page_table,
                                     slot_mapping=i64(f"slot{j}"), max_query_len=1,
                                     max_seq_len=max_positions)
            normed, prenorm = self.head(self.embedding(draft), prenorm, i64(f"position{j}"),
                                        self.kv, meta)
            draft = self._greedy(normed)
            self.out[j + 1:j + 2].copy_(draft)

    def _greedy(self, normed: torch.Tensor) -> torch.Tensor:
        """The draft's target id, int64 [1] on the device (no host read)."""
        logits = self.head.logits(normed).masked_fill_(self.beyond, float("-inf"))
        return self.head.draft_to_target.index_select(0, logits.argmax(dim=-1))

