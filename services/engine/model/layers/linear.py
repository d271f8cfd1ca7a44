"""Linear layers: a weight [N, K] (+ bias [N]) the ops read, with per-parameter loaders.

`Linear` is loaded whole; `PackedLinear` stacks several checkpoint projections along its rows
(q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and loads each shard into its rows. The
layer's forward is `ops.linear`; decoder layers usually call the fused `ops.norm_linear` with
the weight directly instead.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.layers.weights import packed_loader, parameter


class Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, *, bias: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = parameter(out_features, in_features, device=device, dtype=dtype)
        self.bias = parameter(out_features, device=device, dtype=dtype) if bias else None

    @property
    def linear_weight(self) -> torch.Tensor:
        """What ops.linear / ops.norm_linear take (an FP8 layer hands its Fp8Weight)."""
        return self.weight

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        return ops.linear(x, self.weight, self.bias, out_dtype=out_dtype)


class PackedLinear(Linear):
    """Several projections of the same input stacked along the output rows."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], *, bias: bool,
                 device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__(in_features, sum(shard_sizes.values()), bias=bias, device=device,
                         dtype=dtype)
        offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            offsets[name] = (start, size)
            start += size
        self.shards = offsets
        shard_ids = tuple(shard_sizes)
        for param in (self.weight, self.bias):
            if param is not None:
                param.weight_loader = packed_loader(offsets)   # type: ignore[attr-defined]
                param.weight_shards = shard_ids                # type: ignore[attr-defined]
