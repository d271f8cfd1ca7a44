"""Qwen3-MoE (`Qwen3MoeForCausalLM`, e.g. Qwen3-30B-A3B): Qwen3 attention (QK-norm) with
sparse MLP blocks (moe.py): softmax top-k routing over `num_experts`, the k probabilities
renormalized when `norm_topk_prob`. Layer i is sparse unless it is in `mlp_only_layers` or
`(i + 1) % decoder_sparse_step != 0`; dense layers run the gated MLP of `intermediate_size`.
All layers slide over `sliding_window` when `use_sliding_window` is set (as transformers)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from services.common.errors import UnsupportedError, ValidationError
from services.engine.model.architecture import Architecture
from services.engine.model.config import (
    ModelConfig,
    MoEConfig,
    activation,
    malformed,
    shape_fields,
)
from services.engine.model.llama import uniform_layers
from services.engine.model.moe import MoECausalLM


def qwen3_moe_config(config: Mapping[str, Any], name: str) -> MoEConfig | None:
    """The sparse blocks of a Qwen3-MoE config (None when it has no experts)."""
    if int(config.get("shared_expert_intermediate_size") or 0) > 0:
        raise UnsupportedError(f"{name}: shared experts (shared_expert_intermediate_size) "
                               "are not supported", param="shared_expert_intermediate_size")
    try:
        count = int(config["num_hidden_layers"])
        # Qwen's config.json says num_experts; transformers 5 saves num_local_experts
        experts = int(config.get("num_experts") or config.get("num_local_experts") or 0)
        step = int(config.get("decoder_sparse_step") or 1)
        dense = {int(i) for i in config.get("mlp_only_layers") or ()}
        top_k = int(config.get("num_experts_per_tok") or 0)
        inter = int(config.get("moe_intermediate_size") or 0)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(name, exc) from exc
    if step < 1:
        raise ValidationError("config.json: decoder_sparse_step must be >= 1",
                              param="decoder_sparse_step")
    sparse = tuple(experts > 0 and i not in dense and (i + 1) % step == 0
                   for i in range(count))
    if not any(sparse):
        return None
    return MoEConfig(num_experts=experts, top_k=top_k, intermediate_size=inter,
                     sparse_layers=sparse, renormalize=bool(config.get("norm_topk_prob")))


def parse_qwen3_moe(config: Mapping[str, Any]) -> ModelConfig:
    name = "Qwen3MoeForCausalLM"
    bias = bool(config.get("attention_bias", False))
    window = int(config.get("sliding_window") or 0) if config.get("use_sliding_window") else 0
    return ModelConfig(**shape_fields(config, name), layers=uniform_layers(config, window),
                       qkv_bias=bias, o_bias=bias, qk_norm=True,
                       activation=activation(config, name), moe=qwen3_moe_config(config, name))


class Qwen3MoeForCausalLM(MoECausalLM):
    pass


ARCHITECTURES = (
    Architecture("Qwen3MoeForCausalLM", Qwen3MoeForCausalLM, parse_qwen3_moe),
)
