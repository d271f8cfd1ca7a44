"""Parameters that carry their own weight loader.

Every parameter of a shared layer is made by `parameter(...)`, which attaches
`param.weight_loader(param, tensor, shard)` and `param.weight_shards` (the shard ids a
checkpoint must supply, `(None,)` for a tensor loaded whole). The model loader
(`model/weights.py`) maps each checkpoint tensor to a (parameter, shard) and calls that
parameter's loader; fused parameters (q/k/v rows of `qkv_proj`, gate/up rows of
`gate_up_proj`) copy each shard into its rows, and norm weights stored with an offset
(Gemma's `1 + w`) add it. A later tensor-parallel loader takes its rank's slice here too.
Loaders raise `WeightShapeError`; the model loader names the tensor and file.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

WeightLoader = Callable[[nn.Parameter, torch.Tensor, "str | None"], None]


class WeightShapeError(ValueError):
    """A checkpoint tensor does not have the shape its destination expects."""

    def __init__(self, got: tuple[int, ...], expected: tuple[int, ...]) -> None:
        super().__init__(f"shape {got}, the config implies {expected}")
        self.got = got
        self.expected = expected


def _check_shape(tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != tuple(expected):
        raise WeightShapeError(tuple(tensor.shape), tuple(expected))


def load_whole(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
    """The default loader: the tensor is the whole parameter."""
    _check_shape(tensor, tuple(param.shape))
    param.data.copy_(tensor)


def packed_loader(shards: Mapping[str, tuple[int, int]]) -> WeightLoader:
    """Rows [start, start + size) of the parameter come from shard `name` (dim 0)."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        if shard is None or shard not in shards:
            raise KeyError(f"no shard {shard!r} (shards: {', '.join(shards)})")
        start, size = shards[shard]
        _check_shape(tensor, (size, *param.shape[1:]))
        param.data[start:start + size].copy_(tensor)

    return load


def leading_block_loader(shape: tuple[int, ...]) -> WeightLoader:
    """The tensor (of `shape`) fills the parameter's leading block, [:rows] or [:rows, :cols];
    the rest of the parameter is zeroed (padding)."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        _check_shape(tensor, shape)
        block = tuple(slice(0, n) for n in shape)
        param.data.zero_()
        param.data[block].copy_(tensor)

    return load


def offset_loader(offset: float) -> WeightLoader:
    """Stores `tensor + offset`, computed in float32 (Gemma's norms scale by 1 + w)."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        _check_shape(tensor, tuple(param.shape))
        param.data.copy_(tensor.float() + offset)

    return load


def parameter(*shape: int, device: torch.device | str, dtype: torch.dtype,
              loader: WeightLoader = load_whole,
              shards: tuple[str | None, ...] = (None,),
              covers: Mapping[str, tuple[str | None, ...]] | None = None) -> nn.Parameter:
    """An uninitialised, frozen parameter with its loader and the shards it expects.

    `covers`: checkpoint shards that fill several expected shards at once (a fused-experts
    tensor fills every expert's gate and up rows: {"fused": all of them})."""
    param = nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)
    param.weight_loader = loader            # type: ignore[attr-defined]
    param.weight_shards = shards            # type: ignore[attr-defined]
    param.weight_shard_covers = dict(covers or {})   # type: ignore[attr-defined]
    return param


def weight_loader(param: nn.Parameter) -> WeightLoader:
    return getattr(param, "weight_loader", load_whole)


def weight_shards(param: nn.Parameter) -> tuple[str | None, ...]:
    return getattr(param, "weight_shards", (None,))


def covered_shards(param: nn.Parameter, shard: str | None) -> tuple[str | None, ...]:
    """The expected shards one checkpoint tensor for `shard` fills (itself, or what a fused
    shard covers)."""
    covers: Mapping[str, tuple[str | None, ...]] = getattr(param, "weight_shard_covers", {})
    return covers.get(shard, (shard,)) if shard is not None else (shard,)
