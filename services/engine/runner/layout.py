"""A step's packed geometry: where each fed token goes and which rows sample.

    layout = layout_step(step, page_size)

The one implementation of the step semantics' arithmetic (plan.py) that every runner, and
the test fake, builds its inputs from: sequences that feed tokens are packed in step order
into T rows; fed token j of a sequence sits at position start + j and is written to KV slot
`kv_slot(page_ids, position, page_size)`; a sequence attends over `end` positions of its
page table. A sequence that resumes from a snapshot feeds no row; its sampled "row" is
T + k, the k-th resumed snapshot's saved hidden state. A sequence that may emit m tokens
samples its last m rows (sample_from .. end - 1), in order; each sampled row's offset (0..m-1)
counts output positions from the step's output_index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.engine.model.attention import kv_slot
from services.engine.scheduler.plan import PENDING_TOKEN, Step


@dataclass(slots=True)
class StepLayout:
    token_ids: list[int] = field(default_factory=list)       # [T] fed ids (a pending row: 0)
    pending_slots: list[int] = field(default_factory=list)   # [T] slot feeding the row, or -1
    positions: list[int] = field(default_factory=list)       # [T]
    kv_slots: list[int] = field(default_factory=list)        # [T] flat KV slot of each row
    forward_seqs: list[int] = field(default_factory=list)    # [F] step.seqs index, fed tokens
    query_start_loc: list[int] = field(default_factory=lambda: [0])   # [F + 1]
    seq_lens: list[int] = field(default_factory=list)        # [F] KV length after the step
    page_tables: list[tuple[int, ...]] = field(default_factory=list)  # [F] pages over seq_len
    last_rows: list[int] = field(default_factory=list)       # [F] row of the last fed token
    resumed_seqs: list[int] = field(default_factory=list)    # [Z] step.seqs index, snapshots
    sample_rows: list[int] = field(default_factory=list)     # [S] row (or T + k) sampled
    sample_seqs: list[int] = field(default_factory=list)     # [S] step.seqs index per row
    sample_offsets: list[int] = field(default_factory=list)  # [S] offset among the seq's rows
    max_query_len: int = 0
    max_seq_len: int = 0

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def layout_step(step: Step, page_size: int) -> StepLayout:
    layout = StepLayout()
    resumed_samples: list[tuple[int, int]] = []      # (index in sample lists, snapshot k)
    for index, seq in enumerate(step.seqs):
        fed = len(seq.token_ids)
        if fed:
            first = len(layout.token_ids)
            for j, token in enumerate(seq.token_ids):
                pending = j == 0 and token == PENDING_TOKEN
                layout.token_ids.append(0 if pending else token)
                layout.pending_slots.append(seq.handle.slot if pending else -1)
                position = seq.start + j
                layout.positions.append(position)
                layout.kv_slots.append(kv_slot(seq.page_ids, position, page_size))
            layout.forward_seqs.append(index)
            layout.query_start_loc.append(first + fed)
            layout.seq_lens.append(seq.end)
            layout.page_tables.append(seq.page_ids[:-(-seq.end // page_size)])
            layout.last_rows.append(first + fed - 1)
            layout.max_query_len = max(layout.max_query_len, fed)
            layout.max_seq_len = max(layout.max_seq_len, seq.end)
            for offset in range(seq.max_emit):
                layout.sample_rows.append(first + fed - seq.max_emit + offset)
                layout.sample_seqs.append(index)
                layout.sample_offsets.append(offset)
        elif seq.resume_snapshot is not None:
            if seq.max_emit:
                resumed_samples.append((len(layout.sample_rows), len(layout.resumed_seqs)))
                layout.sample_rows.append(-1)          # T + k, once T is known
                layout.sample_seqs.append(index)
                layout.sample_offsets.append(0)
            layout.resumed_seqs.append(index)
    for position, k in resumed_samples:
        layout.sample_rows[position] = layout.num_tokens + k
    return layout


def verified_tokens(sampled: list[int], drafts: tuple[int, ...]) -> list[int]:
    """The tokens a step emits from its sampled rows: each row's token, up to and including
    the first that differs from the next draft (all of them when every draft matched). An
    ordinary sampling step has one row and no drafts: its one token."""
    emitted: list[int] = []
    for offset, token in enumerate(sampled):
        emitted.append(token)
        if offset >= len(drafts) or token != drafts[offset]:
            break
    return emitted
