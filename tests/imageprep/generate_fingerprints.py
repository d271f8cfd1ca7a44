"""Reference fingerprints from transformers' fast (torchvision) Qwen-VL processors.

Runs in a SEPARATE environment where torchvision imports (the project venv's torch 2.13 has no
matching torchvision), e.g.

    python3 -m venv /tmp/tvenv
    /tmp/tvenv/bin/pip install torch==2.14.1 torchvision==0.29.1 transformers pillow
    PYTHONPATH=. /tmp/tvenv/bin/python tests/imageprep/generate_fingerprints.py

and writes tests/imageprep/fingerprints.json, which the CPU tests compare against with no
tolerance. Nothing here imports services.imageprep: the reference is transformers itself.

- Decoding reference: Pillow `Image.open` + `ImageOps.exif_transpose`, then RGB with alpha
  dropped (`convert("RGB")`; 16-bit grey keeps the high byte). transformers' own PIL path would
  blend alpha onto white, which the admission rules do not do, so decoded pixels are handed to
  the processor as [3, H, W] uint8 tensors.
- Processor reference: `Qwen2VLImageProcessor` (the torchvision backend Qwen2.5-VL and Qwen3-VL
  both use), built with each model's published preprocessor_config.json values. Its `resize` is
  wrapped to capture the resized uint8 pixels it actually produced.
- Vision-model reference: a tiny `Qwen3VLVisionModel` (48 x 48 position table, merge 2) supplies
  the interpolation settings; the generator checks on one image that the model's forward pass
  uses exactly the indices/weights recorded here.
- Prompt reference: `Qwen3VLProcessor` / `Qwen2_5_VLProcessor` with the real Qwen3 tokenizer
  (services.common.assets) expand placeholders; `get_rope_index` gives the mRoPE rows and delta.
"""

from __future__ import annotations

import hashlib
import json
import sys
import types
from pathlib import Path

import numpy as np
import PIL
import torch
import torchvision
import transformers
from PIL import Image, ImageOps
from transformers import AutoTokenizer
from transformers import vision_utils as vu
from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as q25_modeling
from transformers.models.qwen2_5_vl.processing_qwen2_5_vl import Qwen2_5_VLProcessor
from transformers.models.qwen2_vl.image_processing_qwen2_vl import (
    Qwen2VLImageProcessor,
    smart_resize,
)
from transformers.models.qwen2_vl.video_processing_qwen2_vl import Qwen2VLVideoProcessor
from transformers.models.qwen3_vl import modeling_qwen3_vl as q3_modeling
from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor
from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor

HERE = Path(__file__).resolve().parent
FIXTURES = HERE / "fixtures"
OUT = HERE / "fingerprints.json"

# Published preprocessor_config.json values (Qwen/Qwen3-VL-*-Instruct, Qwen/Qwen2.5-VL-*-Instruct).
PROFILES = {
    "qwen3_vl": {"patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
                 "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
                 "min_pixels": 65536, "max_pixels": 16777216},
    "qwen2_5_vl": {"patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
                   "image_mean": [0.48145466, 0.4578275, 0.40821073],
                   "image_std": [0.26862954, 0.26130258, 0.27577711],
                   "min_pixels": 3136, "max_pixels": 12845056},
}

SINGLE = sorted(p.name for p in FIXTURES.iterdir() if p.suffix in (".png", ".jpg", ".webp"))
# (case name, images, profile, min_pixels, max_pixels); None = profile default.
EXTRA_CASES = [
    ("qwen3_max_pixels_downscale", ["rgb_643x481.png"], "qwen3_vl", None, 102400),
    ("qwen3_max_pixels_exact", ["rgb_352x352.png"], "qwen3_vl", None, 123904),
    ("qwen3_max_pixels_just_below", ["rgb_352x352.png"], "qwen3_vl", None, 123903),
    ("qwen3_min_pixels_upscale", ["rgb_300x200.png"], "qwen3_vl", 200000, None),
    ("qwen2_5_max_pixels_downscale", ["rgb_643x481.png"], "qwen2_5_vl", None, 50176),
    ("qwen2_5_max_pixels_exact", ["rgb_434x350.png"], "qwen2_5_vl", None, 439 * 28 * 28),
    ("qwen3_repeated", ["rgb_300x200.png", "mode_P.png", "rgb_300x200.png"], "qwen3_vl",
     None, None),
    ("qwen2_5_repeated", ["rgb_300x200.png", "mode_P.png", "rgb_300x200.png"], "qwen2_5_vl",
     None, None),
    ("qwen3_mixed", ["exif6.jpg", "lossy.webp", "mode_I16.png", "cmyk.jpg"], "qwen3_vl",
     None, None),
]
# Geometry only (no pixels): (height, width, profile, min_pixels, max_pixels).
GEOMETRY_CASES = [
    (4096, 4096, "qwen3_vl", None, None),      # exactly max_pixels: 16,384 tokens
    (4097, 4095, "qwen3_vl", None, None),
    (6000, 8000, "qwen3_vl", None, None),
    (3584, 3584, "qwen2_5_vl", None, None),    # exactly max_pixels: 16,384 tokens
    (3585, 3583, "qwen2_5_vl", None, None),
    (1, 1, "qwen3_vl", None, None),
    (100, 20000, "qwen3_vl", None, None),      # aspect ratio exactly 200
    (48, 80, "qwen3_vl", 1, None),             # 1.5 and 2.5 patches of 32: half-even
    (201, 1, "qwen3_vl", None, None),          # aspect ratio above 200: refused
]
EXPANSION_CASES = [
    ("qwen3_one_image", "qwen3_vl", ["rgb_300x200.png"],
     "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>What is this?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("qwen3_repeated_images", "qwen3_vl", ["rgb_300x200.png", "mode_P.png", "rgb_300x200.png"],
     "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
     "<|vision_start|><|image_pad|><|vision_end|>First.<|im_end|>\n<|im_start|>assistant\n"
     "A picture.<|im_end|>\n<|im_start|>user\nAnd these: <|vision_start|><|image_pad|>"
     "<|vision_end|> and <|vision_start|><|image_pad|><|vision_end|>?<|im_end|>\n"
     "<|im_start|>assistant\n"),
    ("qwen2_5_two_images", "qwen2_5_vl", ["rgb_1000x90.png", "exif8.jpg"],
     "<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
     "<|vision_start|><|image_pad|><|vision_end|>Compare them.<|im_end|>\n"
     "<|im_start|>assistant\n"),
]


def sha(data: bytes | np.ndarray | torch.Tensor) -> str:
    if isinstance(data, torch.Tensor):
        data = data.detach().contiguous().numpy()
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).tobytes()
    return hashlib.sha256(data).hexdigest()


def reference_decode(name: str) -> np.ndarray:
    """Upright RGB8 [H, W, 3] by Pillow's standard calls (writable copy)."""
    with Image.open(FIXTURES / name) as opened:
        upright = ImageOps.exif_transpose(opened)
    if upright.mode.startswith("I;16"):
        grey = (np.asarray(upright).astype(np.int64) >> 8).astype(np.uint8)
        return np.repeat(grey[:, :, None], 3, axis=2)
    return np.array(upright.convert("RGB"))


def image_processor(profile: str, min_pixels: int | None, max_pixels: int | None):
    values = dict(PROFILES[profile])
    values["min_pixels"] = min_pixels or values["min_pixels"]
    values["max_pixels"] = max_pixels or values["max_pixels"]
    return Qwen2VLImageProcessor(**values)


def capture_resizes(processor) -> list[torch.Tensor]:
    captured: list[torch.Tensor] = []
    original = processor.resize

    def resize(*args, **kwargs):
        out = original(*args, **kwargs)
        captured.append(out.clone())
        return out

    processor.resize = resize
    return captured


def tiny_vision_model() -> q3_modeling.Qwen3VLVisionModel:
    config = Qwen3VLVisionConfig(depth=1, hidden_size=32, intermediate_size=32, num_heads=2,
                                 out_hidden_size=32, num_position_embeddings=2304,
                                 patch_size=16, spatial_merge_size=2, temporal_patch_size=2,
                                 deepstack_visual_indexes=[])
    return q3_modeling.Qwen3VLVisionModel(config).eval()


def interpolation(model, grid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return vu.get_vision_interpolation_indices_and_weights(
        grid, num_grid_per_side=model.num_grid_per_side, mode=model.interpolation_mode,
        align_corners=model.interpolation_align_corners,
        spatial_merge_size=model.config.spatial_merge_size)


def check_model_uses_interpolation(model, pixel_values: torch.Tensor, grid: torch.Tensor) -> None:
    """Run the vision model once and confirm it consumes exactly `interpolation(model, grid)`."""
    recorded = []
    original = q3_modeling.get_vision_interpolation_indices_and_weights

    def record(*args, **kwargs):
        out = original(*args, **kwargs)
        recorded.append(out)
        return out

    q3_modeling.get_vision_interpolation_indices_and_weights = record
    try:
        with torch.no_grad():
            model(pixel_values, grid_thw=grid)
    finally:
        q3_modeling.get_vision_interpolation_indices_and_weights = original
    expected = interpolation(model, grid)
    assert len(recorded) == 1
    assert torch.equal(recorded[0][0], expected[0]) and torch.equal(recorded[0][1], expected[1])


def pipeline_case(name, images, profile, min_pixels, max_pixels, model) -> dict:
    decoded = [reference_decode(n) for n in images]
    tensors = [torch.from_numpy(d.copy()).permute(2, 0, 1).contiguous() for d in decoded]
    per_image = []
    for image_name, rgb, tensor in zip(images, decoded, tensors, strict=True):
        processor = image_processor(profile, min_pixels, max_pixels)
        captured = capture_resizes(processor)
        out = processor(images=[tensor], input_data_format="channels_first", return_tensors="pt")
        resized = captured[0][0] if captured else tensor
        grid = out["image_grid_thw"]
        positions = vu.get_vision_position_ids(grid, processor.merge_size)
        entry = {
            "image": image_name,
            "decoded_shape": list(rgb.shape), "decoded_sha256": sha(rgb),
            "resized_shape": [int(resized.shape[1]), int(resized.shape[2])],
            "resized_sha256": sha(resized.permute(1, 2, 0)),
            "grid_thw": grid[0].tolist(),
            "pixel_values_shape": list(out["pixel_values"].shape),
            "pixel_values_sha256": sha(out["pixel_values"]),
            "grid_thw_sha256": sha(grid.to(torch.int64)),
            "vision_positions_sha256": sha(positions.to(torch.int64)),
            "cu_patches_sha256": sha(vu.get_vision_cu_seqlens(grid).to(torch.int32)),
        }
        if profile == "qwen3_vl":
            indices, weights = interpolation(model, grid)
            entry["interp_indices_sha256"] = sha(indices.to(torch.int64))
            entry["interp_weights_sha256"] = sha(weights.to(torch.float32))
        per_image.append(entry)
    batch = image_processor(profile, min_pixels, max_pixels)(
        images=tensors, input_data_format="channels_first", return_tensors="pt")
    return {"name": name, "profile": profile, "min_pixels": min_pixels,
            "max_pixels": max_pixels, "images": per_image,
            "batch_pixel_values_sha256": sha(batch["pixel_values"]),
            "batch_grid_thw": batch["image_grid_thw"].tolist()}


def geometry_case(height, width, profile, min_pixels, max_pixels, model) -> dict:
    values = PROFILES[profile]
    factor = values["patch_size"] * values["merge_size"]
    case = {"height": height, "width": width, "profile": profile,
            "min_pixels": min_pixels, "max_pixels": max_pixels}
    try:
        resized = smart_resize(height, width, factor=factor,
                               min_pixels=min_pixels or values["min_pixels"],
                               max_pixels=max_pixels or values["max_pixels"])
    except ValueError as exc:
        return {**case, "error": str(exc)}
    grid = torch.tensor([[1, resized[0] // values["patch_size"],
                          resized[1] // values["patch_size"]]])
    case.update(resized=list(resized), grid_thw=grid[0].tolist(),
                vision_positions_sha256=sha(vu.get_vision_position_ids(grid, 2).to(torch.int64)))
    if profile == "qwen3_vl":
        indices, weights = interpolation(model, grid)
        case.update(interp_indices_sha256=sha(indices.to(torch.int64)),
                    interp_weights_sha256=sha(weights.to(torch.float32)))
    return case


def _rope_owner(model_cls, merge: int):
    vision = types.SimpleNamespace(spatial_merge_size=merge, tokens_per_second=2)
    owner = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    owner.get_vision_position_ids = lambda *a, **k: model_cls.get_vision_position_ids(owner, *a, **k)
    return owner


def expansion_case(name, profile, images, text, tokenizer) -> dict:
    tensors = [torch.from_numpy(reference_decode(n)).permute(2, 0, 1).contiguous()
               for n in images]
    image_proc = image_processor(profile, None, None)
    if profile == "qwen3_vl":
        processor = Qwen3VLProcessor(image_processor=image_proc, tokenizer=tokenizer,
                                     video_processor=Qwen3VLVideoProcessor())
        model_cls = q3_modeling.Qwen3VLModel
    else:
        processor = Qwen2_5_VLProcessor(image_processor=image_proc, tokenizer=tokenizer,
                                        video_processor=Qwen2VLVideoProcessor())
        model_cls = q25_modeling.Qwen2_5_VLModel
    out = processor(text=[text], images=tensors, return_tensors="pt",
                    images_kwargs={"input_data_format": "channels_first"})
    owner = _rope_owner(model_cls, 2)
    positions, delta = model_cls.get_rope_index(
        owner, out["input_ids"], mm_token_type_ids=out["mm_token_type_ids"],
        image_grid_thw=out["image_grid_thw"])
    expanded = out["input_ids"][0].to(torch.int64)
    rows = positions[:, 0, :]
    assert int(rows.min()) >= 0 and int(rows.max()) < 2**31
    prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return {
        "name": name, "profile": profile, "images": images,
        "image_token_id": processor.image_token_id,
        "vision_start_token_id": tokenizer.convert_tokens_to_ids("<|vision_start|>"),
        "prompt_token_ids": list(prompt_ids),
        "expanded_len": int(expanded.shape[0]),
        "expanded_sha256": sha(expanded.numpy().astype("<u4")),
        "modality_ids_sha256": sha(out["mm_token_type_ids"][0].numpy().astype(np.uint8)),
        "mrope_positions_sha256": sha(rows.numpy().astype("<i4")),
        "rope_delta": int(delta.reshape(-1)[0]),
        "grid_thw": out["image_grid_thw"].tolist(),
    }


def main() -> int:
    sys.path.insert(0, str(HERE.parents[1]))
    from services.common import assets

    torch.manual_seed(0)
    model = tiny_vision_model()
    processor = image_processor("qwen3_vl", None, None)
    rgb = torch.from_numpy(reference_decode("rgb_300x200.png")).permute(2, 0, 1).contiguous()
    out = processor(images=[rgb], input_data_format="channels_first", return_tensors="pt")
    check_model_uses_interpolation(model, out["pixel_values"], out["image_grid_thw"])

    cases = [pipeline_case(f"{profile}:{name}", [name], profile, None, None, model)
             for name in SINGLE for profile in PROFILES]
    cases += [pipeline_case(*case, model) for case in EXTRA_CASES]
    geometry = [geometry_case(*case, model) for case in GEOMETRY_CASES]
    tokenizer = AutoTokenizer.from_pretrained(str(assets.fetch("qwen3")))
    expansions = [expansion_case(*case, tokenizer) for case in EXPANSION_CASES]
    fixture_index = json.loads((FIXTURES / "fixtures.json").read_text())
    OUT.write_text(json.dumps({
        "generated_by": "tests/imageprep/generate_fingerprints.py",
        "versions": {"torch": torch.__version__, "torchvision": torchvision.__version__,
                     "transformers": transformers.__version__, "pillow": PIL.__version__,
                     "numpy": np.__version__,
                     "cpu_capability": torch.backends.cpu.get_cpu_capability()},
        "fixtures_sha256": fixture_index["sha256"],
        "profiles": PROFILES,
        "pipelines": cases, "geometry": geometry, "expansions": expansions,
    }, indent=1) + "\n")
    print(f"{len(cases)} pipelines, {len(geometry)} geometry cases, {len(expansions)} "
          f"expansions -> {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
