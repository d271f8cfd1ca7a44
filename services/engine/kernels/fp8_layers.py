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

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.activation import gelu_tanh_and_mul, silu_and_mul
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_gated_rows,
    check_last_dim_contiguous,
    check_norm_inputs,
    env_choice,
    sm_count,
)
from services.engine.kernels.fp8_gemm import block_mm, rowwise_mm
from services.engine.kernels.fp8_quant import (
    FP8_MAX,
    MIN_AMAX,
    load_normed,
    norm_quantize_fp8,
    quantize_fp8,
    round_e4m3,
    static_scale,
    static_scale_args,
)
from services.engine.kernels.norm import row_rstd
from services.engine.kernels.pdl import launch_options, let_next_launch, wait_only
from services.engine.kernels.skinny_linear import (
    SCALE_BLOCK,
    LinearPlan,
    check_activation,
    launch,
    plan_linear,
    plan_rows,
)
from services.engine.kernels.skinny_rows import row_tile, store_row_tiles
from services.engine.model.fp8 import FP8_DTYPE, Fp8Weight

MAX_ROWS = 1
BLOCK = SCALE_BLOCK       # 128 x 128 weight blocks
# HELIOS_FP8_SKINNY picks batch 1's kernel (up to DOT_ROWS rows for the two tensor-core ones):
# - unset or cuda-cores: skinny_linear's one-row kernel on the CUDA cores (W8A16, the e4m3 weights
#   converted in registers);
# - tensor-cores: skinny_linear's tl.dot kernel, the e4m3 tiles converted to the activations'
#   dtype for the MMA (W8A16). Slower at batch 1 on an H100 (RESULTS.md, 2026-12-06 fifth
#   session);
# - w8a8: `_w8a8_rows_kernel` below, the rows quantized to e4m3 in the kernel as the FP8
#   GEMM path quantizes them, e4m3 x e4m3 on the tensor cores: no conversion of the weights
#   at all. Slower at batch 1 on an H100 (176 against the default's 236 tok/s, RESULTS.md
#   2026-12-07 fourteenth session): opt-in.
SKINNY = env_choice("HELIOS_FP8_SKINNY", ("cuda-cores", "tensor-cores", "w8a8"))
TENSOR_CORES = SKINNY == "tensor-cores"
W8A8 = SKINNY == "w8a8"
# HELIOS_FP8_SKINNY_PLAN: the one-row kernel's tilings, "sweep" (skinny_plan's FP8 rules) or
# "bf16" (plan_linear's, as for bf16 weights)
PLANS = env_choice("HELIOS_FP8_SKINNY_PLAN", ("sweep", "bf16"))
DOT_ROWS = 16    # rows the tensor-core variants take (one weight read for all of them)


def _skinny_rows() -> int:
    """The most rows the skinny kernels take; more are quantized for the FP8 GEMM."""
    return DOT_ROWS if TENSOR_CORES or W8A8 else MAX_ROWS


def quantizes_rows(rows: int) -> bool:
    """Whether `rows` activation rows reach the tensor cores as e4m3 (W8A8): the GEMM path, or
    the w8a8 skinny kernel; else the weights alone are e4m3 (W8A16)."""
    return W8A8 or rows > _skinny_rows()


@triton.jit
def _row_scales(x_rows, r_rows, g_ptr, res_out_rows, k_dim, eps, store_sum, mk_rows,
                act_dtype, NORM: tl.constexpr, RESIDUAL: tl.constexpr, KIND: tl.constexpr,
                BLOCK_K: tl.constexpr):
    """The rows' 1/rms (one pass over their columns; the residual sum written where
    `store_sum`) and, for KIND "token", their e4m3 scales (the normed rows' amax, a second
    pass). Rows: [BM, 1] pointers with the row mask `mk_rows`; the results are [BM, 1]."""
    kk = tl.arange(0, BLOCK_K)[None, :]
    rstd = tl.full(mk_rows.shape, 1.0, tl.float32)
    if NORM:
        sum_sq = tl.zeros(mk_rows.shape, dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            mask = mk_rows & (k0 + kk < k_dim)
            h = tl.load(x_rows + k0 + kk, mask=mask, other=0.0).to(tl.float32)
            if RESIDUAL:
                r = tl.load(r_rows + k0 + kk, mask=mask, other=0.0).to(tl.float32)
                h = (h + r).to(act_dtype)
                if store_sum:
                    tl.store(res_out_rows + k0 + kk, h, mask=mask)
                h = h.to(tl.float32)
            sum_sq += tl.sum(h * h, axis=1, keep_dims=True)
        rstd = 1.0 / tl.sqrt(sum_sq / k_dim + eps)
    scale = tl.full(mk_rows.shape, 1.0, tl.float32)
    if KIND == "token":
        amax = tl.zeros(mk_rows.shape, dtype=tl.float32)
        for k0 in range(0, k_dim, BLOCK_K):
            mask = mk_rows & (k0 + kk < k_dim)
            h = load_normed(x_rows, r_rows, g_ptr, k0 + kk, mask, rstd, act_dtype, NORM,
                            RESIDUAL)
            amax = tl.maximum(amax, tl.max(tl.abs(h), axis=1, keep_dims=True))
        scale = tl.div_rn(tl.maximum(amax, MIN_AMAX), FP8_MAX)
    return rstd, scale


@triton.jit
def _w8a8_rows_kernel(
    x_ptr, res_ptr, norm_w_ptr, w_ptr, ws_ptr, static_ptr, b_ptr, out_ptr, res_out_ptr,
    rows, n_out, k_dim, up_offset, num_static, eps,
    stride_x, stride_r, stride_w, stride_ws, stride_o, stride_ro,
    NORM: tl.constexpr, RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    KIND: tl.constexpr, BLOCKWISE: tl.constexpr, ONE_ROW: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_S: tl.constexpr,
    NUM_STAGES: tl.constexpr, SCALE_BLOCK: tl.constexpr, PDL: tl.constexpr,
):
    # W8A8 for a few rows: skinny_rows' _skinny_rows_kernel layout (each program streams
    # BLOCK_N weight rows once for BLOCK_M token rows, weights on the MMA's wide side), the
    # rows' (normed) activations quantized to e4m3 exactly as fp8_quant.py quantizes them for
    # the GEMM path: KIND "token" one scale a row (its amax), "group" one a row and 128
    # columns (BLOCK_K is the group: each K step's tile is one group), "static" the
    # checkpoint's input scale. e4m3 x e4m3 -> fp32 on the tensor cores (no conversion of the
    # weights); the scales multiply the sums (each K step's where they change along K).
    # ONE_ROW (batch 1): the norm and the quantization run on the row as a [BLOCK_K] vector
    # and a select places it in the MMA's 16-row tile, so the 15 padding rows cost no math.
    pid_n = tl.program_id(0)
    m, m_mask, n, n_mask, kk, w_rows, up_rows = row_tile(
        rows, n_out, w_ptr, up_offset, stride_w, BLOCK_M, BLOCK_N, BLOCK_K)
    wait_only(PDL)
    act_dtype = x_ptr.dtype.element_ty
    fp8 = w_ptr.dtype.element_ty
    static = 1.0
    if KIND == "static":
        static = static_scale(static_ptr, num_static, BLOCK_S)
    if ONE_ROW:      # 1-D [BLOCK_K] vectors spread over the threads, scalar scales
        first = (m == 0)[:, None]
        padding = tl.zeros([BLOCK_M, BLOCK_K], dtype=fp8)
        rstd = 1.0
        if NORM:
            rstd = row_rstd(x_ptr, res_ptr, res_out_ptr, k_dim, eps, pid_n == 0, RESIDUAL,
                            BLOCK_K)
        a_scale = static
        if KIND == "token":
            amax = tl.zeros([BLOCK_K], dtype=tl.float32)
            for k0 in range(0, k_dim, BLOCK_K):
                k = k0 + kk
                h = load_normed(x_ptr, res_ptr, norm_w_ptr, k, k < k_dim, rstd, act_dtype,
                                NORM, RESIDUAL)
                amax = tl.maximum(amax, tl.abs(h))
            a_scale = tl.div_rn(tl.maximum(tl.max(amax, axis=0), MIN_AMAX), FP8_MAX)
    else:            # [BLOCK_M, BLOCK_K] tiles, scales [BLOCK_M, 1]
        m64 = m.to(tl.int64)[:, None]
        x_rows = x_ptr + m64 * stride_x
        r_rows = res_ptr + m64 * stride_r
        mk_rows = m_mask[:, None]
        rstd, a_scale = _row_scales(x_rows, r_rows, norm_w_ptr, res_out_ptr + m64 * stride_ro,
                                    k_dim, eps, pid_n == 0, mk_rows, act_dtype, NORM,
                                    RESIDUAL, KIND, BLOCK_K)
        if KIND == "static":
            a_scale = tl.full([BLOCK_M, 1], 1.0, tl.float32) * static
    acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
    for k0 in tl.range(0, k_dim, BLOCK_K, num_stages=NUM_STAGES):
        k = k0 + kk
        k_mask = k < k_dim
        w_mask = n_mask[:, None] & k_mask[None, :]
        if ONE_ROW:
            h = load_normed(x_ptr, res_ptr, norm_w_ptr, k, k_mask, rstd, act_dtype, NORM,
                            RESIDUAL)                                  # [BK]
            if KIND == "group":
                a_scale = tl.div_rn(tl.maximum(tl.max(tl.abs(h), axis=0), MIN_AMAX), FP8_MAX)
            q = tl.where(first, round_e4m3(tl.div_rn(h, a_scale)).to(fp8)[None, :], padding)
            step_scale = a_scale
        else:
            h = load_normed(x_rows, r_rows, norm_w_ptr, k[None, :], mk_rows & k_mask[None, :],
                            rstd, act_dtype, NORM, RESIDUAL)           # [BM, BK]
            if KIND == "group":
                a_scale = tl.div_rn(tl.maximum(tl.max(tl.abs(h), axis=1, keep_dims=True),
                                               MIN_AMAX), FP8_MAX)
            q = round_e4m3(tl.div_rn(h, a_scale)).to(fp8)
            step_scale = tl.trans(a_scale)                             # [1, BM]
        a_t = tl.trans(q)                                              # [BK, BM]
        w = tl.load(w_rows + k[None, :], mask=w_mask, other=0.0)
        part = tl.dot(w, a_t)                                          # [BN, BM] fp32
        if KIND == "group":
            part = part * step_scale
        if BLOCKWISE:
            kb = k0 // SCALE_BLOCK
            s_w = tl.load(ws_ptr + (n // SCALE_BLOCK) * stride_ws + kb, mask=n_mask, other=0.0)
            part = part * s_w[:, None]
        acc += part
        if ACTIVATION != "none":
            u = tl.load(up_rows + k[None, :], mask=w_mask, other=0.0)
            part_up = tl.dot(u, a_t)
            if KIND == "group":
                part_up = part_up * step_scale
            if BLOCKWISE:
                s_u = tl.load(ws_ptr + ((n + up_offset) // SCALE_BLOCK) * stride_ws + kb,
                              mask=n_mask, other=0.0)
                part_up = part_up * s_u[:, None]
            acc_up += part_up
    let_next_launch(PDL)
    if KIND != "group":
        row_scale = a_scale if ONE_ROW else tl.trans(a_scale)          # scalar or [1, BM]
        acc = acc * row_scale
        acc_up = acc_up * row_scale
    if not BLOCKWISE:
        acc = acc * tl.load(ws_ptr + n, mask=n_mask, other=0.0)[:, None]
        if ACTIVATION != "none":
            acc_up = acc_up * tl.load(ws_ptr + up_offset + n, mask=n_mask, other=0.0)[:, None]
    store_row_tiles(acc, acc_up, b_ptr, out_ptr, n, n_mask, m, m_mask, up_offset, stride_o,
                    act_dtype, HAS_BIAS, ACTIVATION)


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
                gated: bool, normed: bool) -> LinearPlan:
    """The skinny kernels' tiling for e4m3 weights: skinny_linear.plan_linear's, then for one
    row with per-channel scales, from the H100 sweep of `bench_decode_step.py --sections
    linear-fp8` at the Qwen3-8B projections (RESULTS.md 2026-12-07, fourteenth session):
    - plain projections (o_proj, down) take twice the K step, the bf16 plan's bytes a step:
      o_proj 8x512w4 8.98 -> 8x1024w4 7.60 us, down 29.24 -> 23.22;
    - a normed one without the gated activation (qkv) keeps its tile with 8 warps: 16x512w4
      13.53 -> 16x512w8 12.48 (twice the K step was slower: 8x1024w4 14.63, 16x1024w8 16.98);
    - gate/up keeps bf16's 8x256w4 (42.74; the best, 16x512w8, 42.05).
    `HELIOS_FP8_SKINNY_PLAN=bf16` keeps plan_linear's tilings (the benchmarks' before).
    Block-wise weights step one column of 128x128 scale blocks at a time."""
    k = weight.shape[1]
    plan = plan_linear(n_out, k, rows, sm_count(device), gated)
    if weight.block:   # one column of weight blocks per K step
        return LinearPlan(plan.block_n, BLOCK, plan.num_warps)
    if plan.block_m > 1 or gated or PLANS == "bf16":
        return plan
    if normed:
        return dataclasses.replace(plan, num_warps=8)
    return dataclasses.replace(plan, block_k=min(2 * plan.block_k, triton.next_power_of_2(k)))


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
    block_m > 1 or HELIOS_FP8_SKINNY=tensor-cores, else the one-row one; with
    HELIOS_FP8_SKINNY=w8a8 the W8A8 rows kernel."""
    if W8A8:
        _w8a8(x, residual, norm_weight, eps, weight, bias, out, residual_out, activation, plan)
        return
    if plan is None:
        n_out, gated = out.shape[1], activation is not None
        plan = (dot_plan(weight, n_out, gated, norm_weight is not None) if TENSOR_CORES
                else skinny_plan(weight, n_out, x.shape[0], x.device, gated,
                                 norm_weight is not None))
    launch(x, residual, norm_weight, eps, weight.qweight, bias, out, residual_out, activation,
           plan, scale=weight.scale, scale_kind="block" if weight.block else "channel")


def _w8a8(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
          eps: float, weight: Fp8Weight, bias: torch.Tensor | None, out: torch.Tensor,
          residual_out: torch.Tensor | None, activation: str | None,
          plan: LinearPlan | None = None) -> None:
    rows, k_dim = x.shape
    n_out = out.shape[1]
    if rows == 0 or n_out == 0:
        return
    scheme = weight.scheme
    kind = scheme.activations
    plan = plan or dot_plan(weight, n_out, activation is not None, norm_weight is not None)
    block_k = plan.block_k
    if kind == "group":       # one K step is one activation group
        if scheme.group_size > BLOCK or scheme.group_size & (scheme.group_size - 1):
            raise ValidationError(f"w8a8: activation groups of {scheme.group_size} columns "
                                  f"(at most {BLOCK}, a power of two)")
        block_k = scheme.group_size
    w = weight.qweight
    res = residual if residual is not None else x
    res_out = residual_out if residual_out is not None else x
    static, num_static, block_s = static_scale_args(kind, weight.input_scale, weight.scale)
    _w8a8_rows_kernel[(cdiv(n_out, plan.block_n), cdiv(rows, plan.block_m))](
        x, res, norm_weight if norm_weight is not None else x, w, weight.scale, static,
        bias if bias is not None else x, out, res_out,
        rows, n_out, k_dim, n_out if activation else 0, num_static, float(eps),
        x.stride(0), res.stride(0), w.stride(0),
        weight.scale.stride(0) if weight.scale.dim() > 1 else 1, out.stride(0),
        res_out.stride(0),
        NORM=norm_weight is not None, RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
        ACTIVATION=activation or "none", KIND=kind, BLOCKWISE=weight.block,
        ONE_ROW=rows == 1, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n, BLOCK_K=block_k,
        BLOCK_S=block_s, NUM_STAGES=plan.num_stages,
        SCALE_BLOCK=BLOCK, num_warps=plan.num_warps, **launch_options(x.device, rows))


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
