"""The typed inputs of one GPU step: one field per input, its dtype and its bound declared
beside it, so the persistent device buffers are sized from the engine config and nothing
is looked up by name.

    limits = StepLimits.for_runner(...)              # from the runner's config
    values = StepInputs.empty()                      # host lists, filled by the packers
    values.input_ids = [...]; ...
    packed = frames.upload(values, graph=GraphPacking(capacity, pads))   # frames.py
    packed.views.input_ids                           # int64 [T] on the device

`StepInputs` is generic in its values: host sequences while packing, device tensors
(`packed.views`) when the step body reads them. Fields are laid out in declaration order,
each dtype in its own buffer; the fields a decode graph reads come first and, in a graph
step, each is padded to its capacity at that graph's batch capacity (`graph`), so every
step of capacity c lands at the offsets its graph was captured with. The fields after them
(eager-only rows, sampling inits, grammar rows) are read outside the graphs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

V = TypeVar("V")

I64, I32, F32 = "int64", "int32", "float32"
KINDS = (I64, I32, F32)


@dataclass(frozen=True, slots=True)
class StepLimits:
    """The most of each thing one step carries (derived from the runner's config)."""

    tokens: int          # fed rows
    seqs: int            # sequences in the forward pass (and a decode graph's rows)
    samples: int         # sampled rows
    resumes: int         # sequences sampling from a snapshot
    table_cells: int     # page-table cells uploaded
    inits: int           # slots (re)initialised
    init_ints: int       # int64 values per initialised slot
    init_floats: int     # float32 values per initialised slot
    bitmask_words: int   # int32 words of grammar bitmask rows

    @classmethod
    def for_runner(cls, *, num_slots: int, max_num_batched_tokens: int, max_graph_batch: int,
                   table_width: int, vocab_size: int, init_ints: int, init_floats: int
                   ) -> StepLimits:
        """A step feeds at most the token budget, or one decode per slot plus the oldest
        prefill's minimum chunk (64); a slot's whole page table uploads when it starts."""
        rows = max(num_slots, max_graph_batch)
        tokens = max(max_num_batched_tokens, rows) + 64
        return cls(tokens=tokens, seqs=rows, samples=tokens, resumes=num_slots,
                   table_cells=(num_slots + 1) * table_width, inits=num_slots,
                   init_ints=init_ints, init_floats=init_floats,
                   bitmask_words=num_slots * ((vocab_size + 31) // 32))


@dataclass(frozen=True, slots=True)
class GraphPads:
    """Values of a decode graph's padding entries that depend on the runner."""

    padding_row: int     # the slot-state row padding sequences sample into
    trash_cell: int      # the page-table cell unused update entries write


@dataclass(frozen=True, slots=True)
class InputField:
    kind: str                                   # I64, I32 or F32
    bound: Callable[[StepLimits], int]          # most values one step holds
    graph: Callable[[int], int] | None = None   # capacity in a decode graph of capacity c
    pad: Callable[[GraphPads, int], float] = lambda pads, count: 0   # graph padding value


def _input(kind: str, bound: Callable[[StepLimits], int],
           graph: Callable[[int], int] | None = None,
           pad: Callable[[GraphPads, int], float] | None = None) -> Any:
    spec = InputField(kind, bound, graph, pad or (lambda pads, count: 0))
    return field(default_factory=list, metadata={"input": spec})


def _same(c: int) -> int:
    return c


@dataclass(slots=True)
class StepInputs(Generic[V]):
    # -- read by decode graphs (fixed offsets at each capacity) -----------------------------
    input_ids: V = _input(I64, lambda lim: lim.tokens, _same)          # [T] fed ids (pending: 0)
    positions: V = _input(I64, lambda lim: lim.tokens, _same)          # [T]
    slot_mapping: V = _input(I64, lambda lim: lim.tokens, _same,       # [T] KV slot, -1: padding
                             lambda pads, count: -1)
    pending_slot: V = _input(I64, lambda lim: lim.tokens, _same,       # [T] slot feeding the row
                             lambda pads, count: -1)
    seq_slots: V = _input(I64, lambda lim: lim.seqs, _same,            # [B] slot of each sequence
                          lambda pads, count: pads.padding_row)
    update_index: V = _input(I64, lambda lim: lim.table_cells, _same,  # [U] page-table cells
                             lambda pads, count: pads.trash_cell)
    query_start_loc: V = _input(I32, lambda lim: lim.seqs + 1,         # [B + 1]
                                lambda c: c + 1, lambda pads, count: count)
    seq_lens: V = _input(I32, lambda lim: lim.seqs, _same)             # [B] KV length after
    update_value: V = _input(I32, lambda lim: lim.table_cells, _same)  # [U] page ids
    # -- eager steps only -------------------------------------------------------------------
    hidden_rows: V = _input(I64, lambda lim: lim.seqs)                  # [F] last fed row
    hidden_cells: V = _input(I64, lambda lim: lim.seqs)                 # [F] slot * 2 + parity
    sample_rows: V = _input(I64, lambda lim: lim.samples)               # [S] row (T + k: resumed)
    sample_slots: V = _input(I64, lambda lim: lim.samples)              # [S]
    resume_ids: V = _input(I64, lambda lim: lim.resumes)                # [Z] snapshot rows
    resume_cells: V = _input(I64, lambda lim: lim.resumes)              # [Z] slot * 2 + parity
    # -- installed before the graph or body runs --------------------------------------------
    init_slots: V = _input(I64, lambda lim: lim.inits)                  # [N] slots initialised
    init_ints: V = _input(I64, lambda lim: lim.inits * lim.init_ints)     # [N * ints]
    init_floats: V = _input(F32, lambda lim: lim.inits * lim.init_floats)  # [N * floats]
    bitmask_slots: V = _input(I64, lambda lim: lim.inits)               # [G] grammar rows' slots
    bitmask_words: V = _input(I32, lambda lim: lim.bitmask_words)       # [G * words]
    bitmask_reset: V = _input(I64, lambda lim: lim.inits)               # [R] slots back to all 1

    @classmethod
    def empty(cls) -> StepInputs[Any]:
        return cls()


FIELDS: tuple[tuple[str, InputField], ...] = tuple(
    (f.name, f.metadata["input"]) for f in dataclasses.fields(StepInputs))


def buffer_sizes(limits: StepLimits) -> dict[str, int]:
    """Values per dtype the persistent buffers hold: the sum of the fields' bounds."""
    sizes = dict.fromkeys(KINDS, 0)
    for _, spec in FIELDS:
        sizes[spec.kind] += spec.bound(limits)
    return sizes
