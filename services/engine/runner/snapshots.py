"""SnapshotStore: the storage behind snapshot rows (checkpoint state at an exact endpoint).

A row holds what a checkpoint needs beyond its complete pages: the partial tail page (K and V
of positions [P * (T // P), T) for every layer) and the final hidden state at T, from which a
full-prompt hit samples its first token without replaying any prompt token. A tail capture (a
boundary a prefill chunk ran past) saves the partial page alone.
"""

from __future__ import annotations

import torch

from services.engine.model import KVCache


class SnapshotStore:
    def __init__(self, kv: KVCache, num_rows: int, hidden_size: int, dtype: torch.dtype,
                 device: torch.device) -> None:
        page_shape = tuple(kv.k_caches[0].shape[1:])          # [P, kv_heads, head_dim]
        self.k_rows = tuple(torch.zeros((num_rows, *page_shape), dtype=dtype, device=device)
                            for _ in range(kv.num_layers))   # per layer [S, P, kvh, d]
        self.v_rows = tuple(torch.zeros((num_rows, *page_shape), dtype=dtype, device=device)
                            for _ in range(kv.num_layers))
        self.hidden = torch.zeros((num_rows, hidden_size), dtype=dtype, device=device)  # [S, H]
        self.kv = kv

    @property
    def num_rows(self) -> int:
        return int(self.hidden.shape[0])

    def capture(self, row: int, page_id: int, num_tokens: int, hidden: torch.Tensor) -> None:
        """Save hidden [H] and the first `num_tokens` rows of page `page_id` into `row`."""
        self.hidden[row].copy_(hidden)
        self.capture_tail(row, page_id, num_tokens)

    def capture_tail(self, row: int, page_id: int, num_tokens: int) -> None:
        """Save the first `num_tokens` rows of page `page_id` into `row` (a tail capture: a
        boundary inside the step's fed rows, whose K/V no later row of the step changes)."""
        if num_tokens:
            for k_rows, v_rows, k_cache, v_cache in zip(self.k_rows, self.v_rows,
                                                        self.kv.k_caches, self.kv.v_caches,
                                                        strict=True):
                k_rows[row, :num_tokens].copy_(k_cache[page_id, :num_tokens])
                v_rows[row, :num_tokens].copy_(v_cache[page_id, :num_tokens])

    def restore(self, row: int, page_id: int, num_tokens: int) -> None:
        """Copy the saved partial tail of `row` into the first rows of page `page_id`."""
        for k_rows, v_rows, k_cache, v_cache in zip(self.k_rows, self.v_rows,
                                                    self.kv.k_caches, self.kv.v_caches,
                                                    strict=True):
            k_cache[page_id, :num_tokens].copy_(k_rows[row, :num_tokens])
            v_cache[page_id, :num_tokens].copy_(v_rows[row, :num_tokens])
