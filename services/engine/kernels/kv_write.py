"""Write the step's new keys and values into the paged KV cache (in place).

    write_kv(k [T, Hk, D], v [T, Hk, D], k_cache, v_cache [pages, page_size, Hk, D], slot_mapping [T])

`slot_mapping[t] = page * page_size + offset`; a negative slot marks a padding row, which is
not written. One program per token moves all of its heads for k and v. The slot is read on the
device, so the wrapper never synchronizes and a CUDA graph can capture it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.common.errors import ValidationError
from services.engine.kernels.common import (
    check_float,
    check_kv_cache_dtype,
    check_last_dim_contiguous,
    check_rank,
    check_same_device,
    next_power_of_2,
)
from services.engine.kernels.fp8_quant import cast_for_cache


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_heads, head_dim,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_page, stride_kc_off, stride_kc_head,
    stride_vc_page, stride_vc_off, stride_vc_head,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    SCALED: tl.constexpr = False,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    page = slot // PAGE_SIZE
    offset = slot % PAGE_SIZE
    h = tl.arange(0, BLOCK_H)
    d = tl.arange(0, BLOCK_D)
    mask = (h < num_heads)[:, None] & (d < head_dim)[None, :]
    k = tl.load(k_ptr + token * stride_kt + h[:, None] * stride_kh + d[None, :], mask=mask)
    v = tl.load(v_ptr + token * stride_vt + h[:, None] * stride_vh + d[None, :], mask=mask)
    if SCALED:  # FP8 pages with per-head scales: store value / scale
        k_s = tl.load(k_scale_ptr + h, mask=h < num_heads, other=1.0)
        v_s = tl.load(v_scale_ptr + h, mask=h < num_heads, other=1.0)
        k = tl.div_rn(k.to(tl.float32), k_s[:, None])
        v = tl.div_rn(v.to(tl.float32), v_s[:, None])
    kc = k_cache_ptr + page * stride_kc_page + offset * stride_kc_off
    vc = v_cache_ptr + page * stride_vc_page + offset * stride_vc_off
    tl.store(
        kc + h[:, None] * stride_kc_head + d[None, :],
        cast_for_cache(k, k_cache_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        vc + h[:, None] * stride_vc_head + d[None, :],
        cast_for_cache(v, v_cache_ptr.dtype.element_ty),
        mask=mask,
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> None:
    """Store k[t], v[t] at cache slot `slot_mapping[t]` for every t whose slot is >= 0. FP8
    caches store e4m3 values (rounded to nearest even), divided by `kv_scales` (float32
    [Hk] each, for K and V) when given."""
    for name, t in (("k", k), ("v", v)):
        check_rank(name, t, 3)
        check_float(name, t)
        check_last_dim_contiguous(name, t)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(name, t, 4)
        check_kv_cache_dtype(name, t)
        check_last_dim_contiguous(name, t)
    if kv_scales is not None and any(
            s.shape != (k.shape[1],) or s.dtype != torch.float32 or not s.is_contiguous()
            for s in kv_scales):
        raise ValidationError(f"kv_scales: expected two contiguous float32 [{k.shape[1]}]")
    check_same_device(k=k, v=v, k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens, num_heads, head_dim = k.shape
    if v.shape != k.shape:
        raise ValidationError(f"v: shape {tuple(v.shape)} != k {tuple(k.shape)}")
    if k_cache.shape != v_cache.shape or tuple(k_cache.shape[2:]) != (num_heads, head_dim):
        raise ValidationError(
            f"caches: expected [pages, page_size, {num_heads}, {head_dim}], "
            f"got k {tuple(k_cache.shape)} v {tuple(v_cache.shape)}"
        )
    if slot_mapping.shape != (num_tokens,) or slot_mapping.dtype not in (torch.int32, torch.int64):
        raise ValidationError(
            f"slot_mapping: expected int [{num_tokens}], got {tuple(slot_mapping.shape)} {slot_mapping.dtype}"
        )
    if num_tokens == 0:
        return
    _write_kv_kernel[(num_tokens,)](
        k, v, k_cache, v_cache, slot_mapping.contiguous(),
        *(kv_scales if kv_scales is not None else (slot_mapping, slot_mapping)),
        num_heads, head_dim,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_H=next_power_of_2(num_heads),
        BLOCK_D=next_power_of_2(head_dim),
        SCALED=kv_scales is not None,
        num_warps=4,
    )
