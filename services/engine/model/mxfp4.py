"""MXFP4 weights (OCP microscaling FP4, as gpt-oss checkpoints store their experts),
dequantized at load, or kept packed (`Mxfp4Weight`, engine setting `mxfp4_experts: keep`) for
the fused-MoE kernel to dequantize tile by tile (kernels/fused_moe.py).

A tensor is stored as two: `*_blocks` uint8 [..., G, 16] (32 FP4 E2M1 values per group, two
per byte: the low nibble is the even element, the high nibble the odd one) and `*_scales`
uint8 [..., G] (one E8M0 exponent per group of 32, biased by 127). Element j of group g is
`FP4[code] * 2 ** (scale[g] - 127)`, and the dequantized tensor is [..., G * 32].

FP4 values have at most two significant bits and the scales are powers of two, so every
dequantized value is exact in bfloat16 (and float32) as long as the exponent stays in range:
dequantizing to bf16 at load loses nothing; it costs memory (4.25 bits -> 16 bits per weight)
and the bandwidth of reading 16-bit experts per step (docs/engine-model.md, gpt-oss).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from services.common.errors import ValidationError

if TYPE_CHECKING:
    from services.engine.model.config import ModelConfig

# E2M1 codes 0..15: sign bit 3, then exponent/mantissa (0, 0.5, 1, 1.5, 2, 3, 4, 6)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32          # values per scale
SCALE_BIAS = 127    # E8M0
QUANTIZE_CHUNK = 1 << 24    # values quantize_mxfp4 takes at once


def dequantize_mxfp4(blocks: torch.Tensor, scales: torch.Tensor,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """blocks uint8 [..., G, 16], scales uint8 [..., G] -> [..., G * 32] in `dtype`."""
    if blocks.dtype != torch.uint8 or scales.dtype != torch.uint8:
        raise ValueError(f"MXFP4 blocks and scales must be uint8, got {blocks.dtype} and "
                         f"{scales.dtype}")
    if blocks.shape[-1] != GROUP // 2 or tuple(blocks.shape[:-1]) != tuple(scales.shape):
        raise ValueError(f"MXFP4 blocks {tuple(blocks.shape)} do not match scales "
                         f"{tuple(scales.shape)} (expected blocks [..., G, 16], scales [..., G])")
    lut = torch.tensor(FP4_VALUES, dtype=torch.float32, device=blocks.device)
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).long()   # [..., G, 16, 2]
    values = lut[codes].flatten(-2)                                     # [..., G, 32]
    exponent = scales.to(torch.int32) - SCALE_BIAS
    values = torch.ldexp(values, exponent.unsqueeze(-1).to(torch.float32))
    return values.flatten(-2).to(dtype)                                 # [..., G * 32]


@dataclass(frozen=True, slots=True)
class Mxfp4Weight:
    """Expert matrices [E, N, K] kept as MXFP4: `blocks` uint8 [E, N, K / 2] (a group's 16
    bytes in a row, the even element in the low nibble), `scales` uint8 [E, N, K / 32]; their
    values are computed in `dtype` (the model's). It answers what the experts op asks of a
    weight: `shape` (the logical [E, N, K]), `dim()`, `device`, `is_cuda`, and `[e]` (expert
    e dequantized: the plain-torch path)."""

    blocks: torch.Tensor
    scales: torch.Tensor
    dtype: torch.dtype

    def __post_init__(self) -> None:
        if self.blocks.dtype != torch.uint8 or self.scales.dtype != torch.uint8:
            raise ValueError("MXFP4 blocks and scales are uint8")
        experts, rows, half = self.blocks.shape
        if tuple(self.scales.shape) != (experts, rows, half * 2 // GROUP) or half % (GROUP // 2):
            raise ValueError(f"MXFP4 blocks {tuple(self.blocks.shape)} do not match scales "
                             f"{tuple(self.scales.shape)} (blocks [E, N, K/2], scales "
                             "[E, N, K/32])")

    @property
    def shape(self) -> torch.Size:
        experts, rows, half = self.blocks.shape
        return torch.Size((experts, rows, half * 2))

    def dim(self) -> int:
        return 3

    @property
    def device(self) -> torch.device:
        return self.blocks.device

    @property
    def is_cuda(self) -> bool:
        return self.blocks.is_cuda

    def __getitem__(self, expert: int) -> torch.Tensor:
        rows, half = self.blocks.shape[1:]
        return dequantize_mxfp4(self.blocks[expert].view(rows, half // 16, 16),
                                self.scales[expert], self.dtype)

    def dequantize(self) -> torch.Tensor:
        """All experts, [E, N, K] in `dtype`."""
        experts, rows, half = self.blocks.shape
        return dequantize_mxfp4(self.blocks.view(experts, rows, half // 16, 16), self.scales,
                                self.dtype)


def quantize_mxfp4(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (blocks uint8 [..., K / 2], scales uint8 [..., K / 32]): each group of 32
    scaled by a power of two so its largest magnitude fits E2M1's 6, then every value rounded
    to the nearest E2M1 value (tests and dummy weights; checkpoints come quantized)."""
    if weight.shape[-1] % GROUP:
        raise ValueError(f"MXFP4 needs the last dim to be a multiple of {GROUP}")
    if weight.dim() > 1 and weight.numel() > QUANTIZE_CHUNK:   # one leading slice at a time:
        parts = [quantize_mxfp4(part) for part in weight]   # the temporaries below take ~24
        return (torch.stack([blocks for blocks, _ in parts]),   # bytes a value, 12 GiB for
                torch.stack([scales for _, scales in parts]))   # gpt-oss-20b's gate_up whole
    groups = weight.float().unflatten(-1, (-1, GROUP))                  # [..., G, 32]
    peak = groups.abs().amax(dim=-1).clamp_min(2.0 ** -126)
    exponent = torch.ceil(torch.log2(peak / 6.0)).clamp(-127, 127)
    scaled = groups / torch.exp2(exponent).unsqueeze(-1)
    # the nearest magnitude, a tie to the smaller: the midpoints between E2M1's magnitudes
    # as bucket edges (one int64 per value; a distance to each of the 8 took 8 floats)
    magnitudes = FP4_VALUES[:8]
    edges = torch.tensor([(a + b) / 2 for a, b in itertools.pairwise(magnitudes)],
                         dtype=torch.float32, device=weight.device)
    codes = torch.bucketize(scaled.abs(), edges)
    codes = codes + 8 * (scaled < 0).long() * (codes > 0).long()
    pairs = codes.to(torch.uint8).unflatten(-1, (GROUP // 2, 2))
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).flatten(-2)         # [..., K / 2]
    return blocks, (exponent + SCALE_BIAS).to(torch.uint8)


MXFP4_EXPERTS = ("dequantize", "keep")      # the engine setting's values


def keep_mxfp4_experts(model_config: ModelConfig, config: Mapping[str, Any],
                       setting: str = "keep") -> ModelConfig:
    """The engine setting `mxfp4_experts`: "keep" marks the experts MXFP4 (MoEConfig
    expert_format), for a mixture of experts whose checkpoint stores them so
    (`quantization_config.quant_method: mxfp4`); anything else is refused naming it."""
    if setting not in MXFP4_EXPERTS:
        raise ValidationError(f"mxfp4_experts must be one of {', '.join(MXFP4_EXPERTS)}, "
                              f"not {setting!r}", param="mxfp4_experts")
    if setting == "dequantize":
        return model_config
    quant = config.get("quantization_config")
    method = quant.get("quant_method") if isinstance(quant, Mapping) else None
    if model_config.moe is None or method != "mxfp4":
        raise ValidationError(
            f"mxfp4_experts: keep needs a mixture-of-experts checkpoint whose experts are MXFP4 "
            f"(quantization_config.quant_method mxfp4); {model_config.architecture} here has "
            f"{'experts' if model_config.moe else 'no experts'} and quant_method "
            f"{method or '(none)'}", param="mxfp4_experts")
    return dataclasses.replace(model_config, moe=dataclasses.replace(
        model_config.moe, expert_format="mxfp4"))
