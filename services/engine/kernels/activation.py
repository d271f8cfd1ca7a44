"""SiLU-and-mul, the gated MLP's activation: x [T, 2I] -> silu(x[:, :I]) * x[:, I:].

One read of x and one write of the result (a third of the bytes of the unfused torch code, which
writes silu(gate) and reads it back). fp32 arithmetic, one rounding at the store.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_last_dim_contiguous,
    check_out,
    check_rank,
    next_power_of_2,
    sm_count,
)


@triton.jit
def _silu_and_mul_kernel(
    x_ptr, out_ptr, inter, stride_x, stride_o,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] -> [T, I] in x's dtype."""
    check_rank("x", x, 2)
    check_float("x", x)
    check_last_dim_contiguous("x", x)
    num_tokens, width = x.shape
    if width % 2:
        raise ValidationError(f"x: last dim {width} must be even (gate and up halves)")
    inter = width // 2
    if out is None:
        out = torch.empty((num_tokens, inter), dtype=x.dtype, device=x.device)
    else:
        check_out("out", out, (num_tokens, inter), x)
    if num_tokens == 0 or inter == 0:
        return out
    block = min(next_power_of_2(inter), 2048)
    while block > 256 and num_tokens * cdiv(inter, block) < 2 * sm_count(x.device):
        block //= 2  # few rows (decode): narrower programs, so every multiprocessor gets one
    _silu_and_mul_kernel[(num_tokens, cdiv(inter, block))](
        x, out, inter, x.stride(0), out.stride(0),
        BLOCK=block,
        num_warps=max(1, min(4, block // 256)),
    )
    return out
