"""Self-attention over the paged KV cache: fused qkv projection, optional QK-norm, rotary,
the K/V write and paged attention, then the output projection.

Each layer states its attention kind (`ModelConfig.layers[i]`): full causal attention, or a
sliding window of the last W positions, and which rotary table it rotates with
(`rope_index` into the model's tables; Gemma 3's sliding layers use their own base).
"""

from __future__ import annotations

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata
from services.engine.model.config import ModelConfig
from services.engine.model.fp8 import FP8_DTYPE
from services.engine.model.layers.fp8_linear import make_linear, make_packed_linear
from services.engine.model.layers.norm import RMSNorm


class Attention(nn.Module):
    k_scale: torch.Tensor   # buffers: FP8 KV scales per KV head (set_kv_scales)
    v_scale: torch.Tensor

    def __init__(self, config: ModelConfig, layer_index: int, *, device: torch.device | str,
                 dtype: torch.dtype, norm_offset: float = 0.0) -> None:
        super().__init__()
        kind = config.layers[layer_index]
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.q_size = config.q_size
        self.scale = config.attention_scale
        self.eps = config.rms_norm_eps
        self.sliding_window = kind.sliding_window
        self.rope_index = config.ropes.index(kind.rope)
        self.qkv_proj = make_packed_linear(
            config, config.hidden_size,
            {"q": config.q_size, "k": config.kv_size, "v": config.kv_size},
            bias=config.qkv_bias, device=device, dtype=dtype)
        self.o_proj = make_linear(config, config.q_size, config.hidden_size,
                                  bias=config.o_bias, device=device, dtype=dtype)
        # per-head attention sinks (gpt-oss): a family that has them sets an [Hq] parameter
        self.sinks: nn.Parameter | None = None
        # FP8 KV pages' per-head scales (float32 [Hk]: a cached value is k / k_scale); 1 until
        # set_kv_scales, and then the prologue's fused kernel stores plain e4m3 values
        self.register_buffer("k_scale", torch.ones(self.num_kv_heads, device=device),
                             persistent=False)
        self.register_buffer("v_scale", torch.ones(self.num_kv_heads, device=device),
                             persistent=False)
        self.kv_unit_scales = True
        self.q_norm = self.k_norm = None
        if config.qk_norm:
            self.q_norm = RMSNorm(config.head_dim, self.eps, device=device, dtype=dtype,
                                  offset=norm_offset)
            self.k_norm = RMSNorm(config.head_dim, self.eps, device=device, dtype=dtype,
                                  offset=norm_offset)

    @torch.inference_mode()
    def set_kv_scales(self, k_scale: torch.Tensor | float, v_scale: torch.Tensor | float
                      ) -> None:
        """FP8 KV scales: one per tensor (a number) or one per KV head ([Hk])."""
        for buffer, value in ((self.k_scale, k_scale), (self.v_scale, v_scale)):
            buffer.copy_(torch.as_tensor(value, dtype=torch.float32).expand(self.num_kv_heads))
        self.kv_unit_scales = bool(torch.all(self.k_scale == 1) and torch.all(self.v_scale == 1))

    def forward(self, qkv: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata
                ) -> torch.Tensor:
        """qkv [T, q + 2kv] (the layer projects it, fused with its input norm) -> [T, H]."""
        num_tokens = qkv.shape[0]
        q_norm = self.q_norm.weight if self.q_norm is not None else None
        k_norm = self.k_norm.weight if self.k_norm is not None else None
        # FP8 pages with scales: stored k / k_scale, v / v_scale; the scales come back as
        # q * k_scale (scores) and out * v_scale (per KV head, so per query-head group)
        scaled = k_cache.dtype == FP8_DTYPE and not self.kv_unit_scales
        kv_scales = (self.k_scale, self.v_scale) if scaled else None
        # QK-norm, rotary and the K/V write (one kernel on CUDA)
        q = ops.qkv_prologue(qkv, q_norm, k_norm, self.eps, positions, cos_sin_cache, True,
                             k_cache, v_cache, meta.slot_mapping, self.num_heads,
                             self.num_kv_heads, kv_scales)                     # [T, Hq, D]
        group = self.num_heads // self.num_kv_heads
        if scaled:
            q = q * self.k_scale.repeat_interleave(group)[:, None].to(q.dtype)
        out = ops.paged_attention(q, k_cache, v_cache, meta, self.scale,
                                  self.sliding_window, self.sinks)            # [T, Hq, D]
        if scaled:
            out = out * self.v_scale.repeat_interleave(group)[:, None].to(out.dtype)
        return self.o_proj(out.reshape(num_tokens, self.q_size))
