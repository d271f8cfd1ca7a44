"""FP8 linear layers: e4m3 weights with float32 scales, loaded from an FP8 checkpoint or
quantized from a dense one at load (`quantization: fp8`).

    layer = make_linear(config, K, N, bias=..., device=..., dtype=...)   # Linear or Fp8Linear
    layer.linear_weight        # what ops.linear / ops.norm_linear take (an Fp8Weight here)

Parameters (named as the checkpoints name them, so `load_weights` maps them as any other):
`weight` (e4m3 [N, K]), the scale (`weight_scale_inv` for Hugging Face fp8 checkpoints,
`weight_scale` otherwise: [ceil(N/128), ceil(K/128)] per block, else [N], one per output row),
`input_scale` ([shards], static activations only) and `bias` in the model dtype. A packed
layer (q/k/v, gate/up) loads each shard's rows of every one of them; a per-tensor scale is
written to each row of its shard, so shards with different scales share one rowwise GEMM. An
online scheme expects no scale tensor: the weight loader quantizes each row of the dense
shard it is given (amax / 448) and writes its scales.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from services.common.errors import ManifestError, UnsupportedError
from services.common.quantization import Fp8Scheme
from services.engine.model import ops
from services.engine.model.config import ModelConfig
from services.engine.model.fp8 import (
    FP8_DTYPE,
    FP8_MAX,
    MIN_AMAX,
    Fp8Weight,
    quantize_blocks,
    quantize_rows,
)
from services.engine.model.layers.linear import Linear, PackedLinear
from services.engine.model.layers.weights import (
    WeightShapeError,
    packed_loader,
    parameter,
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


class Fp8Linear(nn.Module):
    def __init__(self, in_features: int, out_features: int, *, bias: bool, scheme: Fp8Scheme,
                 device: torch.device | str, dtype: torch.dtype,
                 shard_sizes: Mapping[str, int] | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.scheme = scheme
        sizes = dict(shard_sizes or {})
        offsets: dict[str | None, tuple[int, int]] = {}
        start = 0
        for name, size in sizes.items():
            offsets[name] = (start, size)
            start += size
        if not offsets:
            offsets[None] = (0, out_features)
        self.shards = offsets
        shard_ids = tuple(offsets)
        bn, bk = scheme.block
        if scheme.weights == "block":
            bad = [name for name, (s, n) in offsets.items()
                   if name is not None and (s % bn or n % bn)]
            if bad:
                raise UnsupportedError(
                    f"{scheme.name}: the {bad[0]} shard ({sizes[bad[0]]} rows) does not fill "
                    f"whole {bn}-row weight blocks", param="weight_block_size")
            scale_shape: tuple[int, ...] = (_cdiv(out_features, bn), _cdiv(in_features, bk))
        else:
            scale_shape = (out_features,)
        self.weight = parameter(out_features, in_features, device=device, dtype=FP8_DTYPE,
                                loader=self._load_weight, shards=shard_ids)
        self.scale_name = scheme.scale_name
        scale = parameter(*scale_shape, device=device, dtype=torch.float32,
                          loader=self._load_scale, shards=shard_ids if scheme.stored else ())
        scale.data.fill_(1.0)
        setattr(self, self.scale_name, scale)
        self.input_scale = None
        if scheme.activations == "static":
            self.input_scale = parameter(len(offsets), device=device, dtype=torch.float32,
                                         loader=self._load_input_scale, shards=shard_ids)
        self.bias = parameter(out_features, device=device, dtype=dtype) if bias else None
        self._dense: torch.Tensor | None = None   # CPU only: the dequantized weight
        if self.bias is not None and sizes:
            self.bias.weight_loader = packed_loader(  # type: ignore[attr-defined]
                {name: span for name, span in offsets.items() if name is not None})
            self.bias.weight_shards = shard_ids       # type: ignore[attr-defined]

    @property
    def scale(self) -> torch.Tensor:
        return self._parameters[self.scale_name]   # type: ignore[return-value]

    @property
    def linear_weight(self) -> Fp8Weight:
        if self.weight.device.type != "cpu":
            return Fp8Weight(self.weight, self.scale, self.scheme, self.input_scale)
        # the CPU has no FP8 arithmetic: dequantize once (the values are exactly the FP8
        # weight's) instead of converting every weight on every step
        if self._dense is None:
            weight = Fp8Weight(self.weight, self.scale, self.scheme, self.input_scale)
            self._dense = weight.dequantize(torch.float32)
        return Fp8Weight(self.weight, self.scale, self.scheme, self.input_scale, self._dense)

    def forward(self, x: torch.Tensor, out_dtype: torch.dtype | None = None) -> torch.Tensor:
        """x [T, K] -> [T, N]."""
        return ops.linear(x, self.linear_weight, self.bias, out_dtype=out_dtype)

    # -- loading ----------------------------------------------------------------------------
    def _span(self, shard: str | None) -> tuple[int, int]:
        if shard not in self.shards:
            raise KeyError(f"no shard {shard!r} (shards: {', '.join(map(str, self.shards))})")
        return self.shards[shard]

    def _load_weight(self, param: nn.Parameter, tensor: torch.Tensor, shard: str | None
                     ) -> None:
        self._dense = None
        start, size = self._span(shard)
        if tuple(tensor.shape) != (size, self.in_features):
            raise WeightShapeError(tuple(tensor.shape), (size, self.in_features))
        if tensor.dtype == FP8_DTYPE:
            if not self.scheme.stored:
                raise ManifestError("an e4m3 tensor in a checkpoint without a quantization_"
                                    "config (its scales are unknown)", param="weight")
            param.data[start:start + size].copy_(tensor)
            return
        if self.scheme.stored or not tensor.dtype.is_floating_point:
            raise ManifestError(f"a {tensor.dtype} tensor where the {self.scheme.name} "
                                "checkpoint stores float8_e4m3fn", param="weight")
        self.quantize_into(tensor.to(param.device), start)

    def quantize_into(self, dense: torch.Tensor, start: int = 0) -> None:
        """Quantize dense rows [start, start + len(dense)) with this layer's weight layout."""
        rows = dense.shape[0]
        self._dense = None
        if self.scheme.weights == "block":
            q, scale = quantize_blocks(dense, self.scheme.block)
            bn = self.scheme.block[0]
            self.scale.data[start // bn:start // bn + scale.shape[0]].copy_(scale)
        elif self.scheme.weights == "tensor":
            amax = dense.float().abs().amax().clamp(min=MIN_AMAX) / FP8_MAX
            q = (dense.float() / amax).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
            self.scale.data[start:start + rows].copy_(amax.expand(rows))
        else:
            q, scale = quantize_rows(dense)
            self.scale.data[start:start + rows].copy_(scale)
        self.weight.data[start:start + rows].copy_(q)

    def _load_scale(self, param: nn.Parameter, tensor: torch.Tensor, shard: str | None
                    ) -> None:
        self._dense = None
        start, size = self._span(shard)
        values = tensor.to(device=param.device, dtype=torch.float32)
        if self.scheme.weights == "block":
            bn, bk = self.scheme.block
            expected = (_cdiv(size, bn), _cdiv(self.in_features, bk))
            if tuple(values.shape) != expected:
                raise WeightShapeError(tuple(values.shape), expected)
            param.data[start // bn:start // bn + expected[0]].copy_(values)
        elif values.numel() == 1:          # per tensor: every row of the shard
            param.data[start:start + size].copy_(values.reshape(1).expand(size))
        elif values.numel() == size and values.dim() <= 2:   # per channel: [N] or [N, 1]
            param.data[start:start + size].copy_(values.reshape(size))
        else:
            raise WeightShapeError(tuple(values.shape), (size, 1))

    def _load_input_scale(self, param: nn.Parameter, tensor: torch.Tensor, shard: str | None
                          ) -> None:
        self._dense = None
        if tensor.numel() != 1:
            raise WeightShapeError(tuple(tensor.shape), (1,))
        index = list(self.shards).index(shard)
        param.data[index] = tensor.reshape(()).to(torch.float32)


def make_linear(config: ModelConfig, in_features: int, out_features: int, *, bias: bool,
                device: torch.device | str, dtype: torch.dtype) -> Linear | Fp8Linear:
    """A decoder projection: dense, or FP8 when the model's config carries a scheme."""
    if config.quantization is None:
        return Linear(in_features, out_features, bias=bias, device=device, dtype=dtype)
    return Fp8Linear(in_features, out_features, bias=bias, scheme=config.quantization,
                     device=device, dtype=dtype)


def make_packed_linear(config: ModelConfig, in_features: int, shard_sizes: dict[str, int], *,
                       bias: bool, device: torch.device | str, dtype: torch.dtype
                       ) -> PackedLinear | Fp8Linear:
    """q/k/v or gate/up stacked along the rows: dense, or FP8 with the model's scheme."""
    if config.quantization is None:
        return PackedLinear(in_features, shard_sizes, bias=bias, device=device, dtype=dtype)
    return Fp8Linear(in_features, sum(shard_sizes.values()), bias=bias,
                     scheme=config.quantization, device=device, dtype=dtype,
                     shard_sizes=shard_sizes)
