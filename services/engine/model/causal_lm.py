"""CausalLM: the base of every architecture: embeddings -> decoder layers over the paged KV
cache -> final norm -> logits.

The forward contract (see attention.py for the metadata):

    out = model(ForwardBatch(input_ids [T], positions [T] (or [3, T]), meta), kv_cache)
    out.hidden        # [T, H] final-normed hidden states; the new tokens' K/V are written
    out.aux_hidden    # one [T, H] per layer in `model.aux_hidden_layers` (drafters), else ()
    logits = model.compute_logits(hidden [N, H])   # float32 [N, vocab]

The model computes its own input embeddings (`embed`), so a vision model can merge image
features there. forward never synchronises with the device: no .item()/.tolist() and no
Python branches on tensor values (on CUDA; the CPU attention path may read lengths), so the
runner can capture it in a CUDA graph. Positions must be below `max_positions` (the rotary
tables' length).

An architecture family subclasses CausalLM with its `layer_class` (one decoder layer: any
module with the `(x, residual, positions, cos_sin_cache, k_cache, v_cache, meta) -> (x,
residual)` call of layers/decoder.py) and, where its checkpoints differ, the name mapping
(`packed_modules`, `checkpoint_prefixes`, `ignored_checkpoint_*`). Parameter names mirror
the Hugging Face module names (`model.layers.3.self_attn.qkv_proj.weight`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import nn

from services.engine.model import ops
from services.engine.model.attention import AttentionMetadata, KVCache
from services.engine.model.config import ModelConfig
from services.engine.model.layers import Embedding, Linear, RMSNorm
from services.engine.model.rope import build_cos_sin_cache

if TYPE_CHECKING:
    from services.engine.model.vision.inputs import ImageEmbeds


@dataclass(frozen=True, slots=True)
class ForwardBatch:
    """One forward pass's packed inputs."""

    input_ids: torch.Tensor    # int64 [T]
    positions: torch.Tensor    # int64 [T]; [3, T] for models with position_rows == 3 (mRoPE)
    meta: AttentionMetadata
    # a vision model's image features for this batch's image-pad rows (vision/inputs.py
    # ImageEmbeds); None: text only
    images: ImageEmbeds | None = None

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


@dataclass(frozen=True, slots=True)
class ModelOutput:
    hidden: torch.Tensor                       # [T, H] after the final norm
    aux_hidden: tuple[torch.Tensor, ...] = ()  # [T, H] per aux_hidden_layers entry


class TextModel(nn.Module):
    """The `model.` part of a checkpoint: embeddings, layers, final norm."""

    def __init__(self, embed_tokens: Embedding, layers: list[nn.Module], norm: RMSNorm) -> None:
        super().__init__()
        self.embed_tokens = embed_tokens
        self.layers = nn.ModuleList(layers)
        self.norm = norm


class CausalLM(nn.Module):
    # checkpoint module name -> (parameter module name, shard) for fused parameters
    packed_modules: ClassVar[dict[str, tuple[str, str]]] = {
        "q_proj": ("qkv_proj", "q"), "k_proj": ("qkv_proj", "k"), "v_proj": ("qkv_proj", "v"),
        "gate_proj": ("gate_up_proj", "gate"), "up_proj": ("gate_up_proj", "up")}
    checkpoint_prefixes: ClassVar[dict[str, str]] = {}   # checkpoint prefix -> model prefix
    ignored_checkpoint_suffixes: ClassVar[tuple[str, ...]] = ("rotary_emb.inv_freq",)
    ignored_checkpoint_prefixes: ClassVar[tuple[str, ...]] = ()
    norm_offset: ClassVar[float] = 0.0   # what norm weights are stored without (Gemma: 1)
    position_rows: ClassVar[int] = 1
    # the family's decoder layer: (config, layer_index, *, device, dtype) -> module
    layer_class: ClassVar[Callable[..., nn.Module]]

    def __init__(self, config: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                 max_positions: int) -> None:
        super().__init__()
        self.config = config
        self.dtype = dtype
        self.max_positions = max_positions
        embed = Embedding(config.vocab_size, config.hidden_size, device=device, dtype=dtype,
                          multiplier=config.embedding_multiplier)
        layers = [self.layer_class(config, i, device=device, dtype=dtype)
                  for i in range(config.num_hidden_layers)]
        norm = RMSNorm(config.hidden_size, config.rms_norm_eps, device=device, dtype=dtype,
                       offset=self.norm_offset)
        self.model = TextModel(embed, layers, norm)
        self.lm_head = (None if config.tie_word_embeddings else
                        Linear(config.hidden_size, config.vocab_size, bias=False,
                               device=device, dtype=dtype))
        self.rope_tables: list[torch.Tensor] = []      # [max_positions, D] float32 each
        for index, rope in enumerate(config.ropes):
            table = build_cos_sin_cache(config, max_positions, device, rope)
            self.register_buffer(f"cos_sin_cache_{index}", table, persistent=False)
            self.rope_tables.append(table)
        self.aux_hidden_layers: tuple[int, ...] = ()   # layers whose output forward returns

    # -- reading ----------------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.model.embed_tokens.weight.device

    @property
    def cos_sin_cache(self) -> torch.Tensor:
        """The full-attention layers' rotary table."""
        return self.rope_tables[self.config.ropes.index(self.config.rope)]

    @property
    def lm_head_weight(self) -> torch.Tensor:
        return self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight

    def set_aux_hidden_layers(self, layers: tuple[int, ...]) -> None:
        """Return these layers' outputs (the hidden state after layer i) from forward."""
        bad = [i for i in layers if not 0 <= i < self.config.num_hidden_layers]
        if bad:
            raise ValueError(f"aux hidden layer {bad[0]} outside 0..{self.config.num_hidden_layers - 1}")
        self.aux_hidden_layers = tuple(layers)

    # -- the forward pass -------------------------------------------------------------------
    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        """The input embeddings [T, H] (a vision model merges its image features here)."""
        return self.model.embed_tokens(batch.input_ids)

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache: KVCache) -> ModelOutput:
        positions = batch.positions
        if positions.dim() != (1 if self.position_rows == 1 else 2):
            raise ValueError(f"{self.config.architecture} takes positions of "
                             f"{self.position_rows} row(s), got shape {tuple(positions.shape)}")
        x = self.embed(batch)                                          # [T, H]
        residual: torch.Tensor | None = None
        aux: list[torch.Tensor] = []
        for index, layer in enumerate(self.model.layers):
            k_cache, v_cache = kv_cache.layer(index)
            table = self.rope_tables[layer.self_attn.rope_index]  # type: ignore[union-attr,index]
            x, residual = layer(x, residual, positions, table, k_cache, v_cache, batch.meta)
            if index in self.aux_hidden_layers:
                aux.append(x + residual)
        assert residual is not None
        hidden, _ = ops.fused_add_rms_norm(x, residual, self.model.norm.weight,
                                           self.config.rms_norm_eps)
        return ModelOutput(hidden, tuple(aux))                          # [T, H]

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [N, H] -> float32 logits [N, vocab]."""
        logits = ops.linear(hidden, self.lm_head_weight, out_dtype=torch.float32)
        cap = self.config.final_logit_softcap
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # -- checkpoint names -------------------------------------------------------------------
    def checkpoint_name(self, param_name: str, shard: str | None) -> str:
        """The (canonical) checkpoint tensor name that fills a parameter's shard."""
        if shard is None:
            return param_name
        parts = param_name.split(".")
        for original, (packed, packed_shard) in self.packed_modules.items():
            if packed_shard == shard and packed in parts:
                parts[parts.index(packed)] = original
                return ".".join(parts)
        return f"{param_name} ({shard})"

    def checkpoint_target(self, name: str) -> tuple[str, str | None] | None:
        """The (parameter name, shard) a checkpoint tensor fills; None for tensors the model
        ignores (saved buffers, a tied lm_head, a vision tower it does not run). Unknown
        names come back as their own parameter name, which the loader then refuses."""
        if name.endswith(self.ignored_checkpoint_suffixes):
            return None
        if name.startswith(self.ignored_checkpoint_prefixes):
            return None
        for prefix, replacement in self.checkpoint_prefixes.items():
            if name.startswith(prefix):
                name = replacement + name[len(prefix):]
                break
        if name == "lm_head.weight" and self.lm_head is None:
            return None                  # tied: some checkpoints save it anyway
        parts = name.split(".")
        for i, part in enumerate(parts):
            packed = self.packed_modules.get(part)
            if packed is not None:
                parts[i] = packed[0]
                return ".".join(parts), packed[1]
        return name, None
