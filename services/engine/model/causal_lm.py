"""CausalLM: embeddings -> decoder layers over the paged KV cache -> final norm -> logits.

The forward contract (see attention.py for the metadata):
    forward(input_ids int64 [T], positions int64 [T], kv_cache, meta) -> hidden [T, H]
writes the new tokens' K/V into the cache and returns the final-normed hidden states;
    compute_logits(hidden [N, H]) -> float32 [N, vocab].
forward never synchronises with the device: no .item()/.tolist() and no Python branches on
tensor values (on CUDA; the CPU attention path may read lengths), so the runner can capture
it in a CUDA graph. Positions must be below `max_positions` (the rotary table's length).
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata, KVCache
from services.engine.model.config import ModelConfig
from services.engine.model.layers import DecoderLayer, empty_param
from services.engine.model.rope import build_cos_sin_cache


class CausalLM(nn.Module):
    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                 max_positions: int):
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.max_positions = max_positions
        self.embed = empty_param(config.vocab_size, config.hidden_size, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            DecoderLayer(config, device, dtype) for _ in range(config.num_hidden_layers))
        self.norm = empty_param(config.hidden_size, device=device, dtype=dtype)
        self.lm_head = (None if config.tie_word_embeddings else
                        empty_param(config.vocab_size, config.hidden_size, device=device, dtype=dtype))
        self.cos_sin_cache: torch.Tensor
        self.register_buffer("cos_sin_cache", build_cos_sin_cache(config, max_positions, device),
                             persistent=False)       # [max_positions, D] float32

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def decoder_layers(self) -> list[DecoderLayer]:
        return [cast(DecoderLayer, layer) for layer in self.layers]

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.embed if self.lm_head is None else self.lm_head

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        x = F.embedding(input_ids, self.embed)                        # [T, H]
        residual: torch.Tensor | None = None
        for index, layer in enumerate(self.decoder_layers()):
            k_cache, v_cache = kv_cache.layer(index)
            x, residual = layer(x, residual, positions, self.cos_sin_cache, k_cache, v_cache,
                                meta)
        assert residual is not None
        hidden, _ = ops.fused_add_rms_norm(x, residual, self.norm, self.config.rms_norm_eps)
        return hidden                                                 # [T, H]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab]."""
        return ops.linear(hidden, self.lm_head_weight, out_dtype=torch.float32)
