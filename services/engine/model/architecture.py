"""What a registry entry says about one architecture (see registry.py for the table).

    Architecture(name="Qwen3ForCausalLM", model_class=Qwen3ForCausalLM,
                 parse_config=parse_qwen3)

`name` is the `architectures[0]` of a config.json; `parse_config` turns that config.json into
a `ModelConfig` (refusing what the family cannot run); `model_class` builds the model and
maps checkpoint tensor names onto its parameters (`CausalLM.checkpoint_target`). The
capability flags say what the engine may ask of the model.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from services.engine.model.config import ModelConfig

if TYPE_CHECKING:
    from services.engine.model.causal_lm import CausalLM


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What the engine may ask of an architecture's model."""

    vision: bool = False            # accepts image features merged into its embeddings
    position_rows: int = 1          # 1: positions [T]; 3: mRoPE positions [3, T]
    aux_hidden_states: bool = True  # can return selected layers' hidden states (drafters)


@dataclass(frozen=True, slots=True)
class Architecture:
    name: str                                            # config.json architectures[0]
    model_class: type[CausalLM]
    parse_config: Callable[[Mapping[str, Any]], ModelConfig]
    capabilities: Capabilities = Capabilities()
