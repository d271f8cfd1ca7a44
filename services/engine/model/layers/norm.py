"""RMSNorm weights (the ops compute the norm; decoder layers fuse it with what follows).

`offset` is what the checkpoint's weight is stored without: Gemma's norms scale by `1 + w`,
so their loader stores `w + 1` (in float32 before the cast) and every op reads a plain scale,
exactly as for Llama-style norms. In float32 this equals the reference bit for bit; in bf16
the stored `1 + w` is rounded once.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.layers.weights import load_whole, offset_loader, parameter


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, *, device: torch.device | str,
                 dtype: torch.dtype, offset: float = 0.0) -> None:
        super().__init__()
        self.eps = eps
        self.offset = offset
        self.weight = parameter(size, device=device, dtype=dtype,
                                loader=offset_loader(offset) if offset else load_whole)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., size] -> rms_norm(x) * weight."""
        return ops.rms_norm(x, self.weight, self.eps)
