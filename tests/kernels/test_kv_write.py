"""write_kv: every new key/value lands bit-exact in its slot, padding rows (slot -1) write
nothing, and no other slot changes (the cache starts poisoned with NaN)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.kv_write import write_kv


def _case(gen, device, num_pages, page, hk, d, tokens, pad, strided) -> None:
    shape = (num_pages, page, hk, d)
    k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    slots = torch.randperm(num_pages * page, generator=gen)[:tokens]
    slots = torch.cat([slots, torch.full((pad,), -1, dtype=torch.int64)])
    slots = slots[torch.randperm(len(slots), generator=gen)].to(device)
    n = tokens + pad
    if strided:  # k and v as views of a fused qkv projection
        qkv = torch.randn(n, (4 + 2) * hk * d, generator=gen).to(torch.bfloat16).to(device)
        k = qkv[:, 4 * hk * d : 5 * hk * d].view(n, hk, d)
        v = qkv[:, 5 * hk * d :].view(n, hk, d)
    else:
        k = torch.randn(n, hk, d, generator=gen).to(torch.bfloat16).to(device)
        v = torch.randn(n, hk, d, generator=gen).to(torch.bfloat16).to(device)
    write_kv(k, v, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(-1, hk, d), v_cache.view(-1, hk, d)
    real = slots >= 0
    assert torch.equal(flat_k[slots[real]], k[real])
    assert torch.equal(flat_v[slots[real]], v[real])
    untouched = torch.ones(num_pages * page, dtype=torch.bool, device=device)
    untouched[slots[real]] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()


@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize(("num_pages", "page", "hk", "d", "tokens", "pad"), [(4, 16, 2, 64, 20, 3), (9, 1, 3, 48, 7, 0), (3, 5, 1, 128, 15, 2)])
def test_small(num_pages, page, hk, d, tokens, pad, strided, device, gen) -> None:
    _case(gen, device, num_pages, page, hk, d, tokens, pad, strided)


def test_bad_input(device) -> None:
    cache = torch.zeros(2, 16, 2, 64, device=device)
    k = torch.randn(3, 2, 64, device=device)
    with pytest.raises(ValidationError):
        write_kv(k, k, cache, cache, torch.zeros(2, dtype=torch.int64, device=device))
    with pytest.raises(ValidationError):
        write_kv(k, k, torch.zeros(2, 16, 4, 64, device=device), cache, torch.zeros(3, dtype=torch.int64, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("strided", [False, True])
@pytest.mark.parametrize(("num_pages", "page", "hk", "d", "tokens", "pad"), [(2000, 16, 8, 128, 256, 0), (3000, 16, 8, 128, 8192, 31), (100, 64, 4, 64, 1000, 7), (50000, 1, 8, 128, 4096, 1)])
def test_gpu_matrix(num_pages, page, hk, d, tokens, pad, strided, device, gen) -> None:
    _case(gen, device, num_pages, page, hk, d, tokens, pad, strided)
