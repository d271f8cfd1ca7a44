"""Rotary position embeddings: the per-position cos/sin table every supported scaling yields.

The table `cos_sin_cache` [max_positions, D] holds, for position p, the cosines of the D/2
rotation angles in the first half and the sines in the second (the layout `ops.apply_rotary`
reads). Every scaling type reduces to "angles of position p" so the forward pass is the same
for all of them:

- default / linear / llama3 / yarn: fixed inverse frequencies (yarn also scales cos/sin).
- dynamic (NTK): position p uses the frequencies of a sequence of p + 1 tokens, i.e. the
  original ones up to max_position_embeddings and a growing base past it. A key's rotation thus
  depends only on its own position, which keeps cached prefixes valid; it equals the reference
  implementation's token-by-token decode.

The arithmetic mirrors transformers' float32 formulas so float32 runs match it exactly.
"""

from __future__ import annotations

import math

import torch

from services.engine.model.config import ModelConfig, RopeConfig


def _base_inv_freq(base: float | torch.Tensor, dim: int) -> torch.Tensor:
    exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim   # [D/2]
    return 1.0 / (base ** exponent)


def _llama3_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    inv_freq = _base_inv_freq(rope.theta, dim)
    old_context = rope.original_max_position_embeddings
    low_freq_wavelen = old_context / rope.low_freq_factor
    high_freq_wavelen = old_context / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor)
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def yarn_attention_factor(rope: RopeConfig) -> float:
    if rope.attention_factor is not None:
        return rope.attention_factor

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    if rope.mscale and rope.mscale_all_dim:
        return mscale(rope.factor, rope.mscale) / mscale(rope.factor, rope.mscale_all_dim)
    return mscale(rope.factor)


def _yarn_inv_freq(rope: RopeConfig, dim: int) -> torch.Tensor:
    base, original = rope.theta, rope.original_max_position_embeddings

    def correction_dim(num_rotations: float) -> float:
        return (dim * math.log(original / (num_rotations * 2 * math.pi))) / (2 * math.log(base))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # avoid a zero-width ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).to(torch.float32) / dim)
    extrapolation = 1.0 / pos_freqs
    interpolation = 1.0 / (rope.factor * pos_freqs)
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation_factor = 1 - ramp
    return interpolation * (1 - extrapolation_factor) + extrapolation * extrapolation_factor


def _dynamic_angles(rope: RopeConfig, dim: int, max_positions: int,
                    max_position_embeddings: int) -> torch.Tensor:
    """Angles [max_positions, D/2], frequencies grown per position past the original length."""
    positions = torch.arange(max_positions, dtype=torch.float32)
    angles = torch.outer(positions, _base_inv_freq(rope.theta, dim))
    if max_positions > max_position_embeddings:
        seq_len = torch.arange(max_position_embeddings + 1, max_positions + 1)  # p + 1, int64
        base = rope.theta * ((rope.factor * seq_len / max_position_embeddings)
                             - (rope.factor - 1)) ** (dim / (dim - 2))         # [P] float32
        exponent = torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float32) / dim
        inv_freq = 1.0 / (base[:, None] ** exponent[None, :])                  # [P, D/2]
        angles[max_position_embeddings:] = (
            positions[max_position_embeddings:, None] * inv_freq)
    return angles


def build_cos_sin_cache(config: ModelConfig, max_positions: int,
                        device: torch.device | str = "cpu", rope: RopeConfig | None = None
                        ) -> torch.Tensor:
    """The float32 [max_positions, head_dim] cos/sin table for `rope` (default: the config's
    full-attention rope; a model with several builds one table per `config.ropes` entry)."""
    rope, dim = rope or config.rope, config.head_dim
    scaling = 1.0
    if rope.rope_type == "dynamic":
        angles = _dynamic_angles(rope, dim, max_positions, config.max_position_embeddings)
    else:
        if rope.rope_type == "llama3":
            inv_freq = _llama3_inv_freq(rope, dim)
        elif rope.rope_type == "yarn":
            inv_freq = _yarn_inv_freq(rope, dim)
            scaling = yarn_attention_factor(rope)
        else:
            inv_freq = _base_inv_freq(rope.theta, dim)
            if rope.rope_type == "linear":
                inv_freq = inv_freq / rope.factor
        positions = torch.arange(max_positions, dtype=torch.float32)
        angles = torch.outer(positions, inv_freq)                       # [P, D/2]
    cache = torch.cat((angles.cos() * scaling, angles.sin() * scaling), dim=-1)
    return cache.to(device)
