"""The Llama family: Llama 2/3.x (attention and MLP biases when configured) and Mistral (all
layers slide over `sliding_window` when it is set). Pre-norm decoder layers with fused
qkv and gate/up projections (layers/decoder.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.engine.model.architecture import Architecture
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import (
    LayerAttention,
    ModelConfig,
    activation,
    shape_fields,
    single_rope,
)
from services.engine.model.layers import PreNormDecoderLayer


def uniform_layers(config: Mapping[str, Any], sliding_window: int = 0
                   ) -> tuple[LayerAttention, ...]:
    """Every layer alike: one rope, one window (0: full attention)."""
    rope = single_rope(config)
    count = int(config.get("num_hidden_layers") or 0)
    return tuple(LayerAttention(sliding_window, rope) for _ in range(count))


def parse_llama(config: Mapping[str, Any]) -> ModelConfig:
    name = "LlamaForCausalLM"
    bias = bool(config.get("attention_bias", False))
    return ModelConfig(**shape_fields(config, name), layers=uniform_layers(config),
                       qkv_bias=bias, o_bias=bias, mlp_bias=bool(config.get("mlp_bias", False)),
                       activation=activation(config, name))


def parse_mistral(config: Mapping[str, Any]) -> ModelConfig:
    name = "MistralForCausalLM"
    window = int(config.get("sliding_window") or 0)
    return ModelConfig(**shape_fields(config, name), layers=uniform_layers(config, window),
                       activation=activation(config, name))


class LlamaForCausalLM(CausalLM):
    layer_class = PreNormDecoderLayer


class MistralForCausalLM(LlamaForCausalLM):
    pass


ARCHITECTURES = (
    Architecture("LlamaForCausalLM", LlamaForCausalLM, parse_llama),
    Architecture("MistralForCausalLM", MistralForCausalLM, parse_mistral),
)
