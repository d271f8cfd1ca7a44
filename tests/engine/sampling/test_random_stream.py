"""Counter-based noise: exact integer hashing, uniformity, and dependence on (seed, position) only."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from services.engine.sampling import random_stream as rs

U32 = st.integers(0, (1 << 32) - 1)


def fmix32_python(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    return h ^ (h >> 16)


@settings(deadline=None)
@given(st.lists(U32, min_size=1, max_size=32), U32)
def test_mul32_is_multiplication_mod_2_32(values: list[int], constant: int) -> None:
    out = rs._mul32(torch.tensor(values, dtype=torch.int64), constant).tolist()
    assert out == [(v * constant) % (1 << 32) for v in values]


@settings(deadline=None)
@given(st.lists(U32, min_size=1, max_size=32))
def test_fmix32_is_murmur3s_finaliser(values: list[int]) -> None:
    out = rs.fmix32(torch.tensor(values, dtype=torch.int64)).tolist()
    assert out == [fmix32_python(v) for v in values]


def test_mix31_is_a_bijection_on_31_bits() -> None:
    values = torch.randperm(1 << 20, generator=torch.Generator().manual_seed(0)).long() * 2047
    values = torch.cat((values, torch.tensor([0, (1 << 31) - 1])))
    mixed = rs.mix31(values)
    assert mixed.min() >= 0 and mixed.max() < 1 << 31
    assert mixed.unique().numel() == values.unique().numel()
    # flipping one input bit flips about half the output bits (avalanche)
    flipped = rs.mix31(values[:4096] ^ (1 << 7)) ^ mixed[:4096]
    bits = sum(((flipped >> b) & 1).sum().item() for b in range(31)) / (4096 * 31)
    assert 0.45 < bits < 0.55


def test_uniforms_are_uniform_and_in_the_open_interval() -> None:
    keys = rs.row_keys(torch.tensor([0, 1, 7]), torch.tensor([0, 0, 3]),
                       torch.tensor([0, 0, 5]))
    u = rs.uniform_noise(keys, 60_000)
    assert u.dtype == torch.float32 and u.min() > 0 and u.max() < 1
    assert abs(float(u.mean()) - 0.5) < 0.005
    assert abs(float(u.var()) - 1 / 12) < 0.002
    histogram = torch.histc(u, bins=10, min=0, max=1) / u.numel()
    assert (histogram - 0.1).abs().max() < 0.005
    # rows are different streams; neighbouring tokens are uncorrelated
    assert abs(float(torch.corrcoef(u[:2])[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack((u[0, :-1], u[0, 1:])))[0, 1])) < 0.02


def test_a_rows_noise_depends_only_on_its_seed_and_position() -> None:
    lo, hi = rs.split_seed(0xDEADBEEF12345678)
    assert (lo, hi) == (0x12345678, 0xDEADBEEF)
    alone = rs.uniform_noise(rs.row_keys(torch.tensor([lo]), torch.tensor([hi]),
                                         torch.tensor([9])), 500)
    batch = rs.uniform_noise(rs.row_keys(torch.tensor([3, lo, 5]), torch.tensor([0, hi, 1]),
                                         torch.tensor([9, 9, 2])), 500)
    assert torch.equal(alone[0], batch[1])
    keys = rs.row_keys(torch.tensor([lo, lo, lo + 1, lo]), torch.tensor([hi, hi, hi, hi + 1]),
                       torch.tensor([9, 10, 9, 9]))
    assert len(set(keys.tolist())) == 4   # position, either seed half: all change the stream


def test_gumbel_noise_is_finite_even_where_the_uniform_rounds_to_one() -> None:
    """Key 32 * 7919 with token 112463 draws the largest 24-bit uniform, which rounds to 1.0 in
    float32: clamped below one, its noise stays finite, so a masked (-inf) token never turns
    NaN and wins the argmax (found by structured-output decoding)."""
    keys = torch.arange(64, dtype=torch.int64) * 7919
    uniforms = rs.uniform_noise(keys, 151936)
    assert float(uniforms.max()) < 1.0 and float(uniforms[32, 112463]) == 1.0 - 2.0 ** -24
    noise = rs.gumbel_noise(keys, 151936)
    assert torch.isfinite(noise).all()
    masked = torch.full((64, 151936), float("-inf"))
    masked[:, 7] = 0.0
    assert ((masked + noise).argmax(dim=-1) == 7).all()
