"""qkv_prologue (QK-norm + rotary + KV write in one launch) against float64 references: with
and without QK-norm, NeoX and GPT-J pairs, full and partial rotary, GQA head counts, padding
rows that write nothing, and the model's composed torch ops."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.prologue import qkv_prologue
from services.engine.model.ops import composed_qkv_prologue
from tests.kernels import reference
from tests.kernels.test_rotary import cos_sin_cache

TOL = 1e-2  # bf16
EPS = 1e-6


def _case(gen, device, tokens, hq, hk, d, rot, is_neox, norm, pad=2, pages=6, page=4):
    n = tokens + pad
    qkv = (torch.randn(n, (hq + 2 * hk) * d, generator=gen) * 3).to(torch.bfloat16).to(device)
    q_w = (1 + 0.3 * torch.randn(d, generator=gen)).to(torch.bfloat16).to(device) if norm else None
    k_w = (1 + 0.3 * torch.randn(d, generator=gen)).to(torch.bfloat16).to(device) if norm else None
    positions = torch.randint(0, 900, (n,), generator=gen).to(device)
    cache = cos_sin_cache(1000, rot).to(device)
    shape = (pages, page, hk, d)
    k_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    v_cache = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    slots = torch.randperm(pages * page, generator=gen)[:tokens]
    slots = torch.cat([slots, torch.full((pad,), -1, dtype=torch.int64)]).to(device)
    out = torch.full((n, hq, d), float("nan"), dtype=torch.bfloat16, device=device)
    q = qkv_prologue(qkv, q_w, k_w, EPS, positions, cache, is_neox, k_cache, v_cache, slots,
                     hq, hk, out=out)
    assert q.data_ptr() == out.data_ptr()
    x_q = qkv[:, : hq * d].reshape(n, hq, d)
    x_k = qkv[:, hq * d : (hq + hk) * d].reshape(n, hk, d)
    x_v = qkv[:, (hq + hk) * d :].reshape(n, hk, d)
    if norm:
        x_q, x_k = reference.rms_norm(x_q, q_w, EPS), reference.rms_norm(x_k, k_w, EPS)
    ref_q = reference.rotary(x_q, positions, cache, is_neox)
    ref_k = reference.rotary(x_k, positions, cache, is_neox)
    assert torch.isfinite(q).all()
    assert reference.rel_error(q, ref_q) < TOL
    assert reference.row_rel_errors(q, ref_q).max() < 3 * TOL
    real = slots >= 0
    flat_k, flat_v = k_cache.view(-1, hk, d), v_cache.view(-1, hk, d)
    assert reference.rel_error(flat_k[slots[real]], ref_k[real]) < TOL
    assert torch.equal(flat_v[slots[real]], x_v[real])                    # v moves bit-exact
    untouched = torch.ones(pages * page, dtype=torch.bool, device=device)
    untouched[slots[real]] = False
    assert torch.isnan(flat_k[untouched]).all() and torch.isnan(flat_v[untouched]).all()
    if rot != d:
        return          # the model's torch rotary (the composed path) is full-rotary only
    # the model's composed ops (the CPU path) agree with the fused kernel
    k2 = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    v2 = torch.full(shape, float("nan"), dtype=torch.bfloat16, device=device)
    composed = composed_qkv_prologue(qkv, q_w, k_w, EPS, positions, cache, is_neox, k2, v2,
                                     slots, hq, hk)
    assert reference.rel_error(q, composed) < TOL
    assert reference.rel_error(flat_k[slots[real]], k2.view(-1, hk, d)[slots[real]]) < TOL


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(("tokens", "hq", "hk", "d", "rot"),
                         [(5, 4, 2, 64, 64), (3, 6, 2, 32, 16), (2, 3, 1, 48, 48)])
def test_small(tokens, hq, hk, d, rot, is_neox, norm, device, gen) -> None:
    _case(gen, device, tokens, hq, hk, d, rot, is_neox, norm)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", [1, 64, 2048])
@pytest.mark.parametrize(("hq", "hk"), [(32, 8), (16, 8), (64, 8)])
def test_model_shapes(tokens, hq, hk, device, gen) -> None:
    _case(gen, device, tokens, hq, hk, 128, 128, True, True, pad=5, pages=700, page=16)


def test_bad_input(device) -> None:
    qkv = torch.randn(3, (2 + 2) * 16, device=device)
    cache = torch.zeros(2, 4, 1, 16, device=device)
    cos = cos_sin_cache(8, 16).to(device)
    positions = torch.zeros(3, dtype=torch.int64, device=device)
    with pytest.raises(ValidationError):
        qkv_prologue(qkv, None, None, EPS, positions, cos, True, cache, cache,
                     positions, 3, 1)                       # 3 + 2 heads != 4 heads of qkv
    with pytest.raises(ValidationError):
        qkv_prologue(qkv, torch.ones(16, device=device), None, EPS, positions, cos, True,
                     cache, cache, positions, 2, 1)         # q_norm without k_norm
