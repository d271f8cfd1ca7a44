"""RMSNorm, alone or fused with the residual add, in one pass over each row.

    rms_norm(x [T, H], w [H], eps)                -> x / rms(x) * w
    fused_add_rms_norm(x, residual, w, eps)       -> (norm(x + residual), x + residual)

The sum is rounded to the input dtype before it is normalised (what the unfused torch code
does: `s = x + residual` in bf16, then the norm of `s`), so both paths agree on the residual
stream bit for bit. Statistics are in fp32. Leading dims are flattened: q/k-norm over heads
passes [T, heads, D], read in place even when it is a strided slice of a fused qkv tensor. A row of up to 16384 elements is held in registers (one read, one
write); longer rows take two passes over column chunks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_last_dim_contiguous,
    check_out,
    check_same_device,
    next_power_of_2,
)
from services.engine.kernels.pdl import launch_options, wait_for_previous_grids

MAX_BLOCK_N = 16384


@triton.jit
def _row_offsets(rows, inner, stride_outer, stride_inner):
    """Element offset of each row of a [outer, inner, H] view (inner == 1: a plain matrix)."""
    rows64 = rows.to(tl.int64)
    return (rows64 // inner) * stride_outer + (rows64 % inner) * stride_inner


@triton.jit
def row_rstd(x_row, r_row, res_out_row, k_dim, eps, store_sum, RESIDUAL: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """One row's 1/rms in BLOCK_K column chunks (float32 sums), of x, or of x + residual
    rounded to x's dtype, which is written to res_out_row where `store_sum` (a fused
    linear's first column block writes it once). The fused linears' and the FP8 quantizer's
    first pass over a row."""
    act_dtype = x_row.dtype.element_ty
    kk = tl.arange(0, BLOCK_K)
    sum_sq = tl.zeros([BLOCK_K], dtype=tl.float32)
    for k0 in range(0, k_dim, BLOCK_K):
        k = k0 + kk
        k_mask = k < k_dim
        h = tl.load(x_row + k, mask=k_mask, other=0.0).to(tl.float32)
        if RESIDUAL:
            r = tl.load(r_row + k, mask=k_mask, other=0.0).to(tl.float32)
            s = (h + r).to(act_dtype)
            if store_sum:
                tl.store(res_out_row + k, s, mask=k_mask)
            h = s.to(tl.float32)
        sum_sq += h * h
    return 1.0 / tl.sqrt(tl.sum(sum_sq, axis=0) / k_dim + eps)


@triton.jit(do_not_specialize=["n_rows"])   # the step's token count: one variant for all
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    n_rows, n_cols, inner, eps,
    sx_outer, sx_inner, sr_outer, sr_inner, so_outer, so_inner, sro_outer, sro_inner,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_grids(PDL)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    x_row = _row_offsets(rows, inner, sx_outer, sx_inner)
    r_row = _row_offsets(rows, inner, sr_outer, sr_inner)
    o_row = _row_offsets(rows, inner, so_outer, so_inner)
    ro_row = _row_offsets(rows, inner, sro_outer, sro_inner)
    cols = tl.arange(0, BLOCK_N)
    if NUM_CHUNKS == 1:
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + x_row[:, None] + cols[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + r_row[:, None] + cols[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + ro_row[:, None] + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = xf * rstd[:, None] * w[None, :]
        tl.store(out_ptr + o_row[:, None] + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        # pass 1: sum of squares (and the residual sum, written once)
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for chunk in range(NUM_CHUNKS):
            c = chunk * BLOCK_N + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            x = tl.load(x_ptr + x_row[:, None] + c[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + r_row[:, None] + c[None, :], mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
                tl.store(res_out_ptr + ro_row[:, None] + c[None, :], x, mask=mask)
            xf = x.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=1)
        rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
        # pass 2: normalise, re-reading the (rounded) sum
        for chunk in range(NUM_CHUNKS):
            c = chunk * BLOCK_N + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            if HAS_RESIDUAL:
                x = tl.load(res_out_ptr + ro_row[:, None] + c[None, :], mask=mask, other=0.0)
            else:
                x = tl.load(x_ptr + x_row[:, None] + c[None, :], mask=mask, other=0.0)
            w = tl.load(w_ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)
            y = x.to(tl.float32) * rstd[:, None] * w[None, :]
            tl.store(out_ptr + o_row[:, None] + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)


@dataclass(frozen=True, slots=True)
class _Rows:
    """A [..., H] tensor seen as rows: row r starts at (r // inner) * outer + (r % inner) * inner_stride."""

    tensor: torch.Tensor
    inner: int
    outer_stride: int
    inner_stride: int


def _as_rows(name: str, t: torch.Tensor, hidden: int) -> _Rows:
    """Rows of `t` without a copy when its strides allow: any view (-1, H), or a 3-dim
    [T, heads, H] view such as q/k sliced out of a fused qkv projection."""
    if t.shape[-1] != hidden:
        raise ValidationError(f"{name}: last dim {t.shape[-1]} != weight size {hidden}")
    check_float(name, t)
    if hidden > 1 and t.stride(-1) != 1:
        t = t.contiguous()
    if t.dim() == 3:
        return _Rows(t, t.shape[1], t.stride(0), t.stride(1))
    try:
        flat = t.view(-1, hidden)
    except RuntimeError:
        flat = t.reshape(-1, hidden).contiguous()
    return _Rows(flat, 1, flat.stride(0), flat.stride(0))


def _launch(
    x: _Rows,
    residual: _Rows | None,
    weight: torch.Tensor,
    eps: float,
    out: _Rows,
    residual_out: _Rows | None,
) -> None:
    hidden = weight.shape[0]
    n_rows = x.tensor.numel() // hidden
    if n_rows == 0:
        return
    block_n = min(next_power_of_2(hidden), MAX_BLOCK_N)
    num_chunks = cdiv(hidden, block_n)
    block_m = max(1, min(64, 2048 // block_n))
    tile = block_m * block_n
    num_warps = 1 if tile <= 256 else 2 if tile <= 1024 else 4 if tile <= 4096 else 8 if tile <= 8192 else 16
    res = residual if residual is not None else x
    res_out = residual_out if residual_out is not None else out
    _rms_norm_kernel[(cdiv(n_rows, block_m),)](
        x.tensor, res.tensor, weight, out.tensor, res_out.tensor,
        n_rows, hidden, x.inner, float(eps),
        x.outer_stride, x.inner_stride, res.outer_stride, res.inner_stride,
        out.outer_stride, out.inner_stride, res_out.outer_stride, res_out.inner_stride,
        HAS_RESIDUAL=residual is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_CHUNKS=num_chunks,
        num_warps=num_warps,
        **launch_options(x.tensor.device, x.tensor.shape[0]),
    )


def _contiguous_rows(t: torch.Tensor, like: _Rows, hidden: int) -> _Rows:
    """An output laid out contiguously, indexed with the input's row structure."""
    return _Rows(t, like.inner, like.inner * hidden, hidden)


def _check_weight(weight: torch.Tensor) -> int:
    if weight.dim() != 1:
        raise ValidationError(f"weight: expected 1 dim, got shape {tuple(weight.shape)}")
    check_float("weight", weight)
    check_last_dim_contiguous("weight", weight)
    return weight.shape[0]


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """x [..., H], weight [H] -> [..., H] in x's dtype."""
    hidden = _check_weight(weight)
    check_same_device(x=x, weight=weight)
    rows = _as_rows("x", x, hidden)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        check_out("out", out, tuple(x.shape), x)
    _launch(rows, None, weight, eps, _contiguous_rows(out, rows, hidden), None)
    return out


def fused_add_rms_norm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """x, residual [..., H], weight [H] -> (rms_norm(x + residual), x + residual).

    `out`/`residual_out` may alias `x`/`residual` (each element is read before it is written
    by the same program), which gives the in-place form a graph-captured model wants."""
    hidden = _check_weight(weight)
    check_same_device(x=x, residual=residual, weight=weight)
    if residual.shape != x.shape or residual.dtype != x.dtype:
        raise ValidationError(
            f"residual: expected {tuple(x.shape)} {x.dtype}, "
            f"got {tuple(residual.shape)} {residual.dtype}"
        )
    rows = _as_rows("x", x, hidden)
    res_rows = _as_rows("residual", residual, hidden)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        check_out("out", out, tuple(x.shape), x)
    if residual_out is None:
        residual_out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        check_out("residual_out", residual_out, tuple(x.shape), x)
    _launch(
        rows, res_rows, weight, eps,
        _contiguous_rows(out, rows, hidden), _contiguous_rows(residual_out, rows, hidden),
    )
    return out, residual_out
