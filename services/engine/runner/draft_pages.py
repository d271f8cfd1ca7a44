"""What a drafter with its own paged KV keeps per request (runner/drafter.py's draft models,
runner/eagle3_drafter.py's EAGLE-3 heads both build on it).

    pages = DraftPages(num_pages)
    entry = pages.entry(handle)                  # the choice's entry (restarted on a new
    keep = common_prefix(entry.tokens, tokens)   #   slot generation)
    del entry.tokens[keep:]                      # roll back what the choice did not keep
    if not pages.reserve(handle.slot, entry, rows): ...   # pages, evicting LRU entries

One entry per live slot, keyed by slot: its slot generation, the tokens (rows) its KV holds
and the pages holding them, taken from one free list. When the list runs out, the least
recently used other entries give their pages back (they catch up again when next asked).
`forward_times` keeps a drafter's recent per-forward durations; `forward_s` is their median,
which the width policy weighs drafts by when the cost model is on.

A round's forwards (catch-up chunks, then the one-row chained forwards that feed each draft
back) take their inputs from `round_inputs`: every forward's attention metadata, positions,
fed ids and extra rows, built on the host before anything runs and uploaded in two copies
(pinned, asynchronous on CUDA). The drafts stay on the device until the round reads them
all at once, so the forwards queue back to back: no forward waits for the device (a
metadata upload per forward from pageable memory, and a read-back per draft, each waited).
"""

from __future__ import annotations

import abc
import collections
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from services.engine.model.attention import AttentionMetadata, kv_slot
from services.engine.scheduler.plan import SlotHandle

if TYPE_CHECKING:
    from services.engine.runner.round_graphs import RoundGraphs


@dataclass(slots=True)
class DraftEntry:
    """One choice's draft KV: its slot generation, the token of each row it holds, its pages."""

    generation: int
    tokens: list[int] = field(default_factory=list)
    pages: list[int] = field(default_factory=list)


class DraftPages:
    def __init__(self, num_pages: int, page_size: int) -> None:
        self.num_pages = num_pages
        self.page_size = page_size
        self._free = list(range(num_pages - 1, -1, -1))
        self._entries: collections.OrderedDict[int, DraftEntry] = collections.OrderedDict()
        self.forward_times: collections.deque[float] = collections.deque(maxlen=9)
        # every round's wall time, by kind (diagnostics: bench_speculative_draft.py)
        self.round_seconds = {"graph": 0.0, "eager": 0.0}
        self.round_counts = {"graph": 0, "eager": 0}

    @property
    def free_pages(self) -> int:
        return len(self._free)

    @property
    def forward_s(self) -> float:
        """A draft forward's measured duration (the median of recent rounds; 0: none yet)."""
        return statistics.median(self.forward_times) if self.forward_times else 0.0

    def tokens_held(self, slot: int) -> tuple[int, ...]:
        """The tokens of the rows the slot's entry holds (tests, diagnostics)."""
        entry = self._entries.get(slot)
        return tuple(entry.tokens) if entry is not None else ()

    def entry(self, handle: SlotHandle) -> DraftEntry:
        entry = self._entries.get(handle.slot)
        if entry is not None and entry.generation != handle.generation:
            self.drop(handle.slot)            # the slot's earlier choice ended
            entry = None
        if entry is None:
            entry = self._entries[handle.slot] = DraftEntry(handle.generation)
        self._entries.move_to_end(handle.slot)
        return entry

    def reserve(self, slot: int, entry: DraftEntry, num_rows: int) -> bool:
        """Pages for `num_rows` positions, evicting the least recently used other entries
        if needed; False when even that is not enough."""
        needed = -(-num_rows // self.page_size) - len(entry.pages)
        while needed > len(self._free):
            victim = next((s for s in self._entries if s != slot), None)
            if victim is None:
                return False
            self.drop(victim)
        for _ in range(max(0, needed)):
            entry.pages.append(self._free.pop())
        return True

    def drop(self, slot: int) -> None:
        entry = self._entries.pop(slot, None)
        if entry is not None:
            self._free.extend(reversed(entry.pages))


def common_prefix(a: list[int], b: list[int]) -> int:
    """The length of the longest common prefix of a and b."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:                   # the usual case: every held row was kept
        return n
    return next(i for i in range(n) if a[i] != b[i])


class PagedDrafter(abc.ABC):
    """What both drafters share over their `pages` (a DraftPages) and their round `graphs`
    (runner/round_graphs.py): the free page count and the rows a slot holds (tests,
    diagnostics); `forward_s`, a draft forward's measured duration, which the width policy
    weighs drafts by when the cost model is on (`record_forwards`); and the start-up
    `warm_up` (the subclass runs one eager round: `_warm_round`)."""

    pages: DraftPages
    graphs: RoundGraphs
    device: torch.device
    page_size: int
    chunk_tokens: int
    num_tokens: int

    def record_forwards(self, started: float, forwards: int, *, graph_round: bool) -> None:
        """The round's wall time (its one read-back waited for the device's work, so the
        wall time covers it) into `round_seconds` / `round_counts` by kind, and per forward
        into `forward_times`: every graph round, and eager rounds only while no round graph
        is captured (with graphs, an eager round, a prompt's catch-up, is a one-off, not a
        per-draft cost)."""
        elapsed = time.perf_counter() - started
        kind = "graph" if graph_round else "eager"
        self.pages.round_seconds[kind] += elapsed
        self.pages.round_counts[kind] += 1
        if graph_round or not self.graphs.graphs:
            self.pages.forward_times.append(elapsed / forwards)

    @torch.inference_mode()
    def warm_up(self) -> None:
        """Capture the round graphs, then run the eager round once at a chunk's full length
        and at an odd one (CUDA): a choice's first round catches up on its prompt eagerly,
        and whatever a process's first eager rounds initialise (kernel variants, library
        state) is paid here, not while serving. On the H200, before this warm-up, the
        benchmark's first EAGLE-3 request spent 1.15 s planning (its drafting) over ~16
        rounds, against ~1.4 ms a round later. Writes only into draft pages no choice holds
        yet (nothing is served before this)."""
        if self.device.type != "cuda":
            return
        self.graphs.capture()
        for rows in sorted({self.chunk_tokens, max(1, self.chunk_tokens // 2 - 1)}):
            needed = -(-(rows + self.num_tokens) // self.page_size)
            if needed > self.pages.num_pages or \
                    rows + self.num_tokens > self.graphs.max_positions:
                continue                            # a pool too small to warm this length
            self._warm_round(list(range(needed)), rows)
        torch.cuda.synchronize(self.device)

    @abc.abstractmethod
    def _warm_round(self, pages: list[int], rows: int) -> None:
        """One eager round over `pages` catching up on `rows` padding rows, then chaining
        to num_tokens drafts."""

    def _catch_up(self, entry: DraftEntry, rows: Sequence[int], end: int,
                  extra: Callable[[int, int], list[int]] | None = None) -> int:
        """Feed rows[len(entry.tokens):end] (`extra(start, stop)`: their per-row values) in
        chunks of `chunk_tokens`, forwards that only write the drafter's KV (`_feed`), and
        order the round graphs' stream after them (the replay reads that KV); the forwards
        run. A long catch-up (a prompt, a gap past the graphs' rows) takes this for all but
        its last rows, then replays the round's graph."""
        start = len(entry.tokens)
        if end <= start:
            return 0
        feeds = []
        for at in range(start, end, self.chunk_tokens):
            stop = min(end, at + self.chunk_tokens)
            feeds.append((at, list(rows[at:stop]), extra(at, stop) if extra else None))
        steps = round_inputs(entry.pages, self.page_size, self.device, feeds, 0)
        for step, (_, ids, _) in zip(steps, feeds, strict=True):
            self._feed(step)
            entry.tokens.extend(ids)
        if self.graphs.stream is not None:
            self.graphs.stream.wait_stream(torch.cuda.current_stream(self.device))
        return len(feeds)

    @abc.abstractmethod
    def _feed(self, step: ForwardInputs) -> None:
        """One catch-up forward (no logits) of the drafter over `step`."""

    @property
    def free_pages(self) -> int:
        return self.pages.free_pages

    def tokens_held(self, slot: int) -> tuple[int, ...]:
        return self.pages.tokens_held(slot)

    @property
    def forward_s(self) -> float:
        return self.pages.forward_s


@dataclass(frozen=True, slots=True)
class ForwardInputs:
    """One drafter forward's device inputs (views into its round's two uploads)."""

    meta: AttentionMetadata
    positions: torch.Tensor            # int64 [T]
    ids: torch.Tensor | None           # int64 [T] the fed tokens (None: a chained row's
                                       # token is the previous draft, on the device)
    extra: torch.Tensor | None         # int64 [T] the caller's per-row values (None: chained)


def round_inputs(pages: list[int], page_size: int, device: torch.device,
                 feeds: Sequence[tuple[int, Sequence[int], Sequence[int] | None]],
                 chained: int) -> list[ForwardInputs]:
    """The inputs of a round's forwards over one entry's `pages`: each feed (start position,
    its token ids, optional per-row extra values) in order, then `chained` one-row forwards
    at the positions after the last feed's. Every field starts on a 16-byte boundary (as the
    runners' step inputs do: an unaligned view would compile other kernel variants)."""
    i32: list[int] = []
    i64: list[int] = []

    def put(buffer: list[int], values: Sequence[int], per_16_bytes: int) -> int:
        buffer.extend([0] * (-len(buffer) % per_16_bytes))
        offset = len(buffer)
        buffer.extend(values)
        return offset

    table = put(i32, list(pages), 4)
    last = feeds[-1][0] + len(feeds[-1][1]) - 1
    rows = [(start, len(ids), ids, extra) for start, ids, extra in feeds] + \
        [(last + j, 1, None, None) for j in range(1, chained + 1)]
    layout = []
    for start, n, ids, extra in rows:
        end = start + n
        slots = [kv_slot(pages, q, page_size) for q in range(start, end)]
        layout.append((start, n, put(i32, [0, n], 4), put(i32, [end], 4),
                       put(i64, slots, 2), put(i64, list(range(start, end)), 2),
                       put(i64, ids, 2) if ids is not None else -1,
                       put(i64, extra, 2) if extra is not None else -1))
    host32 = torch.tensor(i32, dtype=torch.int32)
    host64 = torch.tensor(i64 or [0], dtype=torch.int64)
    if device.type == "cuda":
        host32, host64 = host32.pin_memory(), host64.pin_memory()
    dev32 = host32.to(device, non_blocking=True)
    dev64 = host64.to(device, non_blocking=True)
    page_table = dev32[table:table + len(pages)].view(1, len(pages))
    out = []
    for first, n, at_starts, at_lens, at_slots, at_positions, at_ids, at_extra in layout:
        meta = AttentionMetadata(query_start_loc=dev32[at_starts:at_starts + 2],
                                 seq_lens=dev32[at_lens:at_lens + 1], page_table=page_table,
                                 slot_mapping=dev64[at_slots:at_slots + n], max_query_len=n,
                                 max_seq_len=first + n)
        out.append(ForwardInputs(meta, dev64[at_positions:at_positions + n],
                                 dev64[at_ids:at_ids + n] if at_ids >= 0 else None,
                                 dev64[at_extra:at_extra + n] if at_extra >= 0 else None))
    return out
