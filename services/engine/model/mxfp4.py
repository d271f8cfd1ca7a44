"""MXFP4 weights (OCP microscaling FP4, as gpt-oss checkpoints store their experts),
dequantized at load.

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

import torch

# E2M1 codes 0..15: sign bit 3, then exponent/mantissa (0, 0.5, 1, 1.5, 2, 3, 4, 6)
FP4_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
GROUP = 32          # values per scale
SCALE_BIAS = 127    # E8M0


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
