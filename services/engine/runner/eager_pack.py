"""Packing a step that runs eagerly (prefill, mixed, resume, snapshot, or a decode no graph
serves) into its input frame, with the field names `StepBody` reads.

Sequences that feed tokens are packed in step order into T rows (the forward's batch); a
sequence that only resumes sampling from a snapshot feeds none: its sampling row is T + k, the
k-th resumed snapshot's saved hidden state. Every participant uploads the page-table entries it
is missing (a whole table when it starts in a slot).
"""

from __future__ import annotations

from services.engine.runner.frames import FramePacker
from services.engine.runner.layout import layout_step
from services.engine.runner.page_tables import PageTableMirror
from services.engine.runner.step_body import StepShape
from services.engine.scheduler.plan import Step


def pack_eager(packer: FramePacker, step: Step, page_size: int, mirror: PageTableMirror,
               padding_row: int) -> StepShape:
    layout = layout_step(step, page_size)
    update_index: list[int] = []
    update_value: list[int] = []
    for seq in step.seqs:
        mirror.updates(seq.handle, seq.page_ids, update_index, update_value)
    fed = [step.seqs[i] for i in layout.forward_seqs]
    resumed = [step.seqs[i] for i in layout.resumed_seqs]
    packer.i64("input_ids", layout.token_ids)
    packer.i64("positions", layout.positions)
    packer.i64("slot_mapping", layout.kv_slots)
    packer.i64("pending_slot", layout.pending_slots)
    packer.i64("seq_slots", [seq.handle.slot for seq in fed])
    packer.i64("update_index", update_index)
    packer.i64("hidden_rows", layout.last_rows)
    packer.i64("hidden_cells", [seq.handle.slot * 2 + (seq.end - 1) % 2 for seq in fed])
    packer.i64("sample_rows", layout.sample_rows)
    packer.i64("sample_slots", [step.seqs[i].handle.slot for i in layout.sample_seqs])
    packer.i64("resume_ids", [seq.resume_snapshot for seq in resumed])
    packer.i64("resume_cells", [seq.handle.slot * 2 + (seq.start - 1) % 2 for seq in resumed])
    packer.i32("query_start_loc", layout.query_start_loc)
    packer.i32("seq_lens", layout.seq_lens)
    packer.i32("update_value", update_value)
    return StepShape(num_tokens=layout.num_tokens, num_seqs=len(fed),
                     max_query_len=layout.max_query_len, max_seq_len=layout.max_seq_len,
                     is_decode_graph=False)
