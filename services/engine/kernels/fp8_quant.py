"""FP8 activation quantization: bf16/fp16/fp32 rows -> e4m3 rows and float32 scales, alone or
fused into the RMSNorm in front of a projection.

    quantize_fp8(x [M, K], kind, group=128, input_scale=None) -> (q e4m3 [M, K], scales)
    norm_quantize_fp8(x, residual | None, norm_weight, eps, kind, group=128, input_scale=None)
        -> (q, scales, new_residual)

`kind` is the scheme's activation quantization (services/common/quantization.py):
"token" (one scale per row: amax / 448, scales [M, 1]), "group" (one per row and 128-column
group, scales [M, ceil(K/128)]: the Hugging Face block-wise fp8 format), "static" (the
largest `input_scale`, scales [1, 1]; nothing reduced). Values are divided by the scale
(round-to-nearest division, as the reference's), clamped to +-448 and rounded to nearest
even (`round_e4m3`), then cast: the e4m3 bits equal `model.fp8.quantize_activation`'s.

The fused kernel is the norm kernel's arithmetic (the residual sum rounded to the input dtype
and written back by the same program, the norm in float32, `weight * normed` rounded to the
input dtype as the reference does), then the quantization of the normed row: a prefill step's
norm writes its e4m3 row directly (1 byte per element instead of 2, and no separate
quantization kernel reading the row back). One program per row. A row of up to
WHOLE_ROW_MAX columns is loaded once and every pass (the sum of squares, the norm, the
amax, the codes) runs in registers (`HELIOS_FP8_QUANT_ROW=chunked`: the chunked passes
anyway, for A/B runs); a longer one loops over K in BLOCK_K chunks, a load per
chunk and pass (the row stays in L1/L2 between the passes, but each pass waits on its loads:
on an H100 the chunked kernel took 7.1 us a call at 256 rows of a Qwen3-8B step, RESULTS.md
2026-12-07, fifteenth session).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import (
    check_float,
    check_last_dim_contiguous,
    check_norm_inputs,
    check_rank,
    env_choice,
    next_power_of_2,
)
from services.engine.kernels.norm import row_rstd

FP8_MAX = tl.constexpr(448.0)
# rows up to this many columns (a power of two) are quantized from one load (_quantize_whole_row):
# every dense model's hidden and intermediate sizes up to Llama-3.1-8B's 14,336
WHOLE_ROW_MAX = 16384
MIN_AMAX = tl.constexpr(1e-10)
KINDS = ("token", "group", "static")


@triton.jit
def round_e4m3(v):
    """v (float32) clamped to +-448 and rounded to the nearest e4m3 value (ties to even),
    so the cast that follows is exact. Normal range (|v| >= 2^-6): integer rounding of the
    float32 bits to 3 mantissa bits (add 0x7FFFF plus the lowest kept bit, clear the 20 low
    bits; a carry moves into the exponent as it should); below, e4m3's subnormals (a fixed
    2^-9 step): adding and subtracting 1.5 * 2^14 rounds to that step (an add and a
    subtract, nothing Triton's default FMA contraction can fuse). The same bits as a
    round-to-nearest-even cast (checked against torch's over every e4m3 midpoint); Triton
    3.6's interpreter rounds its own cast wrongly (124.3 -> 64), this does not depend on it."""
    v = tl.clamp(v, -FP8_MAX, FP8_MAX)
    bits = v.to(tl.int32, bitcast=True)
    bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -1048576
    high = bits.to(tl.float32, bitcast=True)
    low = tl.abs((v + 24576.0) - 24576.0)
    # v's sign bit put back by bits: a value that rounds to zero keeps it (-0.0, as torch's
    # cast gives; a compiled negation is 0 - x, which makes +0.0)
    sign = (v.to(tl.int32, bitcast=True) >> 31) << 31
    low = (low.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)
    return tl.where(tl.abs(v) < 0.015625, low, high)


@triton.jit
def cast_for_cache(x, dtype: tl.constexpr):
    """x as a KV cache of `dtype` stores it: e4m3 rounded by `round_e4m3` (scale 1: a
    caller with per-head scales divides first), other dtypes a plain cast."""
    if dtype == tl.float8e4nv:
        return round_e4m3(x.to(tl.float32)).to(dtype)
    return x.to(dtype)


@triton.jit
def apply_norm(h, g, rstd, act_dtype):
    """The norm kernel's rounding of g * h * rstd (h the row or its residual sum, float32):
    the normed value and its product with the gain each rounded to the input dtype."""
    return (g * (h * rstd).to(act_dtype).to(tl.float32)).to(act_dtype).to(tl.float32)


@triton.jit
def static_scale(static_ptr, num_static, BLOCK_S: tl.constexpr):
    """The largest of the checkpoint's static input scales."""
    ss = tl.arange(0, BLOCK_S)
    return tl.max(tl.load(static_ptr + ss, mask=ss < num_static, other=0.0), axis=0)


@triton.jit
def load_normed(x_row, r_row, g_ptr, k, k_mask, rstd, act_dtype, NORM: tl.constexpr,
                 RESIDUAL: tl.constexpr):
    """The value quantized at columns k: x, or rms_norm(x + residual) * g (float32)."""
    h = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
    if NORM:
        if RESIDUAL:
            r = tl.load(r_row + k, mask=k_mask, other=0.0).to(tl.float32)
            h = (h + r).to(act_dtype).to(tl.float32)
        g = tl.load(g_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        h = apply_norm(h, g, rstd, act_dtype)
    return h


@triton.jit
def _quantize_whole_row(x_row, r_row, g_ptr, q_row, s_row, static_ptr, res_out_row, k_dim,
                        num_static, eps, KIND: tl.constexpr, NORM: tl.constexpr,
                        RESIDUAL: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
                        BLOCK_S: tl.constexpr):
    """_quantize_kernel's work on a row that fits one BLOCK_K: the row, its residual and the
    norm weight loaded once, together, then the sum, the norm, the amax and the codes in
    registers (the chunked passes wait on a load each: 12 in a row for the norm + token
    quantization of 4096 columns). The same arithmetic as the chunked passes, but for the
    order of the float32 sum of squares."""
    act_dtype = x_row.dtype.element_ty
    k = tl.arange(0, BLOCK_K)
    k_mask = k < k_dim
    h = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
    if NORM:
        g = tl.load(g_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            r = tl.load(r_row + k, mask=k_mask, other=0.0).to(tl.float32)
            summed = (h + r).to(act_dtype)
            tl.store(res_out_row + k, summed, mask=k_mask)
            h = summed.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(h * h, axis=0) / k_dim + eps)
        h = apply_norm(h, g, rstd, act_dtype)
    if KIND == "group":
        groups = tl.reshape(h, [BLOCK_K // GROUP, GROUP])
        amax = tl.maximum(tl.max(tl.abs(groups), axis=1), MIN_AMAX)
        scale = tl.div_rn(amax, FP8_MAX)
        q = tl.reshape(round_e4m3(tl.div_rn(groups, scale[:, None])), [BLOCK_K])
        gs = tl.arange(0, BLOCK_K // GROUP)
        tl.store(s_row + gs, scale, mask=gs * GROUP < k_dim)
    else:
        if KIND == "static":
            scale = static_scale(static_ptr, num_static, BLOCK_S)
        else:
            amax = tl.maximum(tl.max(tl.abs(h), axis=0), MIN_AMAX)
            scale = tl.div_rn(amax, FP8_MAX)
            tl.store(s_row, scale)
        q = round_e4m3(tl.div_rn(h, scale))
    tl.store(q_row + k, q.to(q_row.dtype.element_ty), mask=k_mask)


@triton.jit
def _quantize_kernel(
    x_ptr, res_ptr, g_ptr, q_ptr, s_ptr, static_ptr, res_out_ptr,
    k_dim, num_static, eps,
    stride_x, stride_r, stride_q, stride_s, stride_ro,
    KIND: tl.constexpr, NORM: tl.constexpr, RESIDUAL: tl.constexpr,
    BLOCK_K: tl.constexpr, GROUP: tl.constexpr, BLOCK_S: tl.constexpr,
    WHOLE_ROW: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    act_dtype = x_ptr.dtype.element_ty
    x_row = x_ptr + row * stride_x
    r_row = res_ptr + row * stride_r
    q_row = q_ptr + row * stride_q
    kk = tl.arange(0, BLOCK_K)
    if WHOLE_ROW:   # BLOCK_K >= k_dim: one load of the row, every pass in registers
        _quantize_whole_row(x_row, r_row, g_ptr, q_row, s_ptr + row * stride_s, static_ptr,
                            res_out_ptr + row * stride_ro, k_dim, num_static, eps, KIND, NORM,
                            RESIDUAL, BLOCK_K, GROUP, BLOCK_S)
        return
    rstd = 1.0
    if NORM:
        rstd = row_rstd(x_row, r_row, res_out_ptr + row * stride_ro, k_dim, eps, True,
                        RESIDUAL, BLOCK_K)
    if KIND == "group":
        # BLOCK_K == GROUP: one chunk is one group
        for k0 in range(0, k_dim, GROUP):
            k = k0 + kk
            k_mask = k < k_dim
            h = load_normed(x_row, r_row, g_ptr, k, k_mask, rstd, act_dtype, NORM, RESIDUAL)
            amax = tl.maximum(tl.max(tl.abs(h), axis=0), MIN_AMAX)
            scale = tl.div_rn(amax, FP8_MAX)
            q = round_e4m3(tl.div_rn(h, scale))
            tl.store(q_row + k, q.to(q_ptr.dtype.element_ty), mask=k_mask)
            tl.store(s_ptr + row * stride_s + k0 // GROUP, scale)
    else:
        if KIND == "static":
            scale = static_scale(static_ptr, num_static, BLOCK_S)
        else:
            amax_vec = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, k_dim, BLOCK_K):
                k = k0 + kk
                k_mask = k < k_dim
                h = load_normed(x_row, r_row, g_ptr, k, k_mask, rstd, act_dtype, NORM,
                                 RESIDUAL)
                amax_vec = tl.maximum(amax_vec, tl.abs(h))
            amax = tl.maximum(tl.max(amax_vec, axis=0), MIN_AMAX)
            scale = tl.div_rn(amax, FP8_MAX)
            tl.store(s_ptr + row * stride_s, scale)
        for k0 in range(0, k_dim, BLOCK_K):
            k = k0 + kk
            k_mask = k < k_dim
            h = load_normed(x_row, r_row, g_ptr, k, k_mask, rstd, act_dtype, NORM, RESIDUAL)
            q = round_e4m3(tl.div_rn(h, scale))
            tl.store(q_row + k, q.to(q_ptr.dtype.element_ty), mask=k_mask)


def _check(x: torch.Tensor, kind: str, group: int, input_scale: torch.Tensor | None) -> None:
    check_rank("x", x, 2)
    check_float("x", x)
    check_last_dim_contiguous("x", x)
    if kind not in KINDS:
        raise ValidationError(f"kind: expected one of {KINDS}, got {kind!r}")
    if kind == "group" and (group < 16 or group & (group - 1)):
        raise ValidationError(f"group: expected a power of two >= 16, got {group}")
    if kind == "static" and (input_scale is None or input_scale.dtype != torch.float32
                             or input_scale.dim() != 1 or not input_scale.is_contiguous()):
        raise ValidationError("static quantization needs a contiguous float32 input_scale [S]")


def static_scale_args(kind: str, input_scale: torch.Tensor | None, placeholder: torch.Tensor
                      ) -> tuple[torch.Tensor, int, int]:
    """(pointer, count, BLOCK_S) of a kernel's static input scales: the checkpoint's [S] for
    KIND "static"; else `placeholder` with count and block 1, so the unused arguments never
    vary with the step's rows or the weight's shape (each new value would be a new variant)."""
    if kind == "static":
        assert input_scale is not None
        return input_scale, input_scale.numel(), next_power_of_2(max(1, input_scale.numel()))
    return placeholder, 1, 1


def _launch(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
            eps: float, kind: str, group: int, input_scale: torch.Tensor | None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    _check(x, kind, group, input_scale)
    rows, k_dim = x.shape
    q = torch.empty((rows, k_dim), dtype=torch.float8_e4m3fn, device=x.device)
    if kind == "group":
        scales = torch.empty((rows, -(-k_dim // group)), dtype=torch.float32, device=x.device)
    elif kind == "token":
        scales = torch.empty((rows, 1), dtype=torch.float32, device=x.device)
    else:
        assert input_scale is not None
        scales = input_scale.amax().reshape(1, 1)
    res_out = None
    if residual is not None:
        res_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if rows == 0:
        return q, scales, res_out
    whole_row = (next_power_of_2(k_dim) <= WHOLE_ROW_MAX
                 and env_choice("HELIOS_FP8_QUANT_ROW", ("whole", "chunked")) == "whole")
    if whole_row:
        block_k = max(next_power_of_2(k_dim), group if kind == "group" else 1)
        warps = min(max(block_k // 512, 2), 16)     # 32-64 values a thread
    else:
        block_k = group if kind == "group" else min(next_power_of_2(k_dim), 1024)
        warps = 4 if block_k >= 512 else 2
    static, num_static, block_s = static_scale_args(kind, input_scale, scales)
    res = residual if residual is not None else x
    ro = res_out if res_out is not None else x
    _quantize_kernel[(rows,)](
        x, res, norm_weight if norm_weight is not None else x, q, scales, static, ro,
        k_dim, num_static, float(eps),
        x.stride(0), res.stride(0), q.stride(0), scales.stride(0), ro.stride(0),
        KIND=kind, NORM=norm_weight is not None, RESIDUAL=residual is not None,
        BLOCK_K=block_k, GROUP=group if kind == "group" else block_k, BLOCK_S=block_s,
        WHOLE_ROW=whole_row, num_warps=warps,
    )
    return q, scales, res_out


def quantize_fp8(x: torch.Tensor, kind: str, group: int = 128,
                 input_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales: [M, 1] token, [M, K/group] group, [1, 1]
    static)."""
    q, scales, _ = _launch(x, None, None, 0.0, kind, group, input_scale)
    return q, scales


def norm_quantize_fp8(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                      eps: float, kind: str, group: int = 128,
                      input_scale: torch.Tensor | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """rms_norm(x + residual) * norm_weight quantized as `quantize_fp8`, and the new residual
    (x + residual, or x itself when residual is None)."""
    check_norm_inputs(x, residual, norm_weight)
    q, scales, res_out = _launch(x, residual, norm_weight, eps, kind, group, input_scale)
    return q, scales, (res_out if res_out is not None else x)
