"""RMSNorm, alone or fused with the residual add, in one pass over each row.

    rms_norm(x [T, H], w [H], eps)                -> x / rms(x) * w
    fused_add_rms_norm(x, residual, w, eps)       -> (norm(x + residual), x + residual)

The sum is rounded to the input dtype before it is normalised (what the unfused torch code
does: `s = x + residual` in bf16, then the norm of `s`), so both paths agree on the residual
stream bit for bit. Statistics are in fp32. Leading dims are flattened: q/k-norm over heads
passes [T, heads, D]. A row of up to 16384 elements is held in registers (one read, one
write); longer rows take two passes over column chunks.
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
    check_same_device,
    next_power_of_2,
)

MAX_BLOCK_N = 16384


@triton.jit
def _rms_norm_kernel(
    x_ptr, res_ptr, w_ptr, out_ptr, res_out_ptr,
    n_rows, n_cols, eps,
    stride_x, stride_r, stride_o, stride_ro,
    HAS_RESIDUAL: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    NUM_CHUNKS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_mask = rows < n_rows
    rows64 = rows.to(tl.int64)
    cols = tl.arange(0, BLOCK_N)
    if NUM_CHUNKS == 1:
        mask = row_mask[:, None] & (cols < n_cols)[None, :]
        x = tl.load(x_ptr + rows64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        if HAS_RESIDUAL:
            r = tl.load(res_ptr + rows64[:, None] * stride_r + cols[None, :], mask=mask, other=0.0)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
            tl.store(res_out_ptr + rows64[:, None] * stride_ro + cols[None, :], x, mask=mask)
        xf = x.to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=1) / n_cols + eps)
        w = tl.load(w_ptr + cols, mask=cols < n_cols, other=0.0).to(tl.float32)
        y = xf * rstd[:, None] * w[None, :]
        tl.store(
            out_ptr + rows64[:, None] * stride_o + cols[None, :],
            y.to(out_ptr.dtype.element_ty),
            mask=mask,
        )
    else:
        # pass 1: sum of squares (and the residual sum, written once)
        sum_sq = tl.zeros([BLOCK_M], dtype=tl.float32)
        for chunk in range(NUM_CHUNKS):
            c = chunk * BLOCK_N + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            x = tl.load(x_ptr + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                r = tl.load(res_ptr + rows64[:, None] * stride_r + c[None, :], mask=mask, other=0.0)
                x = (x.to(tl.float32) + r.to(tl.float32)).to(res_out_ptr.dtype.element_ty)
                tl.store(res_out_ptr + rows64[:, None] * stride_ro + c[None, :], x, mask=mask)
            xf = x.to(tl.float32)
            sum_sq += tl.sum(xf * xf, axis=1)
        rstd = 1.0 / tl.sqrt(sum_sq / n_cols + eps)
        # pass 2: normalise, re-reading the (rounded) sum
        for chunk in range(NUM_CHUNKS):
            c = chunk * BLOCK_N + cols
            mask = row_mask[:, None] & (c < n_cols)[None, :]
            if HAS_RESIDUAL:
                x = tl.load(
                    res_out_ptr + rows64[:, None] * stride_ro + c[None, :], mask=mask, other=0.0
                )
            else:
                x = tl.load(x_ptr + rows64[:, None] * stride_x + c[None, :], mask=mask, other=0.0)
            w = tl.load(w_ptr + c, mask=c < n_cols, other=0.0).to(tl.float32)
            y = x.to(tl.float32) * rstd[:, None] * w[None, :]
            tl.store(
                out_ptr + rows64[:, None] * stride_o + c[None, :],
                y.to(out_ptr.dtype.element_ty),
                mask=mask,
            )


def _as_rows(name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    if t.shape[-1] != hidden:
        raise ValidationError(f"{name}: last dim {t.shape[-1]} != weight size {hidden}")
    check_float(name, t)
    rows = t.reshape(-1, hidden)  # a view where the strides allow, else a copy
    if hidden > 1 and rows.stride(-1) != 1:
        rows = rows.contiguous()
    return rows


def _launch(
    x: torch.Tensor,
    residual: torch.Tensor | None,
    weight: torch.Tensor,
    eps: float,
    out: torch.Tensor,
    residual_out: torch.Tensor | None,
) -> None:
    hidden = weight.shape[0]
    n_rows = x.shape[0]
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
        x, res, weight, out, res_out,
        n_rows, hidden, float(eps),
        x.stride(0), res.stride(0), out.stride(0), res_out.stride(0),
        HAS_RESIDUAL=residual is not None,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        NUM_CHUNKS=num_chunks,
        num_warps=num_warps,
    )


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
    out_rows = out.view(-1, hidden)
    _launch(rows, None, weight, eps, out_rows, None)
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
    _launch(rows, res_rows, weight, eps, out.view(-1, hidden), residual_out.view(-1, hidden))
    return out, residual_out
