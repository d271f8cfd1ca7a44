"""Qwen vision-language models: `Qwen2_5_VLForConditionalGeneration` and
`Qwen3VLForConditionalGeneration`.

    model = load_model(open_model(path))                 # registry -> this module
    features = model.encode_images([VisionInput, ...])    # the vision tower, per image
    batch = ForwardBatch(ids, positions [3, T], meta, images=ImageEmbeds(rows, feats, ...))
    out = model(batch, kv_cache)

The language model is the Qwen2 (Qwen2.5-VL: qkv bias) or Qwen3 (Qwen3-VL: QK-norm) decoder
with multimodal rotary positions (`mrope.py`: three rows T, H, W; Qwen2.5-VL's consecutive
sections, Qwen3-VL's interleaved layout). `embed` replaces the image-pad rows the batch names
(`ImageEmbeds.rows`) with the image features; Qwen3-VL adds its deepstack features to those
rows after the first decoder layers. A batch without images is plain text (its three rows are
equal), so decode steps and text-only prompts cost what they cost in the text model, plus one
gather of the rotary rows.

Checkpoint names: transformers 5 writes `model.language_model.*`, `model.visual.*`,
`lm_head.*`; older Qwen2.5-VL checkpoints `model.*` (the language model), `visual.*`,
`lm_head.*`. Both map onto `model.*` and `visual.*` here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import torch

from services.engine.model import ops
from services.engine.model.architecture import Architecture, Capabilities
from services.engine.model.attention import KVCache
from services.engine.model.causal_lm import CausalLM, ForwardBatch, ModelOutput
from services.engine.model.config import LayerAttention, activation, parse_rope, shape_fields
from services.engine.model.layers import PreNormDecoderLayer
from services.engine.model.mrope import mrope_cos_sin, row_selector
from services.engine.model.qwen import qwen_layers
from services.engine.model.vision.config import (
    VisionLanguageConfig,
    mrope_parameters,
    parse_vision,
    text_section,
)
from services.engine.model.vision.inputs import ImageEmbeds, ImageFeatures, VisionInput
from services.engine.model.vision.towers import (
    Qwen2_5_VisionTower,
    Qwen3VisionTower,
    VisionTower,
)


def _parse(config: Mapping[str, Any], name: str, family: str,
           default_section: tuple[int, int, int], interleaved: bool,
           qwen3: bool) -> VisionLanguageConfig:
    text = text_section(config)
    params, section = mrope_parameters(text, default_section)
    rope = parse_rope(params, text)
    layers = tuple(LayerAttention(kind.sliding_window, rope) for kind in qwen_layers(
        {**text, "rope_parameters": params, "rope_scaling": None}))
    fields = shape_fields(text, name)
    fields["tie_word_embeddings"] = bool(config.get(
        "tie_word_embeddings", text.get("tie_word_embeddings", False)))
    bias = bool(text.get("attention_bias", False))
    vision = parse_vision(config, family, fields["hidden_size"])
    return VisionLanguageConfig(
        **fields, layers=layers, activation=activation(text, name),
        qkv_bias=bias if qwen3 else True, o_bias=bias if qwen3 else False, qk_norm=qwen3,
        mrope_section=section, mrope_interleaved=interleaved,
        image_token_id=int(config.get("image_token_id", text.get("image_token_id", -1))),
        vision_start_token_id=int(config.get("vision_start_token_id", -1)),
        vision=vision)


def parse_qwen2_5_vl(config: Mapping[str, Any]) -> VisionLanguageConfig:
    return _parse(config, "Qwen2_5_VLForConditionalGeneration", "qwen2_5_vl", (16, 24, 24),
                  interleaved=False, qwen3=False)


def parse_qwen3_vl(config: Mapping[str, Any]) -> VisionLanguageConfig:
    return _parse(config, "Qwen3VLForConditionalGeneration", "qwen3_vl", (24, 20, 20),
                  interleaved=True, qwen3=True)


class QwenVLForConditionalGeneration(CausalLM):
    layer_class = PreNormDecoderLayer
    position_rows: ClassVar[int] = 3
    tower_class: ClassVar[type[VisionTower]]
    mrope_selector: torch.Tensor
    checkpoint_prefixes: ClassVar[dict[str, str]] = {
        "model.language_model.": "model.", "model.visual.": "visual.",
        "language_model.model.": "model.", "language_model.lm_head.": "lm_head."}

    def __init__(self, config: VisionLanguageConfig, device: torch.device | str,  # type: ignore[override]
                 dtype: torch.dtype, max_positions: int) -> None:
        super().__init__(config, device, dtype, max_positions)
        assert config.vision is not None
        self.vl_config = config
        self.visual = self.tower_class(config.vision, device=device, dtype=dtype)
        self.register_buffer("mrope_selector", row_selector(
            config.mrope_section, config.mrope_interleaved, device), persistent=False)

    @property
    def num_deepstack_layers(self) -> int:
        assert self.vl_config.vision is not None
        return len(self.vl_config.vision.deepstack_visual_indexes)

    def encode_images(self, images: Sequence[VisionInput]) -> list[ImageFeatures]:
        """The vision tower over these images (packed into one pass), one result each,
        in the model dtype on the model's device."""
        return self.visual(images) if images else []

    def embed(self, batch: ForwardBatch) -> torch.Tensor:
        x = self.model.embed_tokens(batch.input_ids)
        images: ImageEmbeds | None = batch.images
        if images is not None:
            x = x.index_copy(0, images.rows, images.features.to(x.dtype))
        return x

    @torch.inference_mode()
    def forward(self, batch: ForwardBatch, kv_cache: KVCache) -> ModelOutput:
        positions = batch.positions
        if positions.dim() != 2 or positions.shape[0] != 3:
            raise ValueError(f"{self.config.architecture} takes mRoPE positions [3, T], got "
                             f"shape {tuple(positions.shape)}")
        images: ImageEmbeds | None = batch.images
        x = self.embed(batch)                                            # [T, H]
        table = mrope_cos_sin(positions, self.rope_tables[0], self.mrope_selector)  # [T, D]
        rows = torch.arange(x.shape[0], device=x.device)
        residual: torch.Tensor | None = None
        aux: list[torch.Tensor] = []
        deepstack = images.deepstack if images is not None else ()
        for index, layer in enumerate(self.model.layers):
            k_cache, v_cache = kv_cache.layer(index)
            x, residual = layer(x, residual, rows, table, k_cache, v_cache, batch.meta)
            if images is not None and index < len(deepstack):
                x = x.index_add(0, images.rows, deepstack[index].to(x.dtype))
            if index in self.aux_hidden_layers:
                aux.append(x + residual)
        assert residual is not None
        hidden, _ = ops.fused_add_rms_norm(x, residual, self.model.norm.weight,
                                           self.config.rms_norm_eps)
        return ModelOutput(hidden, tuple(aux))


class Qwen2_5_VLForConditionalGeneration(QwenVLForConditionalGeneration):
    tower_class = Qwen2_5_VisionTower


class Qwen3VLForConditionalGeneration(QwenVLForConditionalGeneration):
    tower_class = Qwen3VisionTower


_VISION = Capabilities(vision=True, position_rows=3)

ARCHITECTURES = (
    Architecture("Qwen2_5_VLForConditionalGeneration", Qwen2_5_VLForConditionalGeneration,
                 parse_qwen2_5_vl, _VISION),
    Architecture("Qwen3VLForConditionalGeneration", Qwen3VLForConditionalGeneration,
                 parse_qwen3_vl, _VISION),
)
