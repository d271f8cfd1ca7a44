"""An EAGLE-3 drafting round as CUDA graphs (runner/round_graphs.py owns the shapes, the
static inputs, the capture and the replay; runner/eagle3_drafter.py runs the rounds).

    graphs = Eagle3RoundGraphs(head, embedding, kv, store, beyond, num_tokens=k, page_size=16)

The body: the catch-up forward of the head over the fed tokens' embeddings and the target's
fused states at their rows of the store (each row's `extra` value; padding rows read the
store's padding row), the draft from the last real row's normed state, then the chained
forwards, each feeding the last draft and the head's own pre-norm state back.
"""

from __future__ import annotations

from typing import Any

import torch

from services.engine.model import KVCache
from services.engine.model.eagle3 import Eagle3Head
from services.engine.model.layers import Embedding
from services.engine.runner.round_graphs import RoundGraphs


class Eagle3RoundGraphs(RoundGraphs):
    kind = "EAGLE-3"

    def __init__(self, head: Eagle3Head, embedding: Embedding, kv: KVCache, store: Any,
                 beyond: torch.Tensor, *, num_tokens: int, page_size: int) -> None:
        self.head = head
        self.embedding = embedding
        self.kv = kv
        self.store = store                  # TargetHiddenStore: .rows, .padding_row
        self.beyond = beyond                # bool [draft_vocab]: never proposed
        super().__init__(head.fc.weight.device, max_positions=head.max_positions,
                         num_tokens=num_tokens, page_size=page_size,
                         padding_extra=store.padding_row)

    @torch.inference_mode()
    def _body(self, rows: int, drafts: int) -> None:
        dev = self._dev
        hidden = self.store.rows.index_select(0, dev.extra[:rows])
        normed, prenorm = self.head(self.embedding(dev.ids[:rows]), hidden,
                                    dev.positions[:rows], self.kv, self.catch_up_meta(rows))
        normed, prenorm = normed.index_select(0, dev.last), prenorm.index_select(0, dev.last)
        draft = greedy_draft(self.head, normed, self.beyond)
        self.out[0:1].copy_(draft)
        for j in range(drafts - 1):
            normed, prenorm = self.head(self.embedding(draft), prenorm,
                                        dev.chain_positions[j, :1], self.kv,
                                        self.chained_meta(j))
            draft = greedy_draft(self.head, normed, self.beyond)
            self.out[j + 1:j + 2].copy_(draft)


def greedy_draft(head: Eagle3Head, normed: torch.Tensor, beyond: torch.Tensor) -> torch.Tensor:
    """normed [1, H] -> the greedy draft's target id, int64 [1] on the device (no host read;
    draft ids in `beyond`, bool [draft_vocab], are never proposed)."""
    logits = head.logits(normed).masked_fill_(beyond, float("-inf"))
    return head.draft_to_target.index_select(0, logits.argmax(dim=-1))
