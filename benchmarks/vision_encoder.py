"""bench_vision's in-process stage: the vision encoder alone, per attention backend.

    report = encoder_stage(config, device)   # ms per backend for one 1024x768 image

Builds the checkpoint's vision tower (random weights, bf16 on CUDA, float32 on the CPU),
prepares one 1024x768 image through imageprep's own pipeline (the Qwen2.5-VL profile: 74 x 54
patches, 999 image tokens) and times the tower's forward with each encoder attention backend
(engine setting `vision_attention`: sdpa, triton), the median of a few synchronised runs,
plus the relative difference of the two backends' features. The triton backend needs CUDA
(skipped on the CPU). `encoder_segments()` gives that image's attention segments (its
windows and the whole image), which tests/kernels/test_vision_attention.py also uses.
"""

from __future__ import annotations

import functools
import statistics
import time
from typing import Any

import numpy as np
import torch

WIDTH, HEIGHT = 1024, 768


def prepared_image(width: int = WIDTH, height: int = HEIGHT) -> Any:
    """A photo-like image prepared by imageprep's pipeline (Qwen2.5-VL profile)."""
    from services.imageprep.decode import DecodedImage
    from services.imageprep.processor import process_image
    from services.imageprep.profiles import builtin_profile

    rng = np.random.default_rng(0)
    base = np.linspace(0, 255, width, dtype=np.float32)[None, :, None]
    rgb = np.clip(base + rng.normal(0, 8, (height, width, 3)), 0, 255).astype(np.uint8)
    return process_image(DecodedImage(np.ascontiguousarray(rgb), "RGB", 1),
                         builtin_profile("qwen2_5_vl"))


def _tower(config: dict, device: str, dtype: torch.dtype) -> Any:
    from services.engine.model.vision.config import parse_vision
    from services.engine.model.vision.towers import Qwen2_5_VisionTower

    vision = parse_vision(config, "qwen2_5_vl", int(config["text_config"]["hidden_size"]))
    tower = Qwen2_5_VisionTower(vision, device=device, dtype=dtype)
    generator = torch.Generator(device).manual_seed(0)
    with torch.no_grad():
        for parameter in tower.parameters():
            parameter.normal_(0.0, 0.02, generator=generator)
    return tower


def _inputs(tower: Any) -> list[Any]:
    from services.engine.model.vision.inputs import VisionInput

    prepared = prepared_image()
    return [VisionInput.from_tensors(prepared.identity, prepared.tensors,
                                     tower.config.spatial_merge_size)]


def encoder_segments(config: dict | None = None) -> list[list[int]]:
    """cu_seqlens of the 1024x768 image's window blocks and full-attention blocks."""
    from benchmarks.bench_vision import CONFIG
    from services.engine.model.vision.config import parse_vision
    from services.engine.model.vision.inputs import VisionInput
    from services.engine.model.vision.towers import frame_seqlens, window_layout

    config = config or CONFIG
    vision = parse_vision(config, "qwen2_5_vl", int(config["text_config"]["hidden_size"]))

    prepared = prepared_image()
    images = [VisionInput.from_tensors(prepared.identity, prepared.tensors,
                                       vision.spatial_merge_size)]
    _, windows = window_layout(images, vision)
    return [list(windows), list(frame_seqlens(images))]


def _time(run: Any, device: str, repeats: int) -> float:
    """Median milliseconds of `run()` (after two warm-up calls)."""
    times = []
    for index in range(repeats + 2):
        if device == "cuda":
            torch.cuda.synchronize()
        started = time.perf_counter()
        run()
        if device == "cuda":
            torch.cuda.synchronize()
        if index >= 2:
            times.append(1e3 * (time.perf_counter() - started))
    return statistics.median(times)


def encoder_stage(config: dict, device: str, repeats: int = 5) -> dict:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tower = _tower(config, device, dtype)
    images = _inputs(tower)
    report: dict[str, Any] = {"image": f"{WIDTH}x{HEIGHT}", "patches": images[0].num_patches,
                              "dtype": str(dtype).removeprefix("torch."), "ms": {}}
    features = {}
    for backend in ("sdpa", "triton"):
        if backend == "triton" and device != "cuda":
            report["ms"][backend] = None                 # the paged kernel needs CUDA
            continue
        tower.attention_backend = backend
        report["ms"][backend] = _time(functools.partial(tower, images), device, repeats)
        features[backend] = tower(images)[0].features.float()
    if len(features) == 2:
        want = features["sdpa"]
        report["triton_vs_sdpa_rel_diff"] = float((features["triton"] - want).norm() /
                                                  want.norm())
    timed = {k: v for k, v in report["ms"].items() if v is not None}
    report["faster"] = min(timed, key=timed.__getitem__)
    del tower
    if device == "cuda":
        torch.cuda.empty_cache()
    return report
