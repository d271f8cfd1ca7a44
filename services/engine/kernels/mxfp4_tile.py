"""An MXFP4 weight tile dequantized in registers, for kernels that read packed weights (the
fused-MoE GEMMs with gpt-oss's experts kept MXFP4: fused_moe.py).

    tile = mxfp4_tile(packed, scales, BLOCK_K, BLOCK_N)   # float32 [BLOCK_K, BLOCK_N], exact

OCP MXFP4 (model/mxfp4.py): two E2M1 codes a byte (the even element in the low nibble), one
E8M0 scale per 32 values. Every value is an FP4 value times a power of two, so the float32 tile
is exact, and so is its cast to bf16 or fp16 for the tensor-core dot.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def e2m1(code):
    """FP4 E2M1 codes (int, 0..15) -> float32: sign bit 3; magnitudes 0, 0.5, 1, 1.5, 2, 3,
    4, 6 built as float bits (exponent e - 1 + 127, one mantissa bit)."""
    code = code.to(tl.int32)
    mag = code & 7
    e = mag >> 1
    bits = tl.where(mag >= 2, ((e + 126) << 23) | ((mag & 1) << 22),
                    tl.where(mag == 1, 126 << 23, 0))
    return (bits | ((code >> 3) << 31)).to(tl.float32, bitcast=True)


@triton.jit
def mxfp4_tile(packed, scales, BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr):
    """An MXFP4 weight tile -> float32 [BLOCK_K, BLOCK_N]: packed uint8 [BLOCK_K / 2,
    BLOCK_N] (element 2j of the K range in byte j's low nibble, 2j + 1 in its high one),
    scales uint8 [BLOCK_K / 32, BLOCK_N] (E8M0: 2 ** (s - 127), as float bits; 0 is
    2 ** -127, a denormal). Exact: FP4 values times powers of two."""
    values = tl.join(e2m1(packed & 0xF), e2m1(packed >> 4))         # [K/2, N, 2]
    values = tl.reshape(tl.permute(values, (0, 2, 1)), (BLOCK_K, BLOCK_N))
    scale = (scales.to(tl.int32) << 23).to(tl.float32, bitcast=True)
    scale = tl.where(scales == 0, 5.877471754111438e-39, scale)
    values = tl.reshape(values, (BLOCK_K // 32, 32, BLOCK_N)) * scale[:, None, :]
    return tl.reshape(values, (BLOCK_K, BLOCK_N))
