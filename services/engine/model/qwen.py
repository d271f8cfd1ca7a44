"""The Qwen text family: Qwen2/2.5 (qkv bias) and Qwen3 (QK-norm). Layers from
`max_window_layers` on slide over `sliding_window` when `use_sliding_window` is set (or as
`layer_types` says); the rest attend fully."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar

from services.engine.model.architecture import Architecture
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import (
    LayerAttention,
    ModelConfig,
    activation,
    layer_types,
    shape_fields,
    single_rope,
)
from services.engine.model.layers import PreNormDecoderLayer


def qwen_layers(config: Mapping[str, Any]) -> tuple[LayerAttention, ...]:
    count = int(config.get("num_hidden_layers") or 0)
    rope = single_rope(config)
    window = int(config.get("sliding_window") or 0)
    types = layer_types(config, count)
    if types is None:
        first = int(config.get("max_window_layers", 28))
        sliding = bool(config.get("use_sliding_window")) and window > 0
        types = ["sliding_attention" if sliding and i >= first else "full_attention"
                 for i in range(count)]
    return tuple(LayerAttention(window if kind == "sliding_attention" else 0, rope)
                 for kind in types)


def parse_qwen2(config: Mapping[str, Any]) -> ModelConfig:
    name = "Qwen2ForCausalLM"
    return ModelConfig(**shape_fields(config, name), layers=qwen_layers(config),
                       qkv_bias=True, activation=activation(config, name))


def parse_qwen3(config: Mapping[str, Any]) -> ModelConfig:
    name = "Qwen3ForCausalLM"
    bias = bool(config.get("attention_bias", False))
    return ModelConfig(**shape_fields(config, name), layers=qwen_layers(config),
                       qkv_bias=bias, o_bias=bias, qk_norm=True,
                       activation=activation(config, name))


class Qwen2ForCausalLM(CausalLM):
    layer_class = PreNormDecoderLayer


class Qwen3ForCausalLM(Qwen2ForCausalLM):
    pass


def parse_qwen3_model(config: Mapping[str, Any]) -> ModelConfig:
    """A Qwen3 checkpoint saved as the bare `Qwen3Model` (embedding models such as
    Qwen3-Embedding): no lm_head, so the output projection is tied to the embeddings (only
    the pooled final hidden states serve; logits exist for prompt scoring)."""
    parsed = parse_qwen3(config)
    return dataclasses.replace(parsed, architecture="Qwen3Model", tie_word_embeddings=True)


class Qwen3Model(Qwen3ForCausalLM):
    """`Qwen3Model` tensor names lack the `model.` prefix (embed_tokens, layers, norm)."""

    checkpoint_prefixes: ClassVar[dict[str, str]] = {
        "embed_tokens.": "model.embed_tokens.", "layers.": "model.layers.",
        "norm.": "model.norm."}


ARCHITECTURES = (
    Architecture("Qwen2ForCausalLM", Qwen2ForCausalLM, parse_qwen2),
    Architecture("Qwen3ForCausalLM", Qwen3ForCausalLM, parse_qwen3),
    Architecture("Qwen3Model", Qwen3Model, parse_qwen3_model),
)
