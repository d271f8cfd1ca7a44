"""The configs of the Qwen vision-language models: the vision tower's shape and the language
model's multimodal rotary layout, parsed from a `Qwen2_5_VLForConditionalGeneration` /
`Qwen3VLForConditionalGeneration` config.json.

    VisionConfig            the tower: patch embedding, blocks, merger (and Qwen3-VL's
                            position table and deepstack layers; Qwen2.5-VL's windows)
    VisionLanguageConfig    a ModelConfig (the language model) plus the mRoPE sections,
                            their layout (Qwen2.5-VL: consecutive sections; Qwen3-VL:
                            interleaved), the image-pad token and the VisionConfig

Both layouts of config.json are read: transformers 5's `text_config` and the older one with
the language model's fields at the top level (`rope_scaling: {"type": "mrope", ...}`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import UnsupportedError, ValidationError
from services.engine.model.config import ModelConfig, malformed

VISION_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                      "gelu_tanh": "gelu_tanh", "gelu": "gelu", "quick_gelu": "quick_gelu"}


@dataclass(frozen=True, slots=True)
class VisionConfig:
    """The vision transformer's shape (both families; unused fields keep their defaults)."""

    family: str                           # "qwen2_5_vl" | "qwen3_vl"
    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int                  # the language model's hidden size
    patch_size: int
    temporal_patch_size: int
    spatial_merge_size: int
    in_channels: int = 3
    activation: str = "silu"              # the block MLP's (VISION_ACTIVATIONS values)
    rope_theta: float = 10000.0
    window_size: int = 0                  # Qwen2.5-VL: window side in pixels
    fullatt_block_indexes: tuple[int, ...] = ()      # Qwen2.5-VL: blocks attending per image
    num_position_embeddings: int = 0      # Qwen3-VL: learned position table (side ** 2)
    deepstack_visual_indexes: tuple[int, ...] = ()   # Qwen3-VL: blocks feeding the decoder

    def __post_init__(self) -> None:
        if self.hidden_size % self.num_heads:
            raise ValidationError("vision_config: hidden_size is not a multiple of num_heads",
                                  param="vision_config.num_heads")
        if self.head_dim % 4:
            raise ValidationError("vision_config: the head size must be a multiple of 4 for "
                                  "the 2-D rotary embedding", param="vision_config.num_heads")
        if self.family == "qwen2_5_vl":
            unit = self.spatial_merge_size * self.patch_size
            if self.window_size < unit or self.window_size % unit:
                raise ValidationError(
                    f"vision_config: window_size {self.window_size} is not a multiple of "
                    f"patch_size x spatial_merge_size ({unit})", param="vision_config.window_size")
        bad = [i for i in (*self.fullatt_block_indexes, *self.deepstack_visual_indexes)
               if not 0 <= i < self.depth]
        if bad:
            raise ValidationError(f"vision_config: block index {bad[0]} outside 0..{self.depth - 1}",
                                  param="vision_config")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Values per patch in pixel_values: channels x temporal copies x patch x patch."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size ** 2


@dataclass(frozen=True, slots=True)
class VisionLanguageConfig(ModelConfig):
    """The language model (ModelConfig) with what the multimodal path needs beside it."""

    mrope_section: tuple[int, ...] = ()   # frequencies per T, H, W row (sums to head_dim / 2)
    mrope_interleaved: bool = False       # Qwen3-VL: T, H, W frequencies interleaved
    image_token_id: int = -1
    vision_start_token_id: int = -1
    vision: VisionConfig | None = field(default=None)

    def __post_init__(self) -> None:
        ModelConfig.__post_init__(self)
        if len(self.mrope_section) != 3 or sum(self.mrope_section) != self.head_dim // 2:
            raise ValidationError(
                f"config.json: mrope_section {list(self.mrope_section)} must be three sizes "
                f"summing to head_dim / 2 ({self.head_dim // 2})", param="mrope_section")
        if self.vision is None:
            raise ValidationError("config.json: vision_config is missing", param="vision_config")
        if self.vision.out_hidden_size != self.hidden_size:
            raise ValidationError(
                f"vision_config.out_hidden_size {self.vision.out_hidden_size} differs from the "
                f"language model's hidden_size {self.hidden_size}", param="vision_config")
        if not 0 <= self.image_token_id < self.vocab_size:
            raise ValidationError(f"config.json: image_token_id {self.image_token_id} is outside "
                                  f"the vocabulary", param="image_token_id")


def text_section(config: Mapping[str, Any]) -> dict[str, Any]:
    """The language model's fields: `text_config` (transformers 5) over the top level."""
    text = dict(config.get("text_config") or {})
    merged = {k: v for k, v in config.items() if k not in ("text_config", "vision_config")}
    merged.update(text)
    return merged


def mrope_parameters(text: Mapping[str, Any], default_section: tuple[int, int, int]
                     ) -> tuple[dict[str, Any], tuple[int, ...]]:
    """The rope dict with its mRoPE entries taken out (-> a plain rope) and the sections."""
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    section = tuple(int(s) for s in params.pop("mrope_section", default_section))
    params.pop("mrope_interleaved", None)
    kind = str(params.get("rope_type") or params.get("type") or "default")
    if kind == "mrope":
        params["rope_type"] = "default"
        params.pop("type", None)
    if str(params.get("rope_type") or params.get("type") or "default") != "default":
        raise UnsupportedError(f"rope type {kind!r} with multimodal rotary sections is not "
                               "supported (supported: default)", param="rope_scaling")
    return params, section


def parse_vision(config: Mapping[str, Any], family: str, out_hidden: int) -> VisionConfig:
    raw = config.get("vision_config")
    if not isinstance(raw, Mapping):
        raise ValidationError("config.json: vision_config is missing", param="vision_config")
    try:
        act = str(raw.get("hidden_act") or ("silu" if family == "qwen2_5_vl"
                                            else "gelu_pytorch_tanh"))
        activation = VISION_ACTIVATIONS.get(act)
        if activation is None:
            raise UnsupportedError(f"vision activation {act!r} is not supported (supported: "
                                   f"{', '.join(sorted(VISION_ACTIVATIONS))})",
                                   param="vision_config.hidden_act")
        rope = raw.get("rope_parameters") or {}
        hidden = int(raw.get("hidden_size") or raw["embed_dim"])
        return VisionConfig(
            family=family,
            depth=int(raw["depth"]),
            hidden_size=hidden,
            num_heads=int(raw["num_heads"]),
            intermediate_size=int(raw["intermediate_size"]),
            out_hidden_size=int(raw.get("out_hidden_size") or out_hidden),
            patch_size=int(raw.get("patch_size") or raw.get("spatial_patch_size") or 14),
            temporal_patch_size=int(raw.get("temporal_patch_size", 2)),
            spatial_merge_size=int(raw.get("spatial_merge_size", 2)),
            in_channels=int(raw.get("in_channels") or raw.get("in_chans") or 3),
            activation=activation,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
            window_size=int(raw.get("window_size", 112)) if family == "qwen2_5_vl" else 0,
            fullatt_block_indexes=tuple(int(i) for i in raw.get("fullatt_block_indexes") or ()),
            num_position_embeddings=int(raw.get("num_position_embeddings") or 0),
            deepstack_visual_indexes=tuple(
                int(i) for i in raw.get("deepstack_visual_indexes") or ()),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise malformed(f"vision_config ({family})", exc) from exc
