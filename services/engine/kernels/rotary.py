"""Rotary position embedding for q and k in one launch.

    apply_rotary(q [T, Hq, D], k [T, Hk, D], positions [T], cos_sin_cache [P, R]) -> (q, k)

`cos_sin_cache[p]` holds cos in its first R/2 entries and sin in the last R/2; R is the rotary
dim (R = D for full rotary, R < D rotates the first R dims and passes the rest through).
NeoX style rotates pairs (i, i + R/2); GPT-J style (is_neox=False) rotates (2i, 2i + 1).
Arithmetic in fp32, one rounding at the store. One program per (token, chunk of heads), q and k
chunks in the same grid. The results are new tensors unless `out_q`/`out_k` are given; these
may be `q`/`k` themselves (each element is read before it is written by the same program).
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
    check_same_device,
    next_power_of_2,
)


@triton.jit
def _rotate_heads(
    x_ptr, out_ptr, stride_xt, stride_xh, stride_ot, stride_oh,
    token, head0, n_heads, cos, sin,
    HEAD_DIM: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):
    heads = head0 + tl.arange(0, BLOCK_H)
    i = tl.arange(0, BLOCK_HALF)
    mask = (heads < n_heads)[:, None] & (i < ROT_HALF)[None, :]
    x_row = x_ptr + token * stride_xt + heads[:, None] * stride_xh
    o_row = out_ptr + token * stride_ot + heads[:, None] * stride_oh
    if IS_NEOX:
        d1 = i
        d2 = i + ROT_HALF
    else:
        d1 = 2 * i
        d2 = 2 * i + 1
    x1 = tl.load(x_row + d1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(x_row + d2[None, :], mask=mask, other=0.0).to(tl.float32)
    if BLOCK_REST > 0:  # partial rotary: dims [2 * ROT_HALF, HEAD_DIM) pass through
        r = 2 * ROT_HALF + tl.arange(0, BLOCK_REST)
        rmask = (heads < n_heads)[:, None] & (r < HEAD_DIM)[None, :]
        rest = tl.load(x_row + r[None, :], mask=rmask, other=0.0)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(o_row + d1[None, :], y1.to(out_ptr.dtype.element_ty), mask=mask)
    tl.store(o_row + d2[None, :], y2.to(out_ptr.dtype.element_ty), mask=mask)
    if BLOCK_REST > 0:
        tl.store(o_row + r[None, :], rest, mask=rmask)


@triton.jit
def _rotary_kernel(
    q_ptr, k_ptr, pos_ptr, cache_ptr, q_out_ptr, k_out_ptr,
    n_q_heads, n_k_heads, stride_cache,
    stride_qt, stride_qh, stride_kt, stride_kh,
    stride_qot, stride_qoh, stride_kot, stride_koh,
    HEAD_DIM: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
    Q_CHUNKS: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    i = tl.arange(0, BLOCK_HALF)
    cos = tl.load(cache_ptr + pos * stride_cache + i, mask=i < ROT_HALF, other=0.0).to(tl.float32)
    sin = tl.load(
        cache_ptr + pos * stride_cache + ROT_HALF + i, mask=i < ROT_HALF, other=0.0
    ).to(tl.float32)
    if chunk < Q_CHUNKS:
        _rotate_heads(
            q_ptr, q_out_ptr, stride_qt, stride_qh, stride_qot, stride_qoh,
            token, chunk * BLOCK_H, n_q_heads, cos, sin,
            HEAD_DIM, ROT_HALF, IS_NEOX, BLOCK_H, BLOCK_HALF, BLOCK_REST,
        )
    else:
        _rotate_heads(
            k_ptr, k_out_ptr, stride_kt, stride_kh, stride_kot, stride_koh,
            token, (chunk - Q_CHUNKS) * BLOCK_H, n_k_heads, cos, sin,
            HEAD_DIM, ROT_HALF, IS_NEOX, BLOCK_H, BLOCK_HALF, BLOCK_REST,
        )


def apply_rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool = True,
    *,
    out_q: torch.Tensor | None = None,
    out_k: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, Hq, D], k [T, Hk, D], positions int [T], cos_sin_cache [P, R] -> (q', k')."""
    check_rank("q", q, 3)
    check_rank("k", k, 3)
    check_rank("cos_sin_cache", cos_sin_cache, 2)
    check_same_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    num_tokens, num_q_heads, head_dim = q.shape
    if k.shape[0] != num_tokens or k.shape[2] != head_dim:
        raise ValidationError(f"k: shape {tuple(k.shape)} does not match q {tuple(q.shape)}")
    if positions.shape != (num_tokens,) or positions.dtype not in (torch.int32, torch.int64):
        raise ValidationError(f"positions: expected int [{num_tokens}], got {tuple(positions.shape)} {positions.dtype}")
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim % 2 or rot_dim > head_dim or rot_dim == 0:
        raise ValidationError(f"cos_sin_cache: rotary dim {rot_dim} must be even and <= {head_dim}")
    for name, t in (("q", q), ("k", k), ("cos_sin_cache", cos_sin_cache)):
        check_float(name, t)
        check_last_dim_contiguous(name, t)
    positions = positions.contiguous()
    if out_q is None:
        out_q = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    elif out_q is not q:
        check_out("out_q", out_q, tuple(q.shape), q)
    if out_k is None:
        out_k = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    elif out_k is not k:
        check_out("out_k", out_k, tuple(k.shape), k)
    if num_tokens == 0:
        return out_q, out_k
    num_k_heads = k.shape[1]
    rot_half = rot_dim // 2
    block_half = max(2, next_power_of_2(rot_half))
    rest = head_dim - rot_dim
    block_rest = next_power_of_2(rest) if rest else 0
    block_h = max(1, min(next_power_of_2(max(num_q_heads, num_k_heads)), 2048 // block_half))
    q_chunks = cdiv(num_q_heads, block_h)
    grid = (num_tokens, q_chunks + cdiv(num_k_heads, block_h))
    _rotary_kernel[grid](
        q, k, positions, cos_sin_cache, out_q, out_k,
        num_q_heads, num_k_heads, cos_sin_cache.stride(0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        out_q.stride(0), out_q.stride(1), out_k.stride(0), out_k.stride(1),
        HEAD_DIM=head_dim, ROT_HALF=rot_half, IS_NEOX=bool(is_neox),
        BLOCK_H=block_h, BLOCK_HALF=block_half, BLOCK_REST=block_rest,
        Q_CHUNKS=q_chunks,
        num_warps=4,
    )
    return out_q, out_k
