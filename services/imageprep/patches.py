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

A prepared image keeps `PixelPatches`: its resized uint8 pixels (H x W x 3, an eighth of the
float32 pixel_values' bytes) and the constants above; `values(first_row, last_row)` computes
the pixel_values of rows of merge blocks on demand (FetchPixels' chunks), with the same bits as
the whole tensor: the operations are elementwise. Preparing an image no longer writes ~19 MB
of fresh memory per retained image (on the CPU box that first touch cost ~28 ms of a cold
Prepare, against 2 ms for the same work in warm buffers).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch

from services.imageprep.profiles import ProcessorSettings


def _patch_blocks(pixels: torch.Tensor, p: int, m: int) -> torch.Tensor:
    """[1, C, H, W] -> a view [H/(PM), W/(PM), M, M, C, P, P]: (block row, block column, row
    in block, column in block, channel, pixel row, pixel column); P patch side, M merge."""
    height, width = pixels.shape[-2:]
    grid_h, grid_w = height // p, width // p
    if grid_h * p != height or grid_w * p != width or grid_h % m or grid_w % m:
        raise ValueError(f"{height}x{width} is not a multiple of patch x merge ({p * m})")
    # Splitting H and W is a view in any layout; the permute only reorders strides.
    blocks = pixels[0].unflatten(1, (grid_h // m, m, p)).unflatten(4, (grid_w // m, m, p))
    return blocks.permute(1, 4, 2, 5, 0, 3, 6)


def patch_order(pixels: torch.Tensor, settings: ProcessorSettings) -> torch.Tensor:
    """[1, C, H, W] -> [N, C, P, P] (same dtype), patches in merge-block order."""
    blocks = _patch_blocks(pixels, settings.patch_size, settings.merge_size)
    rows, cols, m, _, channels, p, _ = blocks.shape
    return blocks.reshape(rows * cols * m * m, channels, p, p)


def _channel_stats(settings: ProcessorSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused mean and std, [C, 1, 1] float32: (value x 1/rescale_factor) computed in float32."""
    scale = 1.0 / settings.rescale_factor
    mean = torch.tensor(settings.image_mean, dtype=torch.float32) * scale
    std = torch.tensor(settings.image_std, dtype=torch.float32) * scale
    return mean.view(-1, 1, 1), std.view(-1, 1, 1)


def _normalised_patches(blocks: torch.Tensor, mean: torch.Tensor, std: torch.Tensor,
                        temporal: int) -> torch.Tensor:
    """A [rows, cols, M, M, C, P, P] uint8 block view -> float32 [n, C*T*P*P] patches."""
    rows, cols, m, _, channels, p, _ = blocks.shape
    num_patches = rows * cols * m * m
    # [N, C, T, P, P], allocated by numpy: it asks the kernel for transparent huge pages on
    # large buffers (madvise)
    out = torch.from_numpy(np.empty((num_patches, channels, temporal, p, p), dtype=np.float32))
    first = out[:, :, 0]
    # uint8 -> float32 and the patch gather in one copy, into the same 7-d shape of the slot
    first.view(rows, cols, m, m, channels, p, p).copy_(blocks)
    first.sub_(mean).div_(std)
    for copy in range(1, temporal):                                # the temporal copies
        out[:, :, copy].copy_(first)
    return out.view(num_patches, channels * temporal * p * p)


@dataclass(frozen=True, slots=True)
class PixelPatches:
    """One image's pixel_values, kept as its resized uint8 pixels (module docstring)."""

    pixels: np.ndarray                      # uint8 [H, W, 3], C-contiguous
    patch_size: int
    merge_size: int
    temporal: int
    mean: tuple[float, float, float]        # fused: image_mean / rescale_factor (float32 values)
    std: tuple[float, float, float]

    @classmethod
    def from_resized(cls, resized: torch.Tensor, settings: ProcessorSettings) -> PixelPatches:
        """From the [1, 3, H, W] uint8 resized pixels (a view when they are channels-last)."""
        hwc = np.ascontiguousarray(resized[0].permute(1, 2, 0).numpy())
        mean, std = _channel_stats(settings)
        return cls(hwc, settings.patch_size, settings.merge_size,
                   settings.temporal_patch_size, tuple(mean.view(-1).tolist()),
                   tuple(std.view(-1).tolist()))

    @property
    def block_rows(self) -> int:
        """Rows of merge blocks (each `patches_per_block_row` consecutive patches)."""
        return self.pixels.shape[0] // (self.patch_size * self.merge_size)

    @property
    def patches_per_block_row(self) -> int:
        return (self.pixels.shape[1] // self.patch_size) * self.merge_size

    @property
    def shape(self) -> tuple[int, int]:
        """pixel_values' [N, C*T*P*P]."""
        return (self.block_rows * self.patches_per_block_row,
                3 * self.temporal * self.patch_size * self.patch_size)

    @property
    def nbytes(self) -> int:
        """pixel_values' float32 bytes."""
        rows, width = self.shape
        return rows * width * 4

    def values(self, first_row: int = 0, last_row: int | None = None, *,
               bfloat16: bool = False) -> np.ndarray:
        """float32 pixel_values of merge-block rows [first_row, last_row) (all by default);
        `bfloat16`: their bfloat16 bit patterns (int16), rounded by torch's CPU cast, which
        is what a bf16 vision tower's own cast of the float32 values would give."""
        last = self.block_rows if last_row is None else last_row
        side = self.patch_size * self.merge_size
        with warnings.catch_warnings():     # a record's pixels view its blob, read-only:
            warnings.simplefilter("ignore", UserWarning)    # this tensor is only read
            hwc = torch.from_numpy(self.pixels)
        chw = hwc.permute(2, 0, 1)[None]                                 # channels-last view
        blocks = _patch_blocks(chw[:, :, first_row * side:last * side], self.patch_size,
                               self.merge_size)
        mean = torch.tensor(self.mean, dtype=torch.float32).view(-1, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(-1, 1, 1)
        values = _normalised_patches(blocks, mean, std, self.temporal)
        if bfloat16:
            return values.to(torch.bfloat16).view(torch.int16).numpy()
        return values.numpy()
