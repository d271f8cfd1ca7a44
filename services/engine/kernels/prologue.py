"""The attention prologue in one launch: per-head q/k RMSNorm (Qwen3's QK-norm, optional),
rotary on q and k, and the new K/V written into the paged cache.

    qkv_prologue(qkv [T, (Hq + 2 Hk) D], q_norm [D] | None, k_norm [D] | None, eps,
                 positions [T], cos_sin_cache [P, R], is_neox, k_cache, v_cache,
                 slot_mapping [T], num_q_heads, num_kv_heads, *, out=None) -> q [T, Hq, D]

It replaces four launches per layer (q norm, k norm, rotary, write_kv): at batch-1 decode each
is a few microseconds of launch-bound work (docs/kernels.md, bench_kernels' fused ops), paid 36
times per token at the Qwen3-8B shape. The norm and the rotation in fp32 with one rounding at
each store (the unfused kernels round once more, between norm and rotary). Padding rows (slot < 0) write no K/V; their
q rows are computed like any other. One program per (token, chunk of heads); the q chunks come
first, then the k chunks, which also move the matching v heads.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_kv_cache_dtype,
    check_out,
    check_rank,
    check_same_device,
    next_power_of_2,
)
from services.engine.kernels.fp8_quant import cast_for_cache
from services.engine.kernels.pdl import launch_options, wait_for_previous_grids


@triton.jit
def _normed(x, w_ptr, d, dmask, rstd, HAS_NORM: tl.constexpr):
    """x [H, n] fp32 -> x * rstd * weight in fp32 (as the rms_norm kernel)."""
    if HAS_NORM:
        w = tl.load(w_ptr + d, mask=dmask, other=0.0).to(tl.float32)
        x = x * rstd[:, None] * w[None, :]
    return x


@triton.jit
def _qkv_prologue_kernel(
    qkv_ptr, qw_ptr, kw_ptr, pos_ptr, cache_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    n_q_heads, n_k_heads, eps, stride_qkv, stride_cos, stride_qot, stride_qoh,
    stride_kc_slot, stride_kc_head, stride_vc_slot, stride_vc_head,
    HEAD_DIM: tl.constexpr, ROT_HALF: tl.constexpr, IS_NEOX: tl.constexpr,
    HAS_NORM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
    BLOCK_REST: tl.constexpr, BLOCK_D: tl.constexpr, Q_CHUNKS: tl.constexpr,
    PDL: tl.constexpr,
):
    wait_for_previous_grids(PDL)
    token = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    is_q = chunk < Q_CHUNKS
    if is_q:
        head0 = chunk * BLOCK_H
        n_heads = n_q_heads
        col0 = 0
        w_ptr = qw_ptr
    else:
        head0 = (chunk - Q_CHUNKS) * BLOCK_H
        n_heads = n_k_heads
        col0 = n_q_heads * HEAD_DIM
        w_ptr = kw_ptr
    heads = head0 + tl.arange(0, BLOCK_H)
    hmask = heads < n_heads
    i = tl.arange(0, BLOCK_HALF)
    imask = i < ROT_HALF
    if IS_NEOX:
        d1 = i
        d2 = i + ROT_HALF
    else:
        d1 = 2 * i
        d2 = 2 * i + 1
    row = qkv_ptr + token * stride_qkv + col0 + heads[:, None] * HEAD_DIM
    mask = hmask[:, None] & imask[None, :]
    x1 = tl.load(row + d1[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(row + d2[None, :], mask=mask, other=0.0).to(tl.float32)
    sumsq = tl.sum(x1 * x1, axis=1) + tl.sum(x2 * x2, axis=1)
    if BLOCK_REST > 0:  # partial rotary: dims [2 * ROT_HALF, HEAD_DIM) are not rotated
        r = 2 * ROT_HALF + tl.arange(0, BLOCK_REST)
        rmask = hmask[:, None] & (r < HEAD_DIM)[None, :]
        rest = tl.load(row + r[None, :], mask=rmask, other=0.0).to(tl.float32)
        sumsq += tl.sum(rest * rest, axis=1)
    rstd = 1.0 / tl.sqrt(sumsq / HEAD_DIM + eps)
    x1 = _normed(x1, w_ptr, d1, imask, rstd, HAS_NORM)
    x2 = _normed(x2, w_ptr, d2, imask, rstd, HAS_NORM)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    cos = tl.load(cache_ptr + pos * stride_cos + i, mask=imask, other=0.0).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cos + ROT_HALF + i, mask=imask, other=0.0).to(
        tl.float32)
    y1 = x1 * cos[None, :] - x2 * sin[None, :]
    y2 = x2 * cos[None, :] + x1 * sin[None, :]
    if BLOCK_REST > 0:
        rest = _normed(rest, w_ptr, r, r < HEAD_DIM, rstd, HAS_NORM)
    if is_q:
        out = q_out_ptr + token * stride_qot + heads[:, None] * stride_qoh
        tl.store(out + d1[None, :], y1.to(q_out_ptr.dtype.element_ty), mask=mask)
        tl.store(out + d2[None, :], y2.to(q_out_ptr.dtype.element_ty), mask=mask)
        if BLOCK_REST > 0:
            tl.store(out + r[None, :], rest.to(q_out_ptr.dtype.element_ty), mask=rmask)
    else:
        slot = tl.load(slot_ptr + token).to(tl.int64)
        if slot >= 0:
            kc = k_cache_ptr + slot * stride_kc_slot + heads[:, None] * stride_kc_head
            tl.store(kc + d1[None, :], cast_for_cache(y1, k_cache_ptr.dtype.element_ty), mask=mask)
            tl.store(kc + d2[None, :], cast_for_cache(y2, k_cache_ptr.dtype.element_ty), mask=mask)
            if BLOCK_REST > 0:
                tl.store(kc + r[None, :], cast_for_cache(rest, k_cache_ptr.dtype.element_ty), mask=rmask)
            d = tl.arange(0, BLOCK_D)
            vmask = hmask[:, None] & (d < HEAD_DIM)[None, :]
            v_row = row + n_k_heads * HEAD_DIM
            v = tl.load(v_row + d[None, :], mask=vmask, other=0.0)
            vc = v_cache_ptr + slot * stride_vc_slot + heads[:, None] * stride_vc_head
            tl.store(vc + d[None, :], cast_for_cache(v, v_cache_ptr.dtype.element_ty), mask=vmask)


def qkv_prologue(
    qkv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    num_q_heads: int,
    num_kv_heads: int,
    *,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Normed, rotated q [T, Hq, D]; normed, rotated k and v written to the cache slots."""
    check_rank("qkv", qkv, 2)
    check_rank("cos_sin_cache", cos_sin_cache, 2)
    check_rank("k_cache", k_cache, 4)
    check_same_device(qkv=qkv, positions=positions, cos_sin_cache=cos_sin_cache,
                      k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens = qkv.shape[0]
    head_dim = k_cache.shape[3]
    if qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValidationError(f"qkv: expected [T, {(num_q_heads + 2 * num_kv_heads) * head_dim}]"
                              f" with contiguous rows, got {tuple(qkv.shape)}")
    if (k_cache.shape[2] != num_kv_heads or v_cache.shape != k_cache.shape or
            not k_cache.is_contiguous() or not v_cache.is_contiguous()):
        raise ValidationError(f"KV caches must be contiguous [pages, page_size, {num_kv_heads},"
                              f" {head_dim}], got {tuple(k_cache.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValidationError("q_norm and k_norm come together")
    for name, t in (("qkv", qkv), ("cos_sin_cache", cos_sin_cache)):
        check_float(name, t)
    check_kv_cache_dtype("k_cache", k_cache)
    if positions.shape != (num_tokens,) or slot_mapping.shape != (num_tokens,):
        raise ValidationError(f"positions and slot_mapping must be [{num_tokens}]")
    rot_dim = cos_sin_cache.shape[1]
    if rot_dim % 2 or rot_dim > head_dim or rot_dim == 0 or cos_sin_cache.stride(1) != 1:
        raise ValidationError(f"cos_sin_cache: rotary dim {rot_dim} must be even and <= "
                              f"{head_dim}, rows contiguous")
    shape = (num_tokens, num_q_heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=qkv.dtype, device=qkv.device)
    else:
        check_out("out", out, shape, qkv)
    if num_tokens == 0:
        return out
    rot_half = rot_dim // 2
    block_half = max(2, next_power_of_2(rot_half))
    rest = head_dim - rot_dim
    block_rest = next_power_of_2(rest) if rest else 0
    block_h = max(1, min(next_power_of_2(max(num_q_heads, num_kv_heads)), 1024 // block_half))
    q_chunks = cdiv(num_q_heads, block_h)
    has_norm = q_norm is not None
    weight = q_norm if q_norm is not None else qkv        # unused without the norm
    k_weight = k_norm if k_norm is not None else qkv
    grid = (num_tokens, q_chunks + cdiv(num_kv_heads, block_h))
    _qkv_prologue_kernel[grid](
        qkv, weight, k_weight, positions, cos_sin_cache, out, k_cache, v_cache, slot_mapping,
        num_q_heads, num_kv_heads, float(eps), qkv.stride(0), cos_sin_cache.stride(0),
        out.stride(0), out.stride(1), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(1), v_cache.stride(2),
        HEAD_DIM=head_dim, ROT_HALF=rot_half, IS_NEOX=bool(is_neox), HAS_NORM=has_norm,
        BLOCK_H=block_h, BLOCK_HALF=block_half, BLOCK_REST=block_rest,
        BLOCK_D=next_power_of_2(head_dim), Q_CHUNKS=q_chunks,
        num_warps=4, **launch_options(qkv.device, num_tokens),
    )
    return out
