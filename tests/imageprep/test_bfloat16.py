"""float32 -> bfloat16 bits in numpy against torch's own CPU `.to(torch.bfloat16)`."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from services.imageprep.bfloat16 import BFLOAT16_NAN, to_bfloat16_bits


def torch_bits(values: np.ndarray) -> np.ndarray:
    converted = torch.from_numpy(np.ascontiguousarray(values)).to(torch.bfloat16)
    return converted.view(torch.int16).numpy().view(np.uint16)


def special_patterns() -> np.ndarray:
    """Bit patterns where rounding is delicate: ties (even and odd kept bit), just off ties,
    subnormals, the largest finite values (round to infinity), zeros, infinities, NaNs."""
    highs = np.array([0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3F81, 0x7F7E, 0x7F7F, 0x7F80,
                      0x7FC0, 0x7FFF], dtype=np.uint32)
    lows = np.array([0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF], dtype=np.uint32)
    positive = (highs[:, None] << 16 | lows[None, :]).reshape(-1)
    return np.concatenate([positive, positive | 0x80000000]).astype(np.uint32)


def test_special_values_match_torch():
    values = special_patterns().view(np.float32)
    assert np.array_equal(to_bfloat16_bits(values), torch_bits(values))


def test_random_bit_patterns_match_torch():
    # Every float32 class at once (random bits hit NaNs, subnormals and ties' neighbours);
    # longer than one block, and not a multiple of it, so the last partial block is checked.
    rng = np.random.default_rng(0)
    bits = rng.integers(0, 1 << 32, size=(1 << 17) + 12345, dtype=np.uint64).astype(np.uint32)
    bits[::7] &= 0xFFFF0000
    bits[::7] |= 0x8000                               # exact ties
    bits[::11] = (bits[::11] & 0x807FFFFF)            # subnormals
    values = bits.view(np.float32)
    assert np.array_equal(to_bfloat16_bits(values), torch_bits(values))


def test_pixel_like_values_and_shape():
    rng = np.random.default_rng(1)
    values = rng.normal(0, 2, size=(3996, 1176)).astype(np.float32)
    converted = to_bfloat16_bits(values)
    assert converted.shape == values.shape and converted.dtype == np.uint16
    assert np.array_equal(converted, torch_bits(values))


def test_nan_stays_nan_and_empty():
    values = np.array([np.nan, -np.nan, 1.0], dtype=np.float32)
    assert to_bfloat16_bits(values).tolist() == [BFLOAT16_NAN, BFLOAT16_NAN, 0x3F80]
    assert to_bfloat16_bits(np.empty((0, 4), np.float32)).shape == (0, 4)
    with pytest.raises(TypeError):
        to_bfloat16_bits(np.zeros(3, np.float64))
