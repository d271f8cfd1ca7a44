"""The pre-norm decoder layer of the Llama family (Llama, Mistral, Qwen2, Qwen3).

    x, residual = layer(x, residual, positions, cos_sin_cache, k_cache, v_cache, meta)

The residual add is deferred into the next norm, and each norm is fused with the projection
after it (`ops.norm_linear`): input norm + qkv, attention, post-attention norm + gate/up +
activation, down. `residual` is None for the first layer (then the embeddings are the
residual); the true hidden state after a layer is `x + residual`.
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata
from services.engine.model.config import ModelConfig
from services.engine.model.layers.attention import Attention
from services.engine.model.layers.mlp import GatedMLP
from services.engine.model.layers.norm import RMSNorm


class PreNormDecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_index: int, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_layernorm = RMSNorm(config.hidden_size, self.eps, device=device, dtype=dtype)
        self.self_attn = Attention(config, layer_index, device=device, dtype=dtype)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, self.eps, device=device,
                                                dtype=dtype)
        self.mlp = GatedMLP(config, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        attn, mlp = self.self_attn, self.mlp
        qkv, residual = ops.norm_linear(x, residual, self.input_layernorm.weight, self.eps,
                                        attn.qkv_proj.linear_weight, attn.qkv_proj.bias)  # [T, q+2kv]
        x = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)
        activation, residual = ops.norm_linear(
            x, residual, self.post_attention_layernorm.weight, self.eps,
            mlp.gate_up_proj.linear_weight, mlp.gate_up_proj.bias,
            activation=mlp.activation)  # [T, I]
        return mlp(activation), residual
