"""Processor profiles: the preprocessing recipe a vision model was trained with.

A profile fixes the patch geometry (patch size, temporal duplication, spatial merge), the
normalisation and the resize bounds. Two are built in, with the published defaults of their
`preprocessor_config.json`:

| profile      | patch | merge | temporal | mean / std            | min..max pixels        | position table |
|--------------|-------|-------|----------|-----------------------|------------------------|----------------|
| `qwen3_vl`   | 16    | 2     | 2        | 0.5 / 0.5             | 65,536..16,777,216     | 48 x 48        |
| `qwen2_5_vl` | 14    | 2     | 2        | OpenAI CLIP mean/std  | 3,136..12,845,056      | none           |

A checkpoint may override them: `settings_from_checkpoint` reads its preprocessor_config.json
(patch/merge/temporal sizes, mean/std, rescale factor, `size` or `min_pixels`/`max_pixels`) and
the vision config's `num_position_embeddings`. `ProcessorSettings.fingerprint` is the canonical
byte form that keys the retention cache and seeds each image's semantic identity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from services.common.errors import UnsupportedError, ValidationError

QWEN3_VL = "qwen3_vl"
QWEN2_5_VL = "qwen2_5_vl"

# The one resize this service implements: PyTorch's uint8 bicubic path with antialiasing
# (what torchvision, and so transformers' fast image processors, run on CPU).
RESAMPLE_BICUBIC_AA_U8 = "bicubic_antialias_uint8"

OPENAI_CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
OPENAI_CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ProcessorSettings:
    """Everything that decides the prepared tensors of an image (besides its pixels)."""

    profile: str                            # profile name ("qwen3_vl", "qwen2_5_vl")
    patch_size: int                         # P: square patch side in pixels
    merge_size: int                         # M: spatial merge (M x M patches -> one token)
    temporal_patch_size: int                # T: copies of a still image along time
    image_mean: tuple[float, float, float]  # per channel, in [0, 1] units
    image_std: tuple[float, float, float]
    rescale_factor: float                   # uint8 -> [0, 1] (1/255)
    min_pixels: int                         # smart-resize bounds on height x width
    max_pixels: int
    position_table_side: int                # learned position table side (0: none)
    resample: str = RESAMPLE_BICUBIC_AA_U8

    def __post_init__(self) -> None:
        for name in ("patch_size", "merge_size", "temporal_patch_size"):
            if getattr(self, name) < 1:
                raise ValidationError(f"{self.profile}: {name} must be >= 1", param=name)
        if len(self.image_mean) != 3 or len(self.image_std) != 3:
            raise ValidationError(f"{self.profile}: image_mean and image_std need 3 channels")
        if any(not math.isfinite(s) or s == 0 for s in self.image_std):
            raise ValidationError(f"{self.profile}: image_std must be finite and non-zero")
        if not (math.isfinite(self.rescale_factor) and self.rescale_factor > 0):
            raise ValidationError(f"{self.profile}: rescale_factor must be positive")
        if self.min_pixels < 1:
            raise ValidationError("min_pixels must be >= 1", param="min_pixels")
        if self.max_pixels < self.min_pixels:
            raise ValidationError(
                f"max_pixels ({self.max_pixels}) must be >= min_pixels ({self.min_pixels})",
                param="max_pixels")
        if self.max_pixels < self.factor * self.factor:
            raise ValidationError(
                f"max_pixels ({self.max_pixels}) is below one merged patch "
                f"({self.factor} x {self.factor} pixels)", param="max_pixels")
        if self.position_table_side < 0:
            raise ValidationError("position_table_side must be >= 0")

    @property
    def factor(self) -> int:
        """Resized sides are multiples of this: one merged token covers factor x factor pixels."""
        return self.patch_size * self.merge_size

    @property
    def patch_dim(self) -> int:
        """Floats per patch row of pixel_values: C * T * P * P."""
        return 3 * self.temporal_patch_size * self.patch_size * self.patch_size

    @property
    def merge_unit(self) -> int:
        return self.merge_size * self.merge_size

    def fingerprint(self) -> bytes:
        """Canonical bytes of every field (floats by repr, so 0.5 and 0.50000001 differ)."""
        fields = {k: (list(map(repr, v)) if isinstance(v, tuple) else
                      repr(v) if isinstance(v, float) else v)
                  for k, v in asdict(self).items()}
        return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()

    def with_pixel_bounds(self, min_pixels: int | None, max_pixels: int | None) -> ProcessorSettings:
        """These settings with a request's min/max pixels, which may only narrow the range."""
        if min_pixels is None and max_pixels is None:
            return self
        lo = self.min_pixels if min_pixels is None else min_pixels
        hi = self.max_pixels if max_pixels is None else max_pixels
        if hi > self.max_pixels:
            raise ValidationError(
                f"max_pixels {hi} is above the {self.profile} limit of {self.max_pixels}",
                param="max_pixels")
        if lo > hi:
            raise ValidationError(f"min_pixels {lo} is above max_pixels {hi}", param="min_pixels")
        return replace(self, min_pixels=lo, max_pixels=hi)


BUILTIN_PROFILES: dict[str, ProcessorSettings] = {
    QWEN3_VL: ProcessorSettings(
        profile=QWEN3_VL, patch_size=16, merge_size=2, temporal_patch_size=2,
        image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), rescale_factor=1 / 255,
        min_pixels=65_536, max_pixels=16_777_216, position_table_side=48),
    QWEN2_5_VL: ProcessorSettings(
        profile=QWEN2_5_VL, patch_size=14, merge_size=2, temporal_patch_size=2,
        image_mean=OPENAI_CLIP_MEAN, image_std=OPENAI_CLIP_STD, rescale_factor=1 / 255,
        min_pixels=3_136, max_pixels=12_845_056, position_table_side=0),
}


def builtin_profile(name: str) -> ProcessorSettings:
    try:
        return BUILTIN_PROFILES[name]
    except KeyError:
        raise UnsupportedError(
            f"unknown image profile {name!r}; this imageprep supports "
            f"{', '.join(sorted(BUILTIN_PROFILES))}", param="profile") from None


def _triple(value: Any, name: str) -> tuple[float, float, float]:
    if isinstance(value, (int, float)):
        value = [value] * 3
    if not isinstance(value, (list, tuple)) or len(value) != 3:
        raise ValidationError(f"preprocessor_config.json: {name} must hold 3 numbers", param=name)
    return (float(value[0]), float(value[1]), float(value[2]))


def settings_from_checkpoint(profile: str, preprocessor: Mapping[str, Any] | None,
                             model_config: Mapping[str, Any] | None = None) -> ProcessorSettings:
    """The profile's defaults overridden by a checkpoint's preprocessor_config.json and the
    vision config's position table size (config.json `vision_config.num_position_embeddings`)."""
    base = builtin_profile(profile)
    pre = dict(preprocessor or {})
    if pre.get("resample", 3) != 3:  # PIL's BICUBIC, the only resize implemented
        raise UnsupportedError(
            f"preprocessor_config.json asks for resample={pre['resample']!r}; imageprep "
            "implements bicubic (3) only")
    for flag in ("do_resize", "do_rescale", "do_normalize", "do_convert_rgb"):
        if pre.get(flag, True) is not True:
            raise UnsupportedError(f"preprocessor_config.json sets {flag}=false; imageprep "
                                   "implements the standard Qwen-VL pipeline only")
    size: Mapping[str, Any] = pre["size"] if isinstance(pre.get("size"), Mapping) else {}
    min_pixels: Any = pre.get("min_pixels", size.get("shortest_edge", base.min_pixels))
    max_pixels: Any = pre.get("max_pixels", size.get("longest_edge", base.max_pixels))
    side = base.position_table_side
    vision = (model_config or {}).get("vision_config") or {}
    if side and vision.get("num_position_embeddings"):
        count = int(vision["num_position_embeddings"])
        side = math.isqrt(count)
        if side * side != count:
            raise ValidationError(
                f"vision_config.num_position_embeddings {count} is not a square table")
    try:
        return ProcessorSettings(
            profile=profile,
            patch_size=int(pre.get("patch_size", base.patch_size)),
            merge_size=int(pre.get("merge_size", base.merge_size)),
            temporal_patch_size=int(pre.get("temporal_patch_size", base.temporal_patch_size)),
            image_mean=_triple(pre.get("image_mean", base.image_mean), "image_mean"),
            image_std=_triple(pre.get("image_std", base.image_std), "image_std"),
            rescale_factor=float(pre.get("rescale_factor", base.rescale_factor)),
            min_pixels=int(min_pixels),
            max_pixels=int(max_pixels),
            position_table_side=side,
        )
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"preprocessor_config.json for {profile}: {exc}") from exc
