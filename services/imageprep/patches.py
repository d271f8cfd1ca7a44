"""Normalisation and patchification: resized uint8 pixels -> packed `pixel_values`.

Normalisation is fused as transformers' fast processors fuse it: mean and std are scaled by
1 / rescale_factor (x255) in float32, then `(x - mean) / std` per channel, in float32, as a
subtraction and a true division (Qwen3-VL: (x - 127.5) / 127.5).

Patch layout: patches are ordered by M x M spatial-merge blocks (block row, block column, row in
block, column in block); each patch vector is ordered by channel, temporal copy, pixel row, pixel
column, the still image repeated T times along time.
"""

from __future__ import annotations

import torch

from services.imageprep.profiles import ProcessorSettings


def normalize(resized: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, 3, H, W] uint8 -> [1, 3, H, W] float32, (x - mean*255) / (std*255) per channel."""
    scale = 1.0 / settings.rescale_factor
    mean = (torch.tensor(settings.image_mean, dtype=torch.float32) * scale).view(-1, 1, 1)
    std = (torch.tensor(settings.image_std, dtype=torch.float32) * scale).view(-1, 1, 1)
    pixels = resized.to(torch.float32)
    return pixels.sub_(mean).div_(std)


def patchify(pixels: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, C, H, W] float32 -> pixel_values [N, C*T*P*P], N = (H/P) * (W/P)."""
    _, channels, height, width = pixels.shape
    p, m, t = settings.patch_size, settings.merge_size, settings.temporal_patch_size
    grid_h, grid_w = height // p, width // p
    if grid_h * p != height or grid_w * p != width or grid_h % m or grid_w % m:
        raise ValueError(f"{height}x{width} is not a multiple of patch x merge ({p * m})")
    blocks = pixels.reshape(1, channels, grid_h // m, m, p, grid_w // m, m, p)
    # [1, block_row, block_col, row_in_block, col_in_block, C, P, P]
    blocks = blocks.permute(0, 2, 5, 3, 6, 1, 4, 7)
    # Temporal copies sit between channel and pixel row: [.., C, T, P, P]
    repeated = blocks.unsqueeze(6).expand(-1, -1, -1, -1, -1, -1, t, -1, -1)
    return repeated.reshape(grid_h * grid_w, channels * t * p * p)
