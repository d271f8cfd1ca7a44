"""The cos/sin table equals transformers' rotary embedding for every scaling, at long positions."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from services.engine.model import ModelConfig
from services.engine.model.rope import build_cos_sin_cache

ROPES = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 512},
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 1024},
    "yarn-mscale": {"rope_type": "yarn", "factor": 40.0, "mscale": 1.0,
                    "mscale_all_dim": 0.707, "beta_fast": 16, "beta_slow": 2,
                    "original_max_position_embeddings": 1024},
}


def _configs(rope: dict | None, max_positions: int) -> tuple[LlamaConfig, ModelConfig]:
    hf = LlamaConfig(hidden_size=128, num_attention_heads=2, num_key_value_heads=1,
                     max_position_embeddings=max_positions, rope_theta=500000.0,
                     rope_scaling=rope, vocab_size=16, intermediate_size=32)
    ours = ModelConfig.from_dict({**hf.to_dict(), "architectures": ["LlamaForCausalLM"]})
    return hf, ours


@pytest.mark.parametrize("name", ROPES)
def test_cos_sin_cache_matches_transformers(name: str) -> None:
    hf_config, config = _configs(ROPES[name], 4096)
    positions = torch.tensor([[0, 1, 7, 511, 512, 1000, 2047, 4095]])
    cos, sin = LlamaRotaryEmbedding(hf_config)(torch.zeros(1, dtype=torch.float32), positions)
    cache = build_cos_sin_cache(config, 4096)[positions[0]]          # [P, D]
    half = config.head_dim // 2
    torch.testing.assert_close(cache[:, :half], cos[0, :, :half], rtol=0, atol=2e-6)
    torch.testing.assert_close(cache[:, half:], sin[0, :, :half], rtol=0, atol=2e-6)


def test_dynamic_rope_grows_per_position_like_token_by_token_decode() -> None:
    hf_config, config = _configs({"rope_type": "dynamic", "factor": 2.0}, 64)
    cache = build_cos_sin_cache(config, config.max_context)
    assert cache.shape == (128, config.head_dim)
    rotary = LlamaRotaryEmbedding(hf_config)
    half = config.head_dim // 2
    for position in range(0, 128, 9):   # transformers grows its base as decode passes 64
        cos, sin = rotary(torch.zeros(1), torch.tensor([[position]]))
        torch.testing.assert_close(cache[position, :half], cos[0, 0, :half], rtol=0, atol=2e-6)
        torch.testing.assert_close(cache[position, half:], sin[0, 0, :half], rtol=0, atol=2e-6)
    default = build_cos_sin_cache(_configs(None, 64)[1], 128)
    assert torch.equal(cache[:64], default[:64]) and not torch.allclose(cache[64:], default[64:])
