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
        # the multiplier rounded to the table's dtype first, as the reference models do (a
        # Python scalar: no tensor is made in forward, which a CUDA graph captures)
        self.multiplier = float(torch.tensor(multiplier, dtype=dtype))

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """int64 [T] -> [T, H] in the table's dtype."""
        x = F.embedding(input_ids, self.weight)
        return x * self.multiplier if self.multiplier != 1.0 else x
