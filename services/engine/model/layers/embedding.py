"""The input embedding table [V, H], optionally scaled (Gemma multiplies by sqrt(H))."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model.layers.weights import parameter


class Embedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int, *, device: torch.device | str,
                 dtype: torch.dtype, multiplier: float = 1.0) -> None:
        super().__init__()
        self.weight = parameter(vocab_size, hidden_size, device=device, dtype=dtype)
        self.multiplier = multiplier

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 [T] -> [T, H] in the table's dtype (the multiplier rounded to it first, as
        the reference models do)."""
        x = F.embedding(input_ids, self.weight)
        if self.multiplier != 1.0:
            x = x * torch.tensor(self.multiplier, dtype=x.dtype, device=x.device)
        return x
