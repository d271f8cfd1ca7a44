"""Gemma 3 (text): `Gemma3ForCausalLM`, and the language model of
`Gemma3ForConditionalGeneration` checkpoints (its vision tower is not loaded; such a core
serves text only).

How it differs from the Llama family:
- layers alternate sliding-window and full attention (`layer_types`, else every
  `sliding_window_pattern`-th layer is full), each kind with its own rope base
  (`rope_local_base_freq` for sliding layers, `rope_theta` + scaling for full ones);
- four norms per layer: input, post-attention (on the attention output, before the residual
  add), pre- and post-feed-forward; every RMSNorm (QK-norm included) scales by 1 + w, stored
  here as w + 1 at load (layers/norm.py);
- embeddings are multiplied by sqrt(hidden_size); queries are scaled by
  query_pre_attn_scalar ** -0.5; the MLP is GELU(tanh)-gated; logits may be soft-capped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch
from torch import nn

from services.common.errors import UnsupportedError
from services.engine.model import ops
from services.engine.model.architecture import Architecture
from services.engine.model.attention import AttentionMetadata
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import (
    LayerAttention,
    ModelConfig,
    activation,
    layer_types,
    parse_rope,
    shape_fields,
)
from services.engine.model.layers import Attention, GatedMLP, RMSNorm

DEFAULT_GLOBAL_THETA = 1_000_000.0
DEFAULT_LOCAL_THETA = 10_000.0
DEFAULT_PATTERN = 6


def gemma3_layers(config: Mapping[str, Any]) -> tuple[LayerAttention, ...]:
    count = int(config.get("num_hidden_layers") or 0)
    window = int(config.get("sliding_window") or 0)
    types = layer_types(config, count)
    if types is None:
        pattern = int(config.get("sliding_window_pattern") or
                      config.get("_sliding_window_pattern") or DEFAULT_PATTERN)
        types = ["sliding_attention" if (i + 1) % pattern else "full_attention"
                 for i in range(count)]
    params = config.get("rope_parameters") or {}
    if "full_attention" in params or "sliding_attention" in params:   # transformers 5 layout
        full = dict(params.get("full_attention") or {})
        local = dict(params.get("sliding_attention") or {})
    else:                                                              # the original layout
        full = dict(config.get("rope_scaling") or params or {})
        local = {"rope_type": "default",
                 "rope_theta": config.get("rope_local_base_freq", DEFAULT_LOCAL_THETA)}
    full.setdefault("rope_theta", config.get("rope_theta", DEFAULT_GLOBAL_THETA))
    local.setdefault("rope_theta", DEFAULT_LOCAL_THETA)
    full_rope, local_rope = parse_rope(full, config), parse_rope(local, config)
    return tuple(LayerAttention(window, local_rope) if kind == "sliding_attention"
                 else LayerAttention(0, full_rope) for kind in types)


def parse_gemma3_text(config: Mapping[str, Any], name: str = "Gemma3ForCausalLM"
                      ) -> ModelConfig:
    if config.get("attn_logit_softcapping") is not None:
        raise UnsupportedError(f"{name}: attention logit soft-capping is not supported",
                               param="attn_logit_softcapping")
    if config.get("use_bidirectional_attention"):
        raise UnsupportedError(f"{name}: bidirectional attention (an embedding model) is not "
                               "supported", param="use_bidirectional_attention")
    fields = shape_fields(config, name)
    fields["tie_word_embeddings"] = bool(config.get("tie_word_embeddings", True))
    bias = bool(config.get("attention_bias", False))
    scalar = float(config.get("query_pre_attn_scalar") or fields["head_dim"])
    return ModelConfig(
        **fields, layers=gemma3_layers(config), qkv_bias=bias, o_bias=bias, qk_norm=True,
        activation=activation(config, name, default="gelu_pytorch_tanh"),
        query_scale=scalar ** -0.5, embedding_multiplier=fields["hidden_size"] ** 0.5,
        final_logit_softcap=float(config.get("final_logit_softcapping") or 0.0))


def parse_gemma3_conditional(config: Mapping[str, Any]) -> ModelConfig:
    """The text config of a vision-language checkpoint (its vision config is ignored)."""
    name = "Gemma3ForConditionalGeneration"
    text = dict(config.get("text_config") or {})
    text.setdefault("tie_word_embeddings", config.get("tie_word_embeddings", True))
    text.setdefault("torch_dtype", config.get("torch_dtype") or config.get("dtype"))
    text.setdefault("vocab_size", config.get("vocab_size", 262208))
    # transformers' Gemma3ForConditionalGeneration does not soft-cap its logits (its text
    # model does); the released configs set no cap either way
    text["final_logit_softcapping"] = None
    return parse_gemma3_text(text, name)


class Gemma3DecoderLayer(nn.Module):
    """Sandwich norms: norm -> attention -> norm, add; norm -> MLP -> norm, add (the adds
    deferred into the next norm, as in the Llama family's layer)."""

    def __init__(self, config: ModelConfig, layer_index: int, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        size, eps = config.hidden_size, config.rms_norm_eps
        self.eps = eps

        def norm() -> RMSNorm:
            return RMSNorm(size, eps, device=device, dtype=dtype, offset=1.0)

        self.input_layernorm = norm()
        self.self_attn = Attention(config, layer_index, device=device, dtype=dtype,
                                   norm_offset=1.0)
        self.post_attention_layernorm = norm()
        self.pre_feedforward_layernorm = norm()
        self.mlp = GatedMLP(config, device=device, dtype=dtype)
        self.post_feedforward_layernorm = norm()

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = ops.norm_linear(x, residual, self.input_layernorm.weight, self.eps,
                                        attn.qkv_proj.linear_weight, attn.qkv_proj.bias)
        out = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)      # [T, H]
        out = ops.rms_norm(out, self.post_attention_layernorm.weight, self.eps)
        act, residual = ops.norm_linear(out, residual, self.pre_feedforward_layernorm.weight,
                                        self.eps, mlp.gate_up_proj.linear_weight,
                                        mlp.gate_up_proj.bias, activation=mlp.activation)
        out = ops.rms_norm(mlp(act), self.post_feedforward_layernorm.weight, self.eps)
        return out, residual


class Gemma3ForCausalLM(CausalLM):
    norm_offset = 1.0
    layer_class = Gemma3DecoderLayer


class Gemma3ForConditionalGeneration(Gemma3ForCausalLM):
    # transformers 5 saves `model.language_model.*`, earlier releases `language_model.model.*`
    checkpoint_prefixes: ClassVar[dict[str, str]] = {"model.language_model.": "model.",
                                                     "language_model.model.": "model.",
                                                     "language_model.lm_head.": "lm_head."}
    ignored_checkpoint_prefixes = ("model.vision_tower.", "model.multi_modal_projector.",
                                   "vision_tower.", "multi_modal_projector.")


ARCHITECTURES = (
    Architecture("Gemma3ForCausalLM", Gemma3ForCausalLM, parse_gemma3_text),
    Architecture("Gemma3ForConditionalGeneration", Gemma3ForConditionalGeneration,
                 parse_gemma3_conditional),
)
