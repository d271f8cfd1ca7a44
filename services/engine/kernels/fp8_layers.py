"""FP8 linear layers on CUDA: the ops `fp8_linear` and `fp8_norm_linear` (model/fp8.py).

    fp8_linear(x [M, K], weight: Fp8Weight, bias=None, *, out_dtype=None) -> [M, N]
    fp8_norm_linear(x, residual, norm_weight, eps, weight: Fp8Weight, bias=None,
                    activation=None) -> (y, new_residual)

One row (a batch-1 decode step, `MAX_ROWS`): skinny_linear.py's one-row kernel with
`W_SCALE` set, so the same fused norm, gated activation (SiLU, GELU-tanh), fp32 output and
PDL: it streams e4m3 weight rows (half the bytes of bf16, which is the whole cost at batch 1)
and dequantizes them in registers, the row scale applied once to the dot product (block-wise
weights: BLOCK_K = 128, each K step's partial sums times that block's scale). The activation
row is not quantized there (W8A16: the skinny path is the more exact one). With
`HELIOS_FP8_SKINNY=tensor-cores` (or a plan with block_m > 1) up to 16 rows (`DOT_ROWS`: batch-1
to batch-16 decode, speculative verification) run skinny_linear.py's tl.dot kernel instead,
the e4m3 tiles converted to the activations' dtype for the MMA, the same scales applied (W8A16
too, the weights read once for the 16 rows, no activation quantization). Measured slower at
batch 1 on an H100 (126 against 216 tok/s, RESULTS.md 2026-12-06 fifth session): opt-in.

More rows: the activations are quantized by `fp8_quant.py` (fused with the norm for
`fp8_norm_linear`) and multiplied by `fp8_gemm.py` (torch._scaled_mm or the Triton GEMM for
rowwise scales, the Triton block-scaled GEMM for 128x128 blocks); a gated activation then runs
the activation kernel on the GEMM's output.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from services.common.errors import ValidationError
from services.engine.kernels.activation import gelu_tanh_and_mul, silu_and_mul
from services.engine.kernels.common import (
    check_float,
    check_gated_rows,
    check_last_dim_contiguous,
    check_norm_inputs,
    sm_count,
)
from services.engine.kernels.fp8_gemm import block_mm, rowwise_mm
from services.engine.kernels.fp8_quant import norm_quantize_fp8, quantize_fp8
from services.engine.kernels.skinny_linear import (
    SCALE_BLOCK,
    LinearPlan,
    check_activation,
    launch,
    plan_linear,
    plan_rows,
)
from services.engine.model.fp8 import FP8_DTYPE, Fp8Weight

MAX_ROWS = 1
BLOCK = SCALE_BLOCK       # 128 x 128 weight blocks
# HELIOS_FP8_SKINNY=tensor-cores: batch 1 through skinny_linear's tl.dot kernel (e4m3 tiles
# converted to the activations' dtype for the MMA) instead of the one-row CUDA-core kernel.
# Slower at batch 1 on an H100 (RESULTS.md, 2026-12-06 fifth session): opt-in.
TENSOR_CORES = os.environ.get("HELIOS_FP8_SKINNY", "").strip().lower() == "tensor-cores"
DOT_ROWS = 16    # with TENSOR_CORES, up to this many rows take it too (W8A16, one weight read)


def _skinny_rows() -> int:
    """The most rows the W8A16 kernels take; more are quantized for the FP8 GEMM."""
    return DOT_ROWS if TENSOR_CORES else MAX_ROWS


def _check(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None) -> None:
    if x.dim() != 2:
        raise ValidationError(f"x: expected 2 dims, got shape {tuple(x.shape)}")
    check_float("x", x)
    check_last_dim_contiguous("x", x)
    w = weight.qweight
    if w.dtype != FP8_DTYPE or w.dim() != 2 or w.stride(-1) != 1:
        raise ValidationError(f"weight: expected a row-major e4m3 matrix, got {w.dtype} "
                              f"{tuple(w.shape)}")
    if w.shape[1] != x.shape[1]:
        raise ValidationError(f"weight {tuple(w.shape)} does not take rows of {x.shape[1]}")
    if weight.scale.dtype != torch.float32 or not weight.scale.is_contiguous():
        raise ValidationError("weight scale: expected contiguous float32")
    if bias is not None and (bias.shape != (w.shape[0],) or bias.stride(0) != 1):
        raise ValidationError(f"bias: expected ({w.shape[0]},) contiguous, got "
                              f"{tuple(bias.shape)}")


def skinny_plan(weight: Fp8Weight, n_out: int, rows: int, device: torch.device,
                gated: bool) -> LinearPlan:
    plan = plan_linear(n_out, weight.shape[1], rows, sm_count(device), gated)
    if weight.block:   # one column of weight blocks per K step
        return LinearPlan(plan.block_n, BLOCK, plan.num_warps)
    return plan


def dot_plan(weight: Fp8Weight, n_out: int, gated: bool, normed: bool) -> LinearPlan:
    """The tensor-core variant's tiling: skinny_linear.plan_rows for one-byte weights, K
    steps inside one 128-wide scale block for block-wise weights."""
    plan = plan_rows(n_out, weight.shape[1], gated, normed, elem_bytes=1)
    if weight.block and plan.block_k > BLOCK:
        plan = dataclasses.replace(plan, block_k=BLOCK)
    return plan


def _skinny(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
            eps: float, weight: Fp8Weight, bias: torch.Tensor | None, out: torch.Tensor,
            residual_out: torch.Tensor | None, activation: str | None,
            plan: LinearPlan | None = None) -> None:
    """skinny_linear's kernels on e4m3 weights: the tl.dot one (e4m3 tiles) where the plan's
    block_m > 1 or HELIOS_FP8_SKINNY=tensor-cores, else the one-row one."""
    n_out = out.shape[1]
    if plan is None:
        gated = activation is not None
        plan = (dot_plan(weight, n_out, gated, norm_weight is not None) if TENSOR_CORES
                else skinny_plan(weight, n_out, x.shape[0], x.device, gated))
    launch(x, residual, norm_weight, eps, weight.qweight, bias, out, residual_out, activation,
           plan, scale=weight.scale, scale_kind="block" if weight.block else "channel")


def _gemm(q: torch.Tensor, scales: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None,
          out_dtype: torch.dtype) -> torch.Tensor:
    if weight.block:
        return block_mm(q, scales, weight.qweight, weight.scale, bias, out_dtype)
    return rowwise_mm(q, scales, weight.qweight, weight.scale, bias, out_dtype)


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None, *,
               out_dtype: torch.dtype | None = None, plan: LinearPlan | None = None
               ) -> torch.Tensor:
    """x [M, K] @ W^T + bias -> [M, N] in out_dtype (x's by default)."""
    _check(x, weight, bias)
    out_dtype = out_dtype or x.dtype
    if x.shape[0] <= _skinny_rows() or plan is not None:
        out = torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype, device=x.device)
        _skinny(x, None, None, 0.0, weight, bias, out, None, None, plan)
        return out
    scheme = weight.scheme
    q, scales = quantize_fp8(x, scheme.activations, scheme.group_size, weight.input_scale)
    return _gemm(q, scales, weight, bias, out_dtype)


def fp8_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                    eps: float, weight: Fp8Weight, bias: torch.Tensor | None = None,
                    activation: str | None = None, *, plan: LinearPlan | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x [+ residual]) @ W^T + b, then act(gate) * up with a gated activation;
    the new residual)."""
    activation = check_activation(activation)
    _check(x, weight, bias)
    rows = x.shape[0]
    check_norm_inputs(x, residual, norm_weight)
    n_rows = weight.shape[0]
    check_gated_rows(n_rows, activation)
    if rows > _skinny_rows() and plan is None:
        scheme = weight.scheme
        q, scales, new_residual = norm_quantize_fp8(x, residual, norm_weight, eps,
                                                    scheme.activations, scheme.group_size,
                                                    weight.input_scale)
        y = _gemm(q, scales, weight, bias, x.dtype)
        if activation == "silu":
            y = silu_and_mul(y)
        elif activation == "gelu_tanh":
            y = gelu_tanh_and_mul(y)
        return y, new_residual
    n_out = n_rows // 2 if activation else n_rows
    out = torch.empty((rows, n_out), dtype=x.dtype, device=x.device)
    residual_out = None
    if residual is not None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    _skinny(x, residual, norm_weight, eps, weight, bias, out, residual_out, activation, plan)
    return out, (residual_out if residual_out is not None else x)
