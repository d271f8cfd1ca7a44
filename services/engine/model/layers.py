"""One decoder layer of the Llama family: fused QKV attention over the paged KV cache + fused MLP.

Weights are fused at load: `qkv_proj` stacks q, k, v rows ([q_size + 2 * kv_size, H]) and
`gate_up_proj` stacks gate and up ([2 * I, H]). Parameters are allocated empty on the target
device; the loader fills them (services/engine/model/loader.py).
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata
from services.engine.model.config import ModelConfig


def empty_param(*shape: int, device: torch.device | str, dtype: torch.dtype) -> nn.Parameter:
    return nn.Parameter(torch.empty(*shape, device=device, dtype=dtype), requires_grad=False)


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size, self.kv_size = config.q_size, config.kv_size
        self.scale = config.head_dim ** -0.5
        self.eps = config.rms_norm_eps
        qkv_rows = config.q_size + 2 * config.kv_size
        self.qkv_weight = empty_param(qkv_rows, config.hidden_size, device=device, dtype=dtype)
        self.qkv_bias = empty_param(qkv_rows, device=device, dtype=dtype) if config.qkv_bias else None
        self.o_weight = empty_param(config.hidden_size, config.q_size, device=device, dtype=dtype)
        self.o_bias = (empty_param(config.hidden_size, device=device, dtype=dtype)
                       if config.o_bias else None)
        self.q_norm = empty_param(config.head_dim, device=device, dtype=dtype) if config.qk_norm else None
        self.k_norm = empty_param(config.head_dim, device=device, dtype=dtype) if config.qk_norm else None

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        """qkv [T, q + 2kv] (the layer projects it, fused with its input norm) -> [T, H]."""
        num_tokens = qkv.shape[0]
        # QK-norm, rotary and the K/V write (one kernel on CUDA)
        q = ops.qkv_prologue(qkv, self.q_norm, self.k_norm, self.eps, positions,
                             cos_sin_cache, True, k_cache, v_cache, meta.slot_mapping,
                             self.num_heads, self.num_kv_heads)           # [T, Hq, D]
        out = ops.paged_attention(q, k_cache, v_cache, meta, self.scale)  # [T, Hq, D]
        return ops.linear(out.reshape(num_tokens, self.q_size), self.o_weight, self.o_bias)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        inter, hidden = config.intermediate_size, config.hidden_size
        self.gate_up_weight = empty_param(2 * inter, hidden, device=device, dtype=dtype)
        self.gate_up_bias = (empty_param(2 * inter, device=device, dtype=dtype)
                             if config.mlp_bias else None)
        self.down_weight = empty_param(hidden, inter, device=device, dtype=dtype)
        self.down_bias = empty_param(hidden, device=device, dtype=dtype) if config.mlp_bias else None

    def forward(self, activation: torch.Tensor) -> torch.Tensor:
        """silu(gate) * up [T, I] (the layer computes it with its post-attention norm and the
        gate/up projection, fused) -> the down projection [T, H]."""
        return ops.linear(activation, self.down_weight, self.down_bias)


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype):
        super().__init__()
        self.eps = config.rms_norm_eps
        self.input_norm = empty_param(config.hidden_size, device=device, dtype=dtype)
        self.post_attention_norm = empty_param(config.hidden_size, device=device, dtype=dtype)
        self.attn = Attention(config, device, dtype)
        self.mlp = MLP(config, device, dtype)

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None, positions: torch.Tensor,
                cos_sin_cache: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                meta: AttentionMetadata) -> tuple[torch.Tensor, torch.Tensor]:
        """(x, residual) [T, H] -> (mlp output, residual): the residual add is deferred into
        the next norm, and each norm is fused with the projection after it (ops.norm_linear)."""
        attn, mlp = self.attn, self.mlp
        qkv, residual = ops.norm_linear(x, residual, self.input_norm, self.eps,
                                        attn.qkv_weight, attn.qkv_bias)      # [T, q + 2kv]
        x = attn(qkv, positions, cos_sin_cache, k_cache, v_cache, meta)
        activation, residual = ops.norm_linear(x, residual, self.post_attention_norm, self.eps,
                                               mlp.gate_up_weight, mlp.gate_up_bias,
                                               silu_mul=True)                # [T, I]
        return mlp(activation), residual
