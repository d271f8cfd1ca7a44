"""The gated MLP: gate/up projections fused into one [2I, H] weight, an activation of the
gate times up (`ModelConfig.activation`: SiLU or tanh-approximated GELU), the down projection.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model.config import ModelConfig
from services.engine.model.layers.fp8_linear import make_linear, make_packed_linear


class GatedMLP(nn.Module):
    def __init__(self, config: ModelConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        inter, hidden = config.intermediate_size, config.hidden_size
        self.activation = config.activation
        self.gate_up_proj = make_packed_linear(config, hidden, {"gate": inter, "up": inter},
                                               bias=config.mlp_bias, device=device,
                                               dtype=dtype)
        self.down_proj = make_linear(config, inter, hidden, bias=config.mlp_bias,
                                     device=device, dtype=dtype)

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        """act(gate) * up [T, I] (the layer computes it with its norm and the gate/up
        projection, fused: ops.norm_linear) -> the down projection [T, H]."""
        return self.down_proj(activation)
