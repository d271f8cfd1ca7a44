"""Mixtral (`MixtralForCausalLM`): Mistral attention with every MLP sparse (moe.py): softmax
over `num_local_experts`, the top `num_experts_per_tok` renormalized, experts of
`intermediate_size`. Checkpoints name the block `block_sparse_moe` and the experts'
projections `w1` (gate), `w3` (up), `w2` (down); all layers slide over `sliding_window` when
it is set."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

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


def parse_mixtral(config: Mapping[str, Any]) -> ModelConfig:
    name = "MixtralForCausalLM"
    fields = shape_fields(config, name)
    try:
        moe = MoEConfig(num_experts=int(config["num_local_experts"]),
                        top_k=int(config["num_experts_per_tok"]),
                        intermediate_size=fields["intermediate_size"],
                        sparse_layers=(True,) * fields["num_hidden_layers"], renormalize=True)
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(name, exc) from exc
    window = int(config.get("sliding_window") or 0)
    return ModelConfig(**fields, layers=uniform_layers(config, window),
                       activation=activation(config, name), moe=moe)


class MixtralForCausalLM(MoECausalLM):
    moe_block_name: ClassVar[str] = "block_sparse_moe"
    expert_projection_names: ClassVar[dict[str, str]] = {"gate": "w1", "up": "w3", "down": "w2"}


ARCHITECTURES = (
    Architecture("MixtralForCausalLM", MixtralForCausalLM, parse_mixtral),
)
