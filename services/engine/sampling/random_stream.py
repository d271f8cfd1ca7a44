"""Counter-based randomness: noise that is a pure function of (seed, output position, token id).

No generator state: a row's noise depends only on its own seed and how many tokens it has
generated, never on its batch neighbours, the step it runs in, preemption or chunking; and it
is computed with plain integer tensor ops, so the same code runs inside a CUDA graph.

Row keys (seed halves, position) and token ids are hashed with MurmurHash3's 32-bit finaliser
(cheap: N and V values); the [N, V] part, the only large one, is one xor and a 31-bit
multiply-xorshift mix (`mix31`), about ten elementwise ops. Every intermediate stays in int64
below 2**63 (32-bit multiplies are split into 16-bit halves; 31-bit values times 32-bit
constants cannot overflow), so nothing relies on signed overflow behaving the same everywhere.
"""

from __future__ import annotations

import torch

_MASK16 = 0xFFFF
_MASK31 = 0x7FFFFFFF
_MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B1        # odd: multiplying by it permutes 32-bit integers
_POSITION_SALT = 0x27D4EB2F
_SEED_SALT = 0x165667B1
_BELOW_ONE = 1.0 - 2.0 ** -24   # the largest float32 below 1


def _mul32(x: torch.Tensor, constant: int) -> torch.Tensor:
    """(x * constant) mod 2**32 for int64 x in [0, 2**32), without overflowing int64."""
    low = (x & _MASK16) * constant                       # < 2**48
    high = ((x >> 16) * constant) & _MASK16              # the part that survives the shift
    return (low + (high << 16)) & _MASK32


def fmix32(h: torch.Tensor) -> torch.Tensor:
    """MurmurHash3 finaliser: a bijection on [0, 2**32) with full avalanche."""
    h = h ^ (h >> 16)
    h = _mul32(h, 0x85EBCA6B)
    h = h ^ (h >> 13)
    h = _mul32(h, 0xC2B2AE35)
    return h ^ (h >> 16)


def mix31(h: torch.Tensor) -> torch.Tensor:
    """A bijection on [0, 2**31): xorshift / odd multiply rounds (products stay below 2**63)."""
    h = h ^ (h >> 15)
    h = (h * 0x7FEB352D) & _MASK31
    h = h ^ (h >> 13)
    h = (h * 0x846CA68B) & _MASK31
    return h ^ (h >> 16)


def split_seed(seed: int) -> tuple[int, int]:
    """A 64-bit seed as (low, high) 32-bit halves (int64 tensors cannot hold 2**64 - 1)."""
    return seed & _MASK32, (seed >> 32) & _MASK32


def row_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor, positions: torch.Tensor
             ) -> torch.Tensor:
    """int64 [N] keys in [0, 2**31) for each row's (seed, output position)."""
    key = fmix32(seed_lo ^ _SEED_SALT)
    key = fmix32(key ^ seed_hi)
    return fmix32(key ^ _mul32(positions & _MASK32, _POSITION_SALT)) & _MASK31


def token_keys(vocab_size: int, device: torch.device) -> torch.Tensor:
    """int64 [V] keys in [0, 2**31), one per token id."""
    tokens = torch.arange(vocab_size, device=device, dtype=torch.int64)
    return fmix32(_mul32(tokens, _GOLDEN)) & _MASK31


def uniform_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [N, V] uniforms in (0, 1): one independent draw per (row, token).

    The largest draw, (2**24 - 0.5) / 2**24, rounds to 1.0 in float32; it is clamped to the
    float below 1, so the Gumbel noise is never +inf (about one token in 2**24, ~1% of rows
    per step over a 150k vocabulary): +inf would win any argmax, and against a -inf logit
    (a token a filter or a grammar masked) give NaN, which argmax picks."""
    h = mix31(keys[:, None] ^ token_keys(vocab_size, keys.device)[None, :])   # [N, V]
    uniform = ((h >> 7).to(torch.float32) + 0.5) * (1.0 / (1 << 24))
    return uniform.clamp_(max=_BELOW_ONE)


def gumbel_noise(keys: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """float32 [N, V] Gumbel(0, 1) noise: argmax(logits + noise) samples softmax(logits).

    This is the exponential race: with E = -log(u) ~ Exp(1), argmax(p / E) picks token v with
    probability p_v, and log(p / E) = logits + (-log E) up to a per-row constant.
    """
    return -torch.log(-torch.log(uniform_noise(keys, vocab_size)))
