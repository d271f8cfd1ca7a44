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
each dtype in its own buffer; the fields a graph reads come first and, in a graph step, each
is padded to its capacity in that graph (`graph`: a decode, verification or prefill graph's
packing), so every step of one graph lands at the offsets the graph was captured with. The
fields after them (resumed snapshots, mRoPE rows, sampling inits, grammar rows) are read
outside the graphs.
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
    bitmask_rows: int = 0   # grammar bitmask rows (a verification's: one per sampled row)

    @classmethod
    def for_runner(cls, *, num_slots: int, max_num_batched_tokens: int, max_graph_batch: int,
                   table_width: int, vocab_size: int, init_ints: int, init_floats: int,
                   width: int = 1, max_image_tokens: int = 0) -> StepLimits:
        """A step feeds at most the token budget, or one decode per slot plus the oldest
        prefill's minimum chunk (64), plus one whole image span past the budget (at most
        `max_image_tokens`: scheduler/policy.py); a slot's whole page table uploads when it
        starts. `width`: rows per sequence of a verification step (1 + drafts; 1: no
        speculation)."""
        rows = max(num_slots, max_graph_batch)
        tokens = max(max_num_batched_tokens, rows) + 64 + max_image_tokens
        return cls(tokens=tokens, seqs=rows, samples=tokens, resumes=num_slots,
                   table_cells=(num_slots + 1) * table_width, inits=num_slots,
                   init_ints=init_ints, init_floats=init_floats,
                   bitmask_words=num_slots * width * ((vocab_size + 31) // 32),
                   bitmask_rows=num_slots * width)


@dataclass(frozen=True, slots=True)
class GraphPads:
    """Values of a decode graph's padding entries that depend on the runner."""

    padding_row: int     # the slot-state row padding sequences sample into
    trash_cell: int      # the page-table cell unused update entries write


@dataclass(frozen=True, slots=True)
class GraphPacking:
    """Pack a step at a graph's capacities: its fields padded to them.

    A decode graph: `capacity` sequences of one row each. A verification graph (`width` > 1):
    `capacity` sequences of up to `width` rows, packed back to back (tokens = capacity x
    width), every row sampling, with `cells` page-table update entries. A prefill graph
    (`rows` > 0: prefill and mixed steps): up to `capacity` sequences feeding `rows` token
    rows in all, any number each, each sampling at most its last row."""

    capacity: int
    pads: GraphPads
    width: int = 1
    cells: int = 0                 # page-table update entries (0: one per sequence)
    rows: int = 0                  # a prefill graph's token rows (0: a decode/verification)

    @property
    def is_prefill(self) -> bool:
        return self.rows > 0

    @property
    def tokens(self) -> int:
        return self.rows or self.capacity * self.width

    @property
    def samples(self) -> int:
        """Sampled rows a graph reads per-row verification fields for (only a verification
        graph reads them)."""
        return self.capacity * self.width if self.width > 1 else 0

    @property
    def sampled_rows(self) -> int:
        """Rows of sampler output a step of this graph writes (padding rows included)."""
        return self.capacity if self.is_prefill else self.tokens

    @property
    def update_cells(self) -> int:
        return self.cells or self.capacity


@dataclass(frozen=True, slots=True)
class InputField:
    kind: str                                   # I64, I32 or F32
    bound: Callable[[StepLimits], int]          # most values one step holds
    graph: Callable[[GraphPacking], int] | None = None   # capacity in a graph
    pad: Callable[[GraphPads, int], float] = lambda pads, count: 0   # graph padding value


def _input(kind: str, bound: Callable[[StepLimits], int],
           graph: Callable[[GraphPacking], int] | None = None,
           pad: Callable[[GraphPads, int], float] | None = None) -> Any:
    spec = InputField(kind, bound, graph, pad or (lambda pads, count: 0))
    return field(default_factory=list, metadata={"input": spec})


def _rows(g: GraphPacking) -> int:
    return g.tokens


def _seqs(g: GraphPacking) -> int:
    return g.capacity


def _cells(g: GraphPacking) -> int:
    return g.update_cells


def _samples(g: GraphPacking) -> int:
    return g.samples


def _sample_slots(g: GraphPacking) -> int:
    return g.capacity if g.is_prefill else g.samples


def _prefill_seqs(g: GraphPacking) -> int:
    """Per-sequence rows only a prefill graph reads (its fed sequences' last rows, the
    sampled rows)."""
    return g.capacity if g.is_prefill else 0


@dataclass(slots=True)
class StepInputs(Generic[V]):
    # -- read by decode graphs (fixed offsets at each capacity) -----------------------------
    input_ids: V = _input(I64, lambda lim: lim.tokens, _rows)          # [T] fed ids (pending: 0)
    positions: V = _input(I64, lambda lim: lim.tokens, _rows)          # [T]
    slot_mapping: V = _input(I64, lambda lim: lim.tokens, _rows,       # [T] KV slot, -1: padding
                             lambda pads, count: -1)
    pending_slot: V = _input(I64, lambda lim: lim.tokens, _rows,       # [T] slot feeding the row
                             lambda pads, count: -1)
    rope_offsets: V = _input(I64, lambda lim: lim.tokens, _rows)       # [T] mRoPE models: the
                                                                       # rows' position - index
    seq_slots: V = _input(I64, lambda lim: lim.seqs, _seqs,            # [B] slot of each sequence
                          lambda pads, count: pads.padding_row)
    update_index: V = _input(I64, lambda lim: lim.table_cells, _cells,  # [U] page-table cells
                             lambda pads, count: pads.trash_cell)
    query_start_loc: V = _input(I32, lambda lim: lim.seqs + 1,         # [B + 1] (padding
                                lambda g: g.capacity + 1,              # sequences: empty)
                                lambda pads, count: count)
    seq_lens: V = _input(I32, lambda lim: lim.seqs, _seqs)             # [B] KV length after
    update_value: V = _input(I32, lambda lim: lim.table_cells, _cells)  # [U] page ids
    # -- sampled rows: their slots (every step but a decode graph's), then the per-row
    # verification inputs (a verification graph reads them; eager steps that verify fill
    # them; nothing else does) -------------------------------------------------------------
    sample_slots: V = _input(I64, lambda lim: lim.samples, _sample_slots,  # [S] slot of each
                             lambda pads, count: pads.padding_row)        # row
    sample_offsets: V = _input(I64, lambda lim: lim.samples, _samples)  # [S] offset in its seq
    sample_drafts: V = _input(I64, lambda lim: lim.samples, _samples,   # [S] the draft row o
                              lambda pads, count: -1)                   # checks (-1: none)
    sample_first: V = _input(I64, lambda lim: lim.samples, _samples)    # [S] its seq's first row
    sample_cells: V = _input(I64, lambda lim: lim.samples, _samples,    # [S] hidden cell of the
                             lambda pads, count: pads.padding_row * 2)  # row's position
    # -- eager steps and prefill graphs (padding: row 0 into the padding cell) -------------
    hidden_rows: V = _input(I64, lambda lim: lim.seqs, _prefill_seqs)   # [F] last fed row
    hidden_cells: V = _input(I64, lambda lim: lim.seqs, _prefill_seqs,  # [F] slot * 2 + parity
                             lambda pads, count: pads.padding_row * 2)
    sample_rows: V = _input(I64, lambda lim: lim.samples, _prefill_seqs)  # [S] row (T + k:
                                                                          # resumed)
    # -- eager steps only -------------------------------------------------------------------
    resume_ids: V = _input(I64, lambda lim: lim.resumes)                # [Z] snapshot rows
    resume_cells: V = _input(I64, lambda lim: lim.resumes)              # [Z] slot * 2 + parity
    mrope_rows: V = _input(I64, lambda lim: 3 * lim.tokens)             # [3 * T] mRoPE models:
                                                                        # T, H, W rows in turn
    # -- installed before the graph or body runs --------------------------------------------
    init_slots: V = _input(I64, lambda lim: lim.inits)                  # [N] slots initialised
    init_ints: V = _input(I64, lambda lim: lim.inits * lim.init_ints)     # [N * ints]
    init_floats: V = _input(F32, lambda lim: lim.inits * lim.init_floats)  # [N * floats]
    bitmask_slots: V = _input(I64, lambda lim: max(lim.inits, lim.bitmask_rows))  # [G] rows
    bitmask_words: V = _input(I32, lambda lim: lim.bitmask_words)       # [G * words]
    bitmask_reset: V = _input(I64, lambda lim: max(lim.inits, lim.bitmask_rows))  # [R] rows
                                                                        # back to all ones

    @classmethod
    def empty(cls) -> StepInputs[Any]:
        return cls()


FIELDS: tuple[tuple[str, InputField], ...] = tuple(
    (f.name, f.metadata["input"]) for f in dataclasses.fields(StepInputs))


# Each field starts 16 bytes into its dtype's buffer times a whole number: Triton specialises
# a kernel on whether a pointer is 16-byte aligned, so a field packed after an odd-length one
# would otherwise compile a second variant of every kernel reading it, in the middle of
# serving (a step of another length).
ALIGN_VALUES = {I64: 2, I32: 4, F32: 4}      # values per 16 bytes


def aligned(offset: int, kind: str) -> int:
    """`offset` (values into the `kind` buffer) rounded up to a 16-byte boundary."""
    step = ALIGN_VALUES[kind]
    return -(-offset // step) * step


def buffer_sizes(limits: StepLimits) -> dict[str, int]:
    """Values per dtype the persistent buffers hold: the fields' bounds, each starting on a
    16-byte boundary."""
    sizes = dict.fromkeys(KINDS, 0)
    for _, spec in FIELDS:
        sizes[spec.kind] = aligned(sizes[spec.kind], spec.kind) + spec.bound(limits)
    return sizes
