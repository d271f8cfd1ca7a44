"""Resized uint8 pixels -> packed, normalised `pixel_values`, on any torch device: the one
implementation imageprep (services/imageprep/patches.py, on the CPU) and the engine (the
image's raw pixels fetched as `pixel_dtype: "uint8"`, on its GPU) both run.

    values = pixel_values(hwc, patch_size=14, merge_size=2, temporal=2,
                          mean=(...), std=(...))         # float32 [N, C*T*P*P], hwc's device

Patch layout: patches are ordered by M x M spatial-merge blocks (block row, block column, row in
block, column in block); each patch vector is ordered by channel, temporal copy, pixel row, pixel
column, the still image repeated T times along time.

Normalisation is fused as transformers' fast processors fuse it: mean and std are the
processor's, scaled by 1 / rescale_factor (x255) in float32 (`fused_stats`), then
`(x - mean) / std` per channel, in float32, as a subtraction and a true division (Qwen3-VL:
(x - 127.5) / 127.5). Both are correctly rounded IEEE float32 operations on the CPU and on CUDA,
and elementwise float32 operations give the same bits in any memory order, so the pixels are
gathered straight into patch order while converting them to float32, in the first temporal slot
of the output (the patch-order view of the pixels is copied into a matching view of the output,
with no uint8 patch copy in between), that slot is normalised in place and copied for the other
T - 1: the same bytes as normalise-then-patchify, with no intermediate image, on either device.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

# FetchPixels' raw form (`pixel_dtype: RAW_DTYPE`): the tensors sent in pixel_values' place,
# from which `pixel_values` makes them: the resized image uint8 [H, W, 3], the fused mean and
# std float32 [2, 3], and int64 [3] patch size, merge size, temporal copies
RAW_DTYPE = "uint8"
RAW_PIXELS, PIXEL_NORM, PATCH_LAYOUT = "pixels_hwc", "pixel_norm", "patch_layout"


def patch_blocks(pixels: torch.Tensor, patch_size: int, merge_size: int) -> torch.Tensor:
    """[1, C, H, W] -> a view [H/(PM), W/(PM), M, M, C, P, P]: (block row, block column, row
    in block, column in block, channel, pixel row, pixel column); P patch side, M merge."""
    p, m = patch_size, merge_size
    height, width = pixels.shape[-2:]
    grid_h, grid_w = height // p, width // p
    if grid_h * p != height or grid_w * p != width or grid_h % m or grid_w % m:
        raise ValueError(f"{height}x{width} is not a multiple of patch x merge ({p * m})")
    # Splitting H and W is a view in any layout; the permute only reorders strides.
    blocks = pixels[0].unflatten(1, (grid_h // m, m, p)).unflatten(4, (grid_w // m, m, p))
    return blocks.permute(1, 4, 2, 5, 0, 3, 6)


def fused_stats(image_mean: Sequence[float], image_std: Sequence[float],
                rescale_factor: float) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The processor's mean and std scaled by 1 / rescale_factor, computed in float32 (the
    values `pixel_values` takes: exactly representable as float32)."""
    scale = 1.0 / rescale_factor
    mean = torch.tensor(list(image_mean), dtype=torch.float32) * scale
    std = torch.tensor(list(image_std), dtype=torch.float32) * scale
    return tuple(mean.tolist()), tuple(std.tolist())


def normalised_patches(blocks: torch.Tensor, mean: Sequence[float], std: Sequence[float],
                       temporal: int, out: torch.Tensor | None = None) -> torch.Tensor:
    """A [rows, cols, M, M, C, P, P] uint8 block view (`patch_blocks`) -> float32
    [N, C*T*P*P] patches on the blocks' device, written into `out` ([N, C, T, P, P] float32,
    e.g. memory the caller allocated) when given."""
    rows, cols, m, _, channels, p, _ = blocks.shape
    num_patches = rows * cols * m * m
    if out is None:
        out = torch.empty((num_patches, channels, temporal, p, p), dtype=torch.float32,
                          device=blocks.device)
    stats = torch.tensor([list(mean), list(std)], dtype=torch.float32).view(2, -1, 1, 1)
    stats = stats.to(blocks.device, non_blocking=True)
    first = out[:, :, 0]
    # uint8 -> float32 and the patch gather in one copy, into the same 7-d shape of the slot
    first.view(rows, cols, m, m, channels, p, p).copy_(blocks)
    first.sub_(stats[0]).div_(stats[1])
    for copy in range(1, temporal):                                # the temporal copies
        out[:, :, copy].copy_(first)
    return out.view(num_patches, channels * temporal * p * p)


def pixel_values(hwc: torch.Tensor, *, patch_size: int, merge_size: int, temporal: int,
                 mean: Sequence[float], std: Sequence[float]) -> torch.Tensor:
    """uint8 [H, W, C] pixels (any device) -> float32 pixel_values [N, C*T*P*P] there."""
    if hwc.dtype != torch.uint8 or hwc.dim() != 3:
        raise ValueError(f"raw pixels are uint8 [H, W, C], got {hwc.dtype} "
                         f"{list(hwc.shape)}")
    chw = hwc.permute(2, 0, 1)[None]                                 # channels-last view
    return normalised_patches(patch_blocks(chw, patch_size, merge_size), mean, std, temporal)
