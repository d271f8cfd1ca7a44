"""Patchification and normalisation: resized uint8 pixels -> packed `pixel_values`.

Patch layout: patches are ordered by M x M spatial-merge blocks (block row, block column, row in
block, column in block); each patch vector is ordered by channel, temporal copy, pixel row, pixel
column, the still image repeated T times along time.

Normalisation is fused as transformers' fast processors fuse it: mean and std are scaled by
1 / rescale_factor (x255) in float32, then `(x - mean) / std` per channel, in float32, as a
subtraction and a true division (Qwen3-VL: (x - 127.5) / 127.5). Elementwise float32 operations
give the same bits in any memory order, so this module gathers the uint8 pixels straight into
patch order while converting them to float32, in the first temporal slot of the output (one
pass: the patch-order view of the pixels is copied into a matching view of the output, with no
uint8 patch copy in between), normalises that slot in place, and copies it for the other T - 1:
the same bytes as normalise-then-patchify, with no intermediate image. The pixels may be in
any memory layout (channels-last when no resize ran).
"""

from __future__ import annotations

import numpy as np
import torch

from services.imageprep.profiles import ProcessorSettings


def _patch_blocks(pixels: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, C, H, W] -> a view [H/(PM), W/(PM), M, M, C, P, P]: (block row, block column, row
    in block, column in block, channel, pixel row, pixel column)."""
    height, width = pixels.shape[-2:]
    p, m = settings.patch_size, settings.merge_size
    grid_h, grid_w = height // p, width // p
    if grid_h * p != height or grid_w * p != width or grid_h % m or grid_w % m:
        raise ValueError(f"{height}x{width} is not a multiple of patch x merge ({p * m})")
    # Splitting H and W is a view in any layout; the permute only reorders strides.
    blocks = pixels[0].unflatten(1, (grid_h // m, m, p)).unflatten(4, (grid_w // m, m, p))
    return blocks.permute(1, 4, 2, 5, 0, 3, 6)


def patch_order(pixels: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, C, H, W] -> [N, C, P, P] (same dtype), patches in merge-block order."""
    blocks = _patch_blocks(pixels, settings)
    rows, cols, m, _, channels, p, _ = blocks.shape
    return blocks.reshape(rows * cols * m * m, channels, p, p)


def _channel_stats(settings: ProcessorSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused mean and std, [C, 1, 1] float32: (value x 1/rescale_factor) computed in float32."""
    scale = 1.0 / settings.rescale_factor
    mean = torch.tensor(settings.image_mean, dtype=torch.float32) * scale
    std = torch.tensor(settings.image_std, dtype=torch.float32) * scale
    return mean.view(-1, 1, 1), std.view(-1, 1, 1)


def pixel_values(resized: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, 3, H, W] uint8 -> pixel_values [N, C*T*P*P] float32, N = (H/P) * (W/P)."""
    blocks = _patch_blocks(resized, settings)      # [rows, cols, M, M, C, P, P] uint8 view
    rows, cols, m, _, channels, p, _ = blocks.shape
    num_patches = rows * cols * m * m
    t = settings.temporal_patch_size
    # [N, C, T, P, P], allocated by numpy: it asks the kernel for transparent huge pages on
    # large buffers (madvise), and this ~19 MB buffer is new memory for every image (it is
    # retained), so first-touch page faults cost about a third of what 4 KiB pages cost.
    out = torch.from_numpy(np.empty((num_patches, channels, t, p, p), dtype=np.float32))
    first = out[:, :, 0]
    # uint8 -> float32 and the patch gather in one copy, into the same 7-d shape of the slot
    first.view(rows, cols, m, m, channels, p, p).copy_(blocks)
    mean, std = _channel_stats(settings)
    first.sub_(mean).div_(std)
    for copy in range(1, t):                                       # the temporal copies
        out[:, :, copy].copy_(first)
    return out.view(num_patches, channels * t * p * p)
