"""apply_rotary against float64: NeoX and GPT-J pairings, full and partial rotary, GQA head
counts, strided q/k views of a fused qkv, in-place outputs."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.rotary import apply_rotary
from tests.kernels import reference

TOL = 1e-2  # bf16


def cos_sin_cache(max_pos: int, rot_dim: int, base: float = 10000.0) -> torch.Tensor:
    inv_freq = 1.0 / (base ** (torch.arange(0, rot_dim, 2, dtype=torch.float64) / rot_dim))
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float()


def _case(gen, device, tokens, hq, hk, d, rot, is_neox, max_pos=5000) -> None:
    qkv = torch.randn(tokens, (hq + 2 * hk) * d, generator=gen).to(torch.bfloat16).to(device)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    positions = torch.randint(0, max_pos, (tokens,), generator=gen).to(device)
    cache = cos_sin_cache(max_pos, rot).to(device)
    out_q, out_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    rq, rk = apply_rotary(q, k, positions, cache, is_neox, out_q=out_q, out_k=out_k)
    for out, x in ((rq, q), (rk, k)):
        ref = reference.rotary(x, positions, cache, is_neox)
        assert torch.isfinite(out).all()
        assert reference.rel_error(out, ref) < TOL
        assert reference.row_rel_errors(out, ref).max() < 3 * TOL
        if rot < d:
            assert torch.equal(out[..., rot:], x[..., rot:])  # the pass-through dims


@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(("tokens", "hq", "hk", "d", "rot"), [(5, 4, 2, 64, 64), (3, 6, 2, 32, 16), (2, 3, 1, 48, 48)])
def test_small(tokens, hq, hk, d, rot, is_neox, device, gen) -> None:
    _case(gen, device, tokens, hq, hk, d, rot, is_neox)


def test_in_place(device, gen) -> None:
    q = torch.randn(4, 2, 64, generator=gen).to(torch.bfloat16).to(device)
    k = torch.randn(4, 1, 64, generator=gen).to(torch.bfloat16).to(device)
    positions = torch.tensor([0, 1, 7, 300], device=device)
    cache = cos_sin_cache(512, 64).to(device)
    before_q, before_k = q.clone(), k.clone()
    ref_q, ref_k = reference.rotary(q, positions, cache, True), reference.rotary(k, positions, cache, True)
    rq, rk = apply_rotary(q, k, positions, cache, out_q=q, out_k=k)
    assert rq.data_ptr() == q.data_ptr() and rk.data_ptr() == k.data_ptr()
    assert reference.rel_error(q, ref_q) < TOL and reference.rel_error(k, ref_k) < TOL
    assert torch.equal(q[0], before_q[0]) and torch.equal(k[0], before_k[0])  # position 0: identity
    assert not torch.equal(q[1:], before_q[1:])


def test_bad_input(device) -> None:
    q = torch.randn(4, 2, 64, device=device)
    with pytest.raises(ValidationError):
        apply_rotary(q, torch.randn(3, 1, 64, device=device), torch.arange(4, device=device), torch.randn(10, 64, device=device))
    with pytest.raises(ValidationError):
        apply_rotary(q, torch.randn(4, 1, 64, device=device), torch.arange(4, device=device), torch.randn(10, 66, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("is_neox", [True, False])
@pytest.mark.parametrize(("hq", "hk", "d", "rot"), [(32, 8, 128, 128), (16, 8, 128, 128), (32, 32, 64, 64), (64, 8, 128, 64), (28, 4, 128, 128)])
@pytest.mark.parametrize("tokens", [1, 256, 5000])
def test_gpu_matrix(tokens, hq, hk, d, rot, is_neox, device, gen) -> None:
    _case(gen, device, tokens, hq, hk, d, rot, is_neox, max_pos=40000)
