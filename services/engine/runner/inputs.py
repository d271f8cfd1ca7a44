"""Turning a committed Step into model inputs: packed token rows and AttentionMetadata.

Sequences that feed tokens are packed in step order into T rows; a sequence that only resumes
sampling (a full prefix hit) feeds none and is not part of the forward pass. `last_rows[i]` is
the packed row of the i-th forward sequence's last token: its hidden state gives the logits
for sampling and the state a checkpoint capture saves.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from services.engine.model import AttentionMetadata, build_metadata
from services.engine.scheduler.plan import Step


@dataclass(frozen=True, slots=True)
class ForwardInputs:
    input_ids: torch.Tensor        # int64 [T]
    positions: torch.Tensor        # int64 [T]
    meta: AttentionMetadata
    seq_indices: tuple[int, ...]   # index in step.seqs of each forward sequence, packed order
    last_rows: tuple[int, ...]     # packed row of each forward sequence's last token


def build_forward_inputs(step: Step, page_size: int, device: torch.device,
                         last_tokens: Mapping[int, int] | None = None) -> ForwardInputs | None:
    """`last_tokens` (slot -> its last sampled token) supplies a pending fed token."""
    token_ids: list[int] = []
    positions: list[int] = []
    query_lens: list[int] = []
    seq_lens: list[int] = []
    tables: list[tuple[int, ...]] = []
    indices: list[int] = []
    last_rows: list[int] = []
    for index, seq in enumerate(step.seqs):
        if not seq.token_ids:
            continue
        if seq.feeds_pending:
            if last_tokens is None or seq.handle.slot not in last_tokens:
                raise RuntimeError(f"slot {seq.handle} feeds a pending token it never sampled")
            token_ids.append(last_tokens[seq.handle.slot])
        else:
            token_ids.extend(seq.token_ids)
        positions.extend(range(seq.start, seq.end))
        query_lens.append(len(seq.token_ids))
        seq_lens.append(seq.end)
        tables.append(seq.page_ids[:-(-seq.end // page_size)])
        indices.append(index)
        last_rows.append(len(token_ids) - 1)
    if not indices:
        return None
    meta = build_metadata(query_lens, seq_lens, tables, page_size, device)
    return ForwardInputs(
        input_ids=torch.tensor(token_ids, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        meta=meta, seq_indices=tuple(indices), last_rows=tuple(last_rows))
