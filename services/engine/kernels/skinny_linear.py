"""Skinny linear layers for decode steps of a few rows, with the layer's neighbours fused in.

    linear(x [M, K], weight [N, K], bias [N] | None, *, out_dtype=None) -> x W^T + b  [M, N]
    norm_linear(x [M, K], residual [M, K] | None, norm_weight [K], eps, weight [N, K],
                bias [N] | None, activation=None) -> (y, new_residual)

`norm_linear` is `rms_norm(x + residual) @ W^T + b` (the residual add skipped when `residual`
is None; then new_residual is x itself); with a gated `activation` ("silu", "gelu_tanh") the
weight stacks gate and up rows ([2I, K]) and y is act(gate) * up [M, I]: the decoder layer's
input norm + QKV projection and post-attention norm + gate/up projection + activation, each in
one launch.

Why: a batch-1 decode step is a chain of ~10 launches per layer, and at the Qwen3-0.6B shape
each is a few microseconds of launch latency and ramp rather than bandwidth (RESULTS.md: 1.44
ms per token for 0.25 ms of weights). cuBLAS cannot take the norm in front or the activation
behind, so each projection costs two or three launches. Here every program recomputes the
row's RMS from the (small, cached) activation row and streams its BLOCK_N weight rows once;
program 0 of each row writes the new residual. The weight tile of the first step is loaded
before `gdc_wait` (weights never depend on the previous kernel), so with programmatic
dependent launch (kernels/pdl.py) the weight stream starts while the previous
kernel drains.

Rounding matches the unfused kernels: the residual sum rounded to the input dtype, the normed
row rounded to it before the product (as the rms_norm kernel's output), gate and up rounded to
it before the activation (as cuBLAS's output into the activation kernel); fp32 accumulation.

Rows: `_skinny_linear_kernel` handles one row per program (grid axis 1), so it reads the
weights once per row; it serves one-row steps (batch-1 decode). Steps of 2 to `MAX_ROWS` rows
(a verification's pending token and drafts, small decode batches) take `_skinny_rows_kernel`
(skinny_rows.py): 16 rows per program through tl.dot, the weight tiles streamed once
through Triton's pipelined copies, the same norm, residual and activation fused in. On the H200 it beats
cuBLAS with the separate norm and activation kernels at every Qwen3-8B projection from 2 to 16
rows (`plan_rows`; the first version, which prefetched the weights into registers, ran
1.1-1.8x slower than cuBLAS). Above `MAX_ROWS` the wrappers take the unfused path (cuBLAS
GEMM + the norm / activation kernels). `plan=` takes either kernel at any row count (the
benchmark's sweep).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.activation import GATED_ACTIVATIONS, gated_activation
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_gated_rows,
    check_last_dim_contiguous,
    check_norm_inputs,
    check_rank,
    check_same_device,
    next_power_of_2,
    sm_count,
)
from services.engine.kernels.fp8_unpack import hardware_e4m3, load_weights, weight_f32
from services.engine.kernels.norm import row_rstd
from services.engine.kernels.pdl import launch_options, wait_for_previous_grids
from services.engine.kernels.skinny_rows import _skinny_rows_kernel

# Above this many rows the fused skinny path hands over to cuBLAS (see the module docstring;
# benchmarks/bench_decode_step.py sweeps the crossover).
MAX_ROWS = 16
# the rows kernel's pipelined tiles must fit a multiprocessor's shared memory (227 KiB on
# sm_90; a 5-stage fp32 64 x 256 tiling asked for 320 KiB)
SHARED_BYTES = 224 * 1024


@dataclass(frozen=True, slots=True)
class LinearPlan:
    block_n: int       # output features per program
    block_k: int       # reduction elements per step
    num_warps: int
    block_m: int = 1   # token rows per program: 1 (_skinny_linear_kernel) or >= 16 (tl.dot)
    num_stages: int = 3  # the tl.dot kernel's weight pipeline depth

    def __post_init__(self) -> None:
        if self.block_m != 1 and (self.block_m < 16 or self.block_n < 16 or self.block_k < 16):
            raise ValidationError(f"{self}: a tl.dot plan (block_m > 1) needs block_m, block_n "
                                  f"and block_k of at least 16")


def plan_linear(n_out: int, k: int, rows: int, num_sms: int, gated: bool = False,
                normed: bool = False, elem_bytes: int = 2) -> LinearPlan:
    """The tiling, from the H200 sweep of bench_decode_step.py at the Qwen3-0.6B and -8B
    projections, batch 1, with PDL (RESULTS.md 2026-11-29; the best of 9 tilings each):

    - gate + up with a gated activation (`gated`; measured with SiLU, GELU(tanh) streams the
      same two weight halves): 8 rows x 512 (x 256 when K > 1024), 4 warps: 6.1 us at 0.6B
      (16 x 512 with 8 warps: 8.2), 62.4 us at 8B (73.5), against 11.5 / 65.1 us for the
      norm + cuBLAS + activation it replaces.
    - a small output (<= 2048 features: o_proj and down at 0.6B): 16 x 1024, 8 warps, so
      64 programs each stream 32-64 KiB: 3.8 / 4.9 us (4 x 512: 4.4 / 5.7; cuBLAS 14.0 / 9.0).
    - the vocabulary projection (>= 32768 features): 8 x 256, 4 warps: 82.7 / 291 us, 3.8 /
      4.3 TB/s (cuBLAS + the fp32 cast 89.8 / 300).
    - otherwise 16 x 512, halving the rows while the grid covers fewer than two programs
      per multiprocessor: 8B qkv 21.5 us (cuBLAS with the norm 25.1), o_proj 12.7 (15.7),
      down 32.3 (35.0); 0.6B qkv 5.2 (9.3).

    The fp32 accumulator is tile-shaped (one reduction at the end); no tiling here spills.

    More than one row: the tl.dot kernel, 16 rows per program (`plan_rows`)."""
    if rows > 1:
        return plan_rows(n_out, k, gated, normed, elem_bytes)
    if gated:
        return LinearPlan(block_n=8, block_k=min(next_power_of_2(k), 512 if k <= 1024 else 256),
                          num_warps=4)
    if n_out <= 2048:
        return LinearPlan(block_n=16, block_k=min(next_power_of_2(k), 1024), num_warps=8)
    if n_out >= 32768:
        return LinearPlan(block_n=8, block_k=min(next_power_of_2(k), 256), num_warps=4)
    block_k = min(next_power_of_2(k), 512)
    block_n = 16
    while block_n > 4 and cdiv(n_out, block_n) * rows < 2 * num_sms:
        block_n //= 2
    return LinearPlan(block_n=block_n, block_k=block_k, num_warps=4)


def plan_rows(n_out: int, k: int, gated: bool, normed: bool, elem_bytes: int = 2
              ) -> LinearPlan:
    """The tl.dot kernel's tiling for 2-16 rows, from the H200 sweep of bench_decode_step.py
    at the Qwen3-8B projections, M = 2, 5, 8 and 16 (RESULTS.md 2026-12-04, later session; 20
    tilings each). 64 output features per program everywhere: a normed projection re-reads
    its rows (and residual) in every program, so fewer, wider programs win there (qkv at 5
    rows: 17.9 us with 64 x 256, 55.6 with 32 x 256, cuBLAS with the norm kernel 20.7).

    - gate + up (`gated`): 64 x 64, 5 stages: 56.6-59.9 us (cuBLAS + norm + activation 58.8-64.0)
    - the vocabulary projection (>= 32768 features): 64 x 128, 3 stages: 282-291 us (cuBLAS
      with the fp32 cast 307-316)
    - other normed ones (qkv): 64 x 256, 3 stages (5 stages pass the shared memory there)
    - the rest (o_proj, down): 64 x 256, 5 stages: o_proj 11.3-11.6 us (cuBLAS 13.8-14.0),
      down 28.5 (30.6-32.3)."""
    if gated:
        block_k, stages = 64, 5
    elif n_out >= 32768:
        block_k, stages = 128, 3
    else:
        block_k, stages = 256, 3 if normed else 5
    block_n, block_m = 64, 16
    block_k = min(block_k, max(16, next_power_of_2(k)))
    # wider elements (fp32) fit the shared memory with fewer stages, then narrower steps
    while stages * block_k * _row_step_bytes(block_n, block_m, gated, normed, elem_bytes) \
            > SHARED_BYTES and block_k > 16:
        if stages > 3:
            stages = 3
        else:
            block_k //= 2
    return LinearPlan(block_n=block_n, block_k=block_k, num_warps=4, block_m=block_m,
                      num_stages=stages)


def _row_step_bytes(block_n: int, block_m: int, gated: bool, normed: bool,
                    elem_bytes: int) -> int:
    """Shared memory per reduction element of one pipeline stage of the tl.dot kernel: the
    weight tile(s) and the rows (and residual) of one step."""
    return elem_bytes * (block_n * (2 if gated else 1) + block_m * (2 if normed else 1))


@triton.jit
def _skinny_linear_kernel(
    x_ptr, res_ptr, norm_w_ptr, w_ptr, b_ptr, out_ptr, res_out_ptr, ws_ptr,
    n_out, k_dim, up_offset, eps,
    stride_x, stride_r, stride_w, stride_o, stride_ro, stride_ws,
    NORM: tl.constexpr, RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, ACTIVATION: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
    W_SCALE: tl.constexpr, SCALE_BLOCK: tl.constexpr, E4M3_PTX: tl.constexpr,
):
    # ACTIVATION "none": y = the projection; "silu" / "gelu_tanh": the weight's rows [0, n_out)
    # are the gate, rows [up_offset, up_offset + n_out) the up half, y = act(gate) * up.
    # W_SCALE "channel" / "block": e4m3 weights (fp8_layers.py), dequantized in registers: a
    # row's scale multiplies its sum at the end, a 128x128 block's scale each K step's
    # products (BLOCK_K == SCALE_BLOCK: one step is one column of weight blocks)
    pid_n = tl.program_id(0)
    row = tl.program_id(1).to(tl.int64)
    n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = n < n_out
    kk = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + n.to(tl.int64)[:, None] * stride_w               # [BN, 1]
    up_rows = w_rows + up_offset * stride_w
    # the first weight tiles do not depend on the previous kernel: start them before the wait
    w_next = load_weights(w_rows, 0, k_dim, n_mask, BLOCK_K, E4M3_PTX)
    if ACTIVATION != "none":
        u_next = load_weights(up_rows, 0, k_dim, n_mask, BLOCK_K, E4M3_PTX)
    wait_for_previous_grids(PDL)
    act_dtype = x_ptr.dtype.element_ty
    x_row = x_ptr + row * stride_x
    r_row = res_ptr + row * stride_r
    rstd = 1.0
    if NORM:
        rstd = row_rstd(x_row, r_row, res_out_ptr + row * stride_ro, k_dim, eps, pid_n == 0,
                        RESIDUAL, BLOCK_K)
    acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    acc_up = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        k = k0 + kk
        k_mask = k < k_dim
        a = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
        if NORM:
            if RESIDUAL:
                r = tl.load(r_row + k, mask=k_mask, other=0.0).to(tl.float32)
                a = (a + r).to(act_dtype).to(tl.float32)
            g = tl.load(norm_w_ptr + k, mask=k_mask, other=0.0).to(tl.float32)
            a = (a * rstd * g).to(act_dtype).to(tl.float32)
        w = w_next
        w_next = load_weights(w_rows, k0 + BLOCK_K, k_dim, n_mask, BLOCK_K, E4M3_PTX)
        prod = weight_f32(w, BLOCK_N, BLOCK_K, E4M3_PTX) * a[None, :]
        if W_SCALE == "block":
            kb = k0 // SCALE_BLOCK
            s_w = tl.load(ws_ptr + (n // SCALE_BLOCK) * stride_ws + kb, mask=n_mask, other=0.0)
            prod = prod * s_w[:, None]
        acc += prod
        if ACTIVATION != "none":
            u = u_next
            u_next = load_weights(up_rows, k0 + BLOCK_K, k_dim, n_mask, BLOCK_K, E4M3_PTX)
            prod_up = weight_f32(u, BLOCK_N, BLOCK_K, E4M3_PTX) * a[None, :]
            if W_SCALE == "block":
                s_u = tl.load(ws_ptr + ((n + up_offset) // SCALE_BLOCK) * stride_ws + kb,
                              mask=n_mask, other=0.0)
                prod_up = prod_up * s_u[:, None]
            acc_up += prod_up
    y = tl.sum(acc, axis=1)                                            # [BN]
    if W_SCALE == "channel":
        y = y * tl.load(ws_ptr + n, mask=n_mask, other=0.0)
    if HAS_BIAS:
        y += tl.load(b_ptr + n, mask=n_mask, other=0.0).to(tl.float32)
    if ACTIVATION != "none":
        up = tl.sum(acc_up, axis=1)
        if W_SCALE == "channel":
            up = up * tl.load(ws_ptr + up_offset + n, mask=n_mask, other=0.0)
        if HAS_BIAS:
            up += tl.load(b_ptr + up_offset + n, mask=n_mask, other=0.0).to(tl.float32)
        gate = y.to(act_dtype).to(tl.float32)
        up = up.to(act_dtype).to(tl.float32)
        y = gated_activation(gate, up, ACTIVATION)
    tl.store(out_ptr + row * stride_o + n, y.to(out_ptr.dtype.element_ty), mask=n_mask)


def _check_matrix(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
    check_rank("x", x, 2)
    check_rank("weight", weight, 2)
    for name, t in (("x", x), ("weight", weight)):
        check_float(name, t)
        check_last_dim_contiguous(name, t)
    if weight.shape[1] != x.shape[1]:
        raise ValidationError(f"weight {tuple(weight.shape)} does not take rows of {x.shape[1]}")
    if weight.dtype != x.dtype:
        raise ValidationError(f"weight dtype {weight.dtype} != x dtype {x.dtype}")
    if bias is not None:
        if bias.shape != (weight.shape[0],) or bias.stride(0) != 1:
            raise ValidationError(f"bias: expected ({weight.shape[0]},) contiguous, "
                                  f"got {tuple(bias.shape)}")
        if bias.dtype != x.dtype:
            raise ValidationError(f"bias dtype {bias.dtype} != x dtype {x.dtype}")
        check_same_device(x=x, bias=bias)
    check_same_device(x=x, weight=weight)


def check_activation(activation: object) -> str | None:
    """norm_linear's `activation`: None (no activation) or one of GATED_ACTIVATIONS."""
    if isinstance(activation, bool):
        raise ValidationError(
            f"activation: got the bool {activation!r}; norm_linear's silu_mul flag is now "
            f"activation=None, 'silu' or 'gelu_tanh'")
    if activation is not None and activation not in GATED_ACTIVATIONS:
        raise ValidationError(f"activation: expected None or one of {GATED_ACTIVATIONS}, "
                              f"got {activation!r}")
    return activation  # type: ignore[return-value]


SCALE_BLOCK = 128     # block-wise e4m3 weights: one scale per 128 x 128 block


def launch(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor | None,
           eps: float, weight: torch.Tensor, bias: torch.Tensor | None, out: torch.Tensor,
           residual_out: torch.Tensor | None, activation: str | None,
           plan: LinearPlan | None = None, *, scale: torch.Tensor | None = None,
           scale_kind: str = "none") -> None:
    """One kernel launch of `linear` / `norm_linear` into `out` (and `residual_out`): the
    one-row kernel or, for a plan with block_m > 1, the tl.dot kernel; `scale` /
    `scale_kind` ("channel", "block"): e4m3 weights and their scales (fp8_layers.py)."""
    activation = check_activation(activation)
    rows, k_dim = x.shape
    n_out = out.shape[1]
    if rows == 0 or n_out == 0:
        return
    plan = plan or plan_linear(n_out, k_dim, rows, sm_count(x.device), activation is not None,
                               norm_weight is not None, x.element_size())
    res = residual if residual is not None else x
    res_out = residual_out if residual_out is not None else x
    pointers = (x, res, norm_weight if norm_weight is not None else weight, weight,
                bias if bias is not None else weight, out, res_out)
    sizes = (n_out, k_dim, n_out if activation else 0, float(eps),
             x.stride(0), res.stride(0), weight.stride(0), out.stride(0), res_out.stride(0))
    scales = scale if scale is not None else x
    scale_stride = scales.stride(0) if scales.dim() > 1 else 1
    flags = dict(NORM=norm_weight is not None, RESIDUAL=residual is not None,
                 HAS_BIAS=bias is not None, ACTIVATION=activation or "none",
                 BLOCK_N=plan.block_n, BLOCK_K=plan.block_k, num_warps=plan.num_warps,
                 W_SCALE=scale_kind, SCALE_BLOCK=SCALE_BLOCK, **launch_options(x.device, rows))
    if plan.block_m == 1:
        _skinny_linear_kernel[(cdiv(n_out, plan.block_n), rows)](
            *pointers, scales, *sizes, scale_stride, E4M3_PTX=hardware_e4m3(weight), **flags)
        return
    # "ieee": fp32 operands, fp32 products. fp32 inputs need it (tf32 would round them),
    # and so does Triton's interpreter, whose tl.dot misreads bf16 operands (raw bits);
    # on CUDA 16-bit operands go to the MMA as they are (fp32 accumulation either way)
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    precision = "ieee" if x.dtype == torch.float32 or interpreted else "tf32"
    grid = (cdiv(n_out, plan.block_n), cdiv(rows, plan.block_m))
    _skinny_rows_kernel[grid](
        *pointers, scales, rows, *sizes, scale_stride,
        BLOCK_M=plan.block_m, NUM_STAGES=plan.num_stages, DOT_PRECISION=precision,
        **flags)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
           out_dtype: torch.dtype | None = None, plan: LinearPlan | None = None
           ) -> torch.Tensor:
    """x [M, K] @ weight[N, K]^T + bias -> [M, N] in `out_dtype` (x's dtype by default; the
    logits ask for float32 so no separate cast runs)."""
    _check_matrix(x, weight, bias)
    out_dtype = out_dtype or x.dtype
    if not out_dtype.is_floating_point:
        raise ValidationError(f"out_dtype {out_dtype} is not a floating-point type")
    if x.shape[0] > MAX_ROWS:
        from services.engine.model.ops import reference_linear

        return reference_linear(x, weight, bias, out_dtype)
    out = torch.empty((x.shape[0], weight.shape[0]), dtype=out_dtype, device=x.device)
    launch(x, None, None, 0.0, weight, bias, out, None, None, plan)
    return out


def norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                eps: float, weight: torch.Tensor, bias: torch.Tensor | None = None,
                activation: str | None = None, *, plan: LinearPlan | None = None,
                out_dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(rms_norm(x [+ residual]) @ W^T + b, then act(gate) * up with a gated `activation`
    ("silu" or "gelu_tanh"; None: no activation); the new residual: x + residual, or x when
    residual is None). `out_dtype`: the projection's dtype (x's by default; a router asks
    for float32 logits)."""
    activation = check_activation(activation)
    _check_matrix(x, weight, bias)
    rows = x.shape[0]
    check_norm_inputs(x, residual, norm_weight)
    n_rows = weight.shape[0]
    check_gated_rows(n_rows, activation)
    n_out = n_rows // 2 if activation else n_rows
    if rows > MAX_ROWS:      # the model's own composition (norm kernel, cuBLAS, activation)
        from services.engine.model.ops import composed_norm_linear

        y, new_residual = composed_norm_linear(x, residual, norm_weight, eps, weight, bias,
                                               activation=activation)
        return (y if out_dtype is None else y.to(out_dtype)), new_residual
    out = torch.empty((rows, n_out), dtype=out_dtype or x.dtype, device=x.device)
    residual_out = None
    if residual is not None:
        residual_out = torch.empty_like(x, memory_format=torch.contiguous_format)
    launch(x, residual, norm_weight, eps, weight, bias, out, residual_out, activation, plan)
    return out, (residual_out if residual_out is not None else x)
