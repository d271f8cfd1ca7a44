"""Gated MLP activations: x [T, 2I] -> act(x[:, :I]) * x[:, I:], gate first as in the fused
gate_up projection.

    silu_and_mul(x)        silu(gate) * up                       (Llama, Qwen, Mistral)
    gelu_tanh_and_mul(x)   gelu(gate, approximate="tanh") * up   (Gemma's gelu_pytorch_tanh)

One read of x and one write of the result (a third of the bytes of the unfused torch code, which
writes act(gate) and reads it back). fp32 arithmetic, one rounding at the store.
`gated_activation` is the same arithmetic for other kernels (skinny_linear fuses it behind the
gate_up projection).
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

GATED_ACTIVATIONS = ("silu", "gelu_tanh")


@triton.jit
def gated_activation(gate, up, ACTIVATION: tl.constexpr):
    """act(gate) * up on fp32 values, ACTIVATION one of GATED_ACTIVATIONS.

    gelu_tanh: 0.5 g (1 + tanh(u)) with u = sqrt(2/pi) (g + 0.044715 g^3), computed as
    g * sigmoid(2u) (the same function: 0.5 (1 + tanh(u)) = 1 / (1 + exp(-2u))), which needs
    one exp and stays exact where 1 + tanh(u) would cancel; exp overflowing to inf gives 0."""
    if ACTIVATION == "gelu_tanh":
        # -2u = -2 sqrt(2/pi) (g + 0.044715 g^3)
        neg_2u = gate * (-1.5957691216057308 - 0.07135481627260025 * gate * gate)
        y = gate / (1.0 + tl.exp(neg_2u)) * up
    else:
        tl.static_assert(ACTIVATION == "silu", "gated_activation: silu or gelu_tanh")
        y = gate / (1.0 + tl.exp(-gate)) * up
    return y


@triton.jit
def _act_and_mul_kernel(
    x_ptr, out_ptr, inter, stride_x, stride_o,
    ACTIVATION: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inter
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + inter + cols, mask=mask, other=0.0).to(tl.float32)
    y = gated_activation(gate, up, ACTIVATION)
    tl.store(out_ptr + row * stride_o + cols, y.to(out_ptr.dtype.element_ty), mask=mask)


def _act_and_mul(x: torch.Tensor, out: torch.Tensor | None, activation: str) -> torch.Tensor:
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
    _act_and_mul_kernel[(num_tokens, cdiv(inter, block))](
        x, out, inter, x.stride(0), out.stride(0),
        ACTIVATION=activation, BLOCK=block,
        num_warps=max(1, min(4, block // 256)),
    )
    return out


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] -> silu(gate) * up [T, I] in x's dtype."""
    return _act_and_mul(x, out, "silu")


def gelu_tanh_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """x [T, 2I] -> gelu_tanh(gate) * up [T, I] in x's dtype (transformers' gelu_pytorch_tanh:
    torch's gelu with approximate="tanh")."""
    return _act_and_mul(x, out, "gelu_tanh")
