"""Packing a step that runs eagerly (prefill, mixed, resume, snapshot, or a decode no graph
serves) into its input frame, with the field names `StepBody` reads.

Sequences that feed tokens are packed in step order into T rows (the forward's batch); a
sequence that only resumes sampling from a snapshot feeds none: its sampling row is T + k, the
k-th resumed snapshot's saved hidden state. Every participant uploads the page-table entries it
is missing (a whole table when it starts in a slot).
"""

from __future__ import annotations

from services.engine.runner.frames import FramePacker
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.step_body import StepShape
from services.engine.scheduler.plan import Step


def pack_eager(packer: FramePacker, step: Step, page_size: int, mirror: PageTableMirror,
               padding_row: int) -> StepShape:
    ids: list[int] = []
    pending: list[int] = []
    positions: list[int] = []
    kv_slots: list[int] = []
    seq_slots: list[int] = []
    starts = [0]
    seq_lens: list[int] = []
    hidden_rows: list[int] = []
    hidden_cells: list[int] = []
    update_index: list[int] = []
    update_value: list[int] = []
    resume_ids: list[int] = []
    resume_cells: list[int] = []
    sample_sources: list[tuple[bool, int]] = []      # (from a snapshot, index)
    sample_slots: list[int] = []
    max_query_len = 0
    for seq in step.seqs:
        slot = seq.handle.slot
        mirror.updates(seq.handle, seq.page_ids, update_index, update_value)
        fed = len(seq.token_ids)
        if fed:
            if seq.feeds_pending:
                ids.append(0)
                pending.append(slot)
            else:
                ids.extend(seq.token_ids)
                pending.extend([-1] * fed)
            for position in range(seq.start, seq.end):
                positions.append(position)
                kv_slots.append(seq.page_ids[position // page_size] * page_size +
                                position % page_size)
            seq_slots.append(slot)
            starts.append(starts[-1] + fed)
            seq_lens.append(seq.end)
            max_query_len = max(max_query_len, fed)
            hidden_rows.append(len(ids) - 1)
            hidden_cells.append(slot * 2 + (seq.end - 1) % 2)
            if seq.sample:
                sample_sources.append((False, len(ids) - 1))
                sample_slots.append(slot)
        elif seq.resume_snapshot is not None:
            resume_cells.append(slot * 2 + (seq.start - 1) % 2)
            if seq.sample:
                sample_sources.append((True, len(resume_ids)))
                sample_slots.append(slot)
            resume_ids.append(seq.resume_snapshot)
    num_tokens = len(ids)
    sample_rows = [num_tokens + k if from_snapshot else k for from_snapshot, k in sample_sources]
    packer.i64("input_ids", ids)
    packer.i64("positions", positions)
    packer.i64("slot_mapping", kv_slots)
    packer.i64("pending_slot", pending)
    packer.i64("seq_slots", seq_slots)
    packer.i64("update_index", update_index)
    packer.i64("hidden_rows", hidden_rows)
    packer.i64("hidden_cells", hidden_cells)
    packer.i64("sample_rows", sample_rows)
    packer.i64("sample_slots", sample_slots)
    packer.i64("resume_ids", resume_ids)
    packer.i64("resume_cells", resume_cells)
    packer.i32("query_start_loc", starts)
    packer.i32("seq_lens", seq_lens)
    packer.i32("update_value", update_value)
    return StepShape(num_tokens=num_tokens, num_seqs=len(seq_slots),
                     max_query_len=max_query_len, max_seq_len=max(seq_lens, default=0),
                     is_decode_graph=False)
