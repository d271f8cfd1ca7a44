"""Packing a step that runs eagerly (prefill, mixed, resume, snapshot, or a decode no graph
serves) into its typed inputs (step_inputs.StepInputs), the fields `StepBody` reads.

Sequences that feed tokens are packed in step order into T rows (the forward's batch); a
sequence that only resumes sampling from a snapshot feeds none: its sampling row is T + k, the
k-th resumed snapshot's saved hidden state. Every participant uploads the page-table entries it
is missing (a whole table when it starts in a slot). A step that verifies drafts also packs
the per-row sampling inputs (`pack_verify`; a verification graph packs them too).
"""

from __future__ import annotations

from services.engine.runner.layout import StepLayout
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.step_body import StepShape
from services.engine.runner.step_inputs import StepInputs
from services.engine.scheduler.plan import SeqStep, Step


def pack_rows(values: StepInputs, step: Step, layout: StepLayout,
              mirror: PageTableMirror) -> list[SeqStep]:
    """The fields every step packs alike (a decode graph's too): the fed rows, the forward
    sequences and their page-table uploads. Returns the forward sequences."""
    fed = [step.seqs[i] for i in layout.forward_seqs]
    for seq in fed:
        mirror.updates(seq.handle, seq.page_ids, values.update_index, values.update_value)
    values.input_ids = layout.token_ids
    values.positions = layout.positions
    values.slot_mapping = layout.kv_slots
    values.pending_slot = layout.pending_slots
    values.seq_slots = [seq.handle.slot for seq in fed]
    values.query_start_loc = layout.query_start_loc
    values.seq_lens = layout.seq_lens
    return fed


def pack_verify(values: StepInputs, step: Step, layout: StepLayout, padding_row: int) -> None:
    """Per sampled row: its slot, its offset among its sequence's rows, the draft it is
    checked against (the token fed at the next row; -1 for a sequence's last row), its
    sequence's first sampled row, and the hidden-state cell of its position (the padding
    cell for a resumed snapshot's row, which has none)."""
    slots: list[int] = []
    offsets: list[int] = []
    drafts: list[int] = []
    first: list[int] = []
    cells: list[int] = []
    start = 0
    for k, (index, offset) in enumerate(zip(layout.sample_seqs, layout.sample_offsets,
                                           strict=True)):
        seq = step.seqs[index]
        if offset == 0:
            start = k
        own = seq.draft_token_ids
        slots.append(seq.handle.slot)
        offsets.append(offset)
        drafts.append(own[offset] if offset < len(own) else -1)
        first.append(start)
        cells.append(seq.handle.slot * 2 + (seq.sample_from + offset) % 2 if seq.token_ids
                     else padding_row * 2)
    values.sample_slots = slots
    values.sample_offsets = offsets
    values.sample_drafts = drafts
    values.sample_first = first
    values.sample_cells = cells


def pack_eager(values: StepInputs, step: Step, layout: StepLayout,
               mirror: PageTableMirror, padding_row: int = 0) -> StepShape:
    for seq in step.seqs:                 # resumed sequences upload their tables too
        if not seq.token_ids:
            mirror.updates(seq.handle, seq.page_ids, values.update_index, values.update_value)
    fed = pack_rows(values, step, layout, mirror)
    resumed = [step.seqs[i] for i in layout.resumed_seqs]
    values.hidden_rows = layout.last_rows
    values.hidden_cells = [seq.handle.slot * 2 + (seq.end - 1) % 2 for seq in fed]
    values.sample_rows = layout.sample_rows
    values.sample_slots = [step.seqs[i].handle.slot for i in layout.sample_seqs]
    values.resume_ids = [seq.resume_snapshot for seq in resumed]
    values.resume_cells = [seq.handle.slot * 2 + (seq.start - 1) % 2 for seq in resumed]
    verify = any(seq.max_emit > 1 for seq in step.seqs)
    if verify:
        pack_verify(values, step, layout, padding_row)
    return StepShape(num_tokens=layout.num_tokens, num_seqs=len(fed),
                     max_query_len=layout.max_query_len, max_seq_len=layout.max_seq_len,
                     is_decode_graph=False, verify=verify)
