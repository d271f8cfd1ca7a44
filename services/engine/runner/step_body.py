"""One step's device work over uploaded views: the code a decode graph captures and the eager
path runs for prefill, mixed and resume steps.

    hidden = body.run(views, shape, mode, logprobs)
    hidden = body.run(views, shape, mode, logprobs, images=embeds)   # an eager step of a VLM

1. Fed tokens: a row whose `pending_slot` is >= 0 takes that slot's last sampled token from
   device memory (a decode planned before the token reached the host); others the host's id.
2. Page-table updates are scattered into the persistent table; the step's rows are gathered.
3. The forward pass writes K/V and returns hidden states; each fed sequence's last row is kept
   per slot by position parity (terminal checkpoints read it later). An mRoPE model reads
   positions [3, T]: an eager step's packed rows (with the image features of its image
   rows), or, in a graph, each row's index plus its offset on all three rows (text tokens).
4. Sampling rows (forward rows, or snapshot states for full-prefix hits at index T + k) give
   logits; the slot sampler (with the slots' grammar bitmasks in a `grammar` step) writes
   ids/logprobs into the persistent outputs and advances the slots' state.
5. A verification step (`shape.verify`: some sequence checks drafts) samples every row of
   those sequences with the per-row inputs (slot_sampler.VerifyRows); each sequence's last
   emitted row keeps its hidden state in the cell of its position (`sample_cells`), the
   state a terminal checkpoint at the accepted length reads. A verification graph
   (`shape.all_rows_sample`) samples every packed row in order.
Only tensor ops on device views and host ints (the `StepShape`): nothing synchronises.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.model import AttentionMetadata, CausalLM, ForwardBatch, KVCache
from services.engine.model.vision.inputs import ImageEmbeds
from services.engine.runner.slot_sampler import SampleOutputs, VerifyRows, sample_rows
from services.engine.runner.slot_state import SamplingMode, SlotState
from services.engine.runner.snapshots import SnapshotStore
from services.engine.runner.step_inputs import StepInputs


@dataclass(frozen=True, slots=True)
class StepShape:
    """Host ints that fix a step's launch shapes (a graph's are its capacities)."""

    num_tokens: int
    num_seqs: int
    max_query_len: int
    max_seq_len: int
    is_decode_graph: bool       # T == B, one token per sequence, every row samples
    verify: bool = False        # some sequence verifies drafts (per-row sampling inputs)
    mrope_rows: bool = False    # an eager step of an mRoPE model: `mrope_rows` holds [3, T]
    all_rows_sample: bool = False   # a verification graph: every packed row samples, in order


class StepBody:
    def __init__(self, model: CausalLM, kv: KVCache, snapshots: SnapshotStore,
                 state: SlotState, page_table: torch.Tensor, outputs: SampleOutputs) -> None:
        self.model = model
        self.kv = kv
        self.snapshots = snapshots
        self.state = state
        self.page_table = page_table          # int32 [slots + 1, width]
        self.outputs = outputs

    def run(self, views: StepInputs[torch.Tensor], shape: StepShape, mode: SamplingMode,
            logprobs: bool, grammar: bool = False, images: ImageEmbeds | None = None
            ) -> torch.Tensor | None:
        state = self.state
        pending = views.pending_slot
        input_ids = torch.where(pending >= 0,
                                state.last_token.index_select(0, pending.clamp(min=0)),
                                views.input_ids)                            # [T]
        if views.update_index.shape[0]:
            self.page_table.view(-1).index_copy_(0, views.update_index,
                                                 views.update_value)
        seq_slots = views.seq_slots
        positions = views.positions
        hidden = None
        if shape.num_tokens:
            meta = AttentionMetadata(
                query_start_loc=views.query_start_loc, seq_lens=views.seq_lens,
                page_table=self.page_table.index_select(0, seq_slots),            # [B, W]
                slot_mapping=views.slot_mapping, max_query_len=shape.max_query_len,
                max_seq_len=shape.max_seq_len)
            batch = ForwardBatch(input_ids, self._model_positions(views, shape), meta,
                                 images=images)
            hidden = self.model(batch, self.kv).hidden                                # [T, H]
        if shape.is_decode_graph:
            assert hidden is not None
            cells = seq_slots * 2 + positions % 2
            state.last_hidden.index_copy_(0, cells, hidden)
            sample_hidden = hidden
            sample_slots = seq_slots
        elif shape.all_rows_sample:
            assert hidden is not None
            sample_hidden = hidden
            sample_slots = views.sample_slots
        else:
            if hidden is not None and views.hidden_rows.shape[0]:
                state.last_hidden.index_copy_(0, views.hidden_cells,
                                              hidden.index_select(0, views.hidden_rows))
            sample_slots = views.sample_slots
            resume_ids = views.resume_ids
            if not sample_slots.shape[0]:
                if resume_ids.shape[0]:
                    state.last_hidden.index_copy_(
                        0, views.resume_cells,
                        self.snapshots.hidden.index_select(0, resume_ids))
                return hidden
            source = hidden
            if resume_ids.shape[0]:
                saved = self.snapshots.hidden.index_select(0, resume_ids)
                state.last_hidden.index_copy_(0, views.resume_cells, saved)
                source = saved if hidden is None else torch.cat((hidden, saved))
            assert source is not None
            sample_hidden = source.index_select(0, views.sample_rows)
        logits = self.model.compute_logits(sample_hidden)                         # [S, V]
        verify = VerifyRows(views.sample_offsets, views.sample_drafts,
                            views.sample_first) if shape.verify else None
        last = sample_rows(logits, sample_slots, state, mode, logprobs, self.outputs, grammar,
                           verify)
        if last is not None:
            padding = torch.full_like(views.sample_cells, state.padding_row * 2)
            state.last_hidden.index_copy_(0, torch.where(last, views.sample_cells, padding),
                                          sample_hidden)
        return hidden

    def _model_positions(self, views: StepInputs[torch.Tensor], shape: StepShape
                         ) -> torch.Tensor:
        """The positions the model reads: [T], or an mRoPE model's [3, T] (packed rows, or
        index + offset on every row: text tokens, whose three rows are equal)."""
        if self.model.position_rows != 3:
            return views.positions
        if shape.mrope_rows:
            return views.mrope_rows.view(3, -1)
        return (views.positions + views.rope_offsets).unsqueeze(0).expand(3, -1)
