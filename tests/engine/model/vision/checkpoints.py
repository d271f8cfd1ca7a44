"""Tiny random-weight Qwen2.5-VL and Qwen3-VL checkpoints (transformers configs,
`save_pretrained` safetensors) and prepared images for them (imageprep's own pipeline).

Qwen2.5-VL: three vision blocks, block 1 attending per image and blocks 0 and 2 in 112-pixel
windows (4 x 4 merged tokens: every test image has several windows, cut ones included),
mRoPE sections (2, 3, 3) over a head of 16. Qwen3-VL: the 48 x 48 position table of the
built-in profile, deepstack from blocks 0 and 1 into decoder layers 0 and 1, interleaved
mRoPE, QK-norm. Weights are perturbed away from their defaults (norm scales, biases, the
position table) so a forgotten piece changes the tokens.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from tests.engine.model.checkpoints import write_tokenizer

VOCAB_SIZE = 320
IMAGE_TOKEN, VISION_START, VISION_END = 300, 301, 302

_TEXT: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 96,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
    "max_position_embeddings": 1024, "rms_norm_eps": 1e-6, "bos_token_id": None,
    "eos_token_id": None, "pad_token_id": None,
}
_IDS = {"image_token_id": IMAGE_TOKEN, "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END, "video_token_id": 303}


@dataclass(frozen=True)
class VisionSpec:
    name: str
    config_class: str
    model_class: str
    profile: str                 # imageprep profile
    text: dict[str, Any]
    vision: dict[str, Any]
    seed: int = 0

    def config(self) -> Any:
        import transformers

        return getattr(transformers, self.config_class)(
            text_config={**_TEXT, **self.text}, vision_config=self.vision,
            tie_word_embeddings=False, **_IDS)


SPECS: dict[str, VisionSpec] = {spec.name: spec for spec in (
    VisionSpec("qwen2_5_vl", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration",
               "qwen2_5_vl",
               {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0,
                                    "mrope_section": [2, 3, 3]}},
               # intermediate widths not a multiple of 8 (as the real 3,420): the
               # encoder pads them to 64 (vision/layers.py aligned_width)
               {"depth": 3, "hidden_size": 32, "intermediate_size": 36, "num_heads": 2,
                "out_hidden_size": 64, "patch_size": 14, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "window_size": 112, "fullatt_block_indexes": [1]}),
    VisionSpec("qwen3_vl", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", "qwen3_vl",
               {"head_dim": 16, "rope_parameters": {
                   "rope_type": "default", "rope_theta": 5000.0, "mrope_section": [2, 3, 3],
                   "mrope_interleaved": True}},
               {"depth": 3, "hidden_size": 32, "intermediate_size": 52, "num_heads": 2,
                "out_hidden_size": 64, "patch_size": 16, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "num_position_embeddings": 2304,
                "deepstack_visual_indexes": [0, 1]}, seed=1),
)}


def _perturb(model: Any, seed: int) -> None:
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=generator)
            if name.endswith(".bias"):
                param.copy_(0.3 * noise)
            elif param.dim() == 1:                       # norm scales
                param.copy_(1.0 + 0.2 * noise)
            elif "embed_tokens" in name or "lm_head" in name or "pos_embed" in name:
                param.copy_(noise)
            else:
                fan_in = param[0].numel()
                param.copy_(noise / fan_in ** 0.5)


def build_checkpoint(spec: VisionSpec, directory: Path) -> Path:
    import transformers

    directory.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(spec.seed)
    model = getattr(transformers, spec.model_class)(spec.config()).to(torch.float32)
    _perturb(model, spec.seed)
    model.save_pretrained(directory, safe_serialization=True)
    write_tokenizer(directory)
    return directory


def load_reference(spec: VisionSpec, directory: Path) -> Any:
    import transformers

    model = getattr(transformers, spec.model_class).from_pretrained(directory,
                                                                   dtype=torch.float32)
    return model.eval()


def saved_config(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "config.json").read_text())


def prepared_image(profile: str, height: int, width: int, seed: int) -> Any:
    """A random RGB picture prepared by imageprep's pipeline (PreparedImage)."""
    from services.imageprep.decode import DecodedImage
    from services.imageprep.processor import process_image
    from services.imageprep.profiles import builtin_profile

    rgb = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return process_image(DecodedImage(rgb, "RGB", 1), builtin_profile(profile))
