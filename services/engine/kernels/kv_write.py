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
    check_last_dim_contiguous,
    check_rank,
    check_same_device,
    next_power_of_2,
)


@triton.jit
def _write_kv_kernel(
    k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    num_heads, head_dim,
    stride_kt, stride_kh, stride_vt, stride_vh,
    stride_kc_page, stride_kc_off, stride_kc_head,
    stride_vc_page, stride_vc_off, stride_vc_head,
    PAGE_SIZE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
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
    kc = k_cache_ptr + page * stride_kc_page + offset * stride_kc_off
    vc = v_cache_ptr + page * stride_vc_page + offset * stride_vc_off
    tl.store(
        kc + h[:, None] * stride_kc_head + d[None, :],
        k.to(k_cache_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        vc + h[:, None] * stride_vc_head + d[None, :],
        v.to(v_cache_ptr.dtype.element_ty),
        mask=mask,
    )


def write_kv(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Store k[t], v[t] at cache slot `slot_mapping[t]` for every t whose slot is >= 0."""
    for name, t in (("k", k), ("v", v)):
        check_rank(name, t, 3)
        check_float(name, t)
        check_last_dim_contiguous(name, t)
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_rank(name, t, 4)
        check_float(name, t)
        check_last_dim_contiguous(name, t)
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
        num_heads, head_dim,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        PAGE_SIZE=k_cache.shape[1],
        BLOCK_H=next_power_of_2(num_heads),
        BLOCK_D=next_power_of_2(head_dim),
        num_warps=4,
    )
