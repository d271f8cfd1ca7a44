"""Linear layers: a weight [N, K] (+ bias [N]) the ops read, with per-parameter loaders.

`Linear` is loaded whole; `PackedLinear` stacks several checkpoint projections along its rows
(q/k/v into `qkv_proj`, gate/up into `gate_up_proj`) and loads each shard into its rows. The
layer's forward is `ops.linear`; decoder layers usually call the fused `ops.norm_linear` with
the weight directly instead.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.layers.weights import (
    leading_block_loader,
    packed_loader,
    parameter,
)


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
    """Several projections of the same input stacked along the output rows.

    `slot`: each shard takes rows [start, start + size) of a block of `slot(size)` rows, the
    rest of the block zeros (the vision MLP's gate and up padded to aligned widths); by
    default the blocks are the shards themselves."""

    def __init__(self, in_features: int, shard_sizes: dict[str, int], *, bias: bool,
                 device: torch.device | str, dtype: torch.dtype,
                 slot: Callable[[int], int] | None = None) -> None:
        slots = {name: slot(size) if slot else size for name, size in shard_sizes.items()}
        super().__init__(in_features, sum(slots.values()), bias=bias, device=device,
                         dtype=dtype)
        offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, size in shard_sizes.items():
            offsets[name] = (start, size)
            start += slots[name]
        self.shards = offsets
        shard_ids = tuple(shard_sizes)
        for param in (self.weight, self.bias):
            if param is not None:
                if slots != shard_sizes:      # padding rows no shard writes
                    param.data.zero_()
                param.weight_loader = packed_loader(offsets)   # type: ignore[attr-defined]
                param.weight_shards = shard_ids                # type: ignore[attr-defined]


class PaddedLinear(Linear):
    """A projection stored with zero padding: weight [padded_out, padded_in] (bias
    [padded_out]), the checkpoint's [out_features, in_features] in the leading block. Extra
    input features meet zero weights; extra outputs are zero (the bias's padding too). The
    vision MLPs pad their intermediate width this way."""

    def __init__(self, in_features: int, out_features: int, *, bias: bool,
                 device: torch.device | str, dtype: torch.dtype, padded_in: int | None = None,
                 padded_out: int | None = None) -> None:
        padded_in, padded_out = padded_in or in_features, padded_out or out_features
        if padded_in < in_features or padded_out < out_features:
            raise ValueError(f"padding ({padded_out}, {padded_in}) below the projection's "
                             f"({out_features}, {in_features})")
        super().__init__(padded_in, padded_out, bias=bias, device=device, dtype=dtype)
        # the loaders zero the padding as they fill the block
        self.weight.weight_loader = leading_block_loader(   # type: ignore[attr-defined]
            (out_features, in_features))
        if self.bias is not None:
            self.bias.weight_loader = leading_block_loader(     # type: ignore[attr-defined]
                (out_features,))
