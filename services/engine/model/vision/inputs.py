"""Typed objects between imageprep, the vision tower and the language model.

    VisionInput     one prepared image (what FetchPixels ships): pixel patches in merge-block
                    order (or RawPixels: the resized uint8 image they are computed from on
                    the device), its patch grid, the patches' (row, column), and for Qwen3-VL
                    the position-table taps and weights
    ImageFeatures   the tower's output for one image: [tokens, hidden] features (the rows that
                    replace its image-pad embeddings) and, for Qwen3-VL, one [tokens, hidden]
                    deepstack tensor per injected decoder layer
    ImageEmbeds     what one forward pass merges: the batch rows holding image tokens and
                    their features (ForwardBatch.images)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from services.common.pixel_patches import PATCH_LAYOUT, PIXEL_NORM, RAW_PIXELS, pixel_values


def merge_block_positions(grid: tuple[int, int, int], merge: int) -> torch.Tensor:
    """int64 [t*h*w, 2]: (row, column) of each patch in merge-block order, frames repeated."""
    t, h, w = grid
    rows = torch.arange(h).view(h // merge, merge, 1, 1).expand(h // merge, merge, w // merge,
                                                                   merge)
    cols = torch.arange(w).view(1, 1, w // merge, merge).expand(h // merge, merge, w // merge,
                                                                   merge)
    rows = rows.permute(0, 2, 1, 3).reshape(-1)
    cols = cols.permute(0, 2, 1, 3).reshape(-1)
    return torch.stack((rows, cols), dim=-1).repeat(t, 1)


def _tensor(value: Any) -> torch.Tensor:
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    return torch.as_tensor(value)


def _rows(value: Any, name: str, count: int, width: int) -> torch.Tensor:
    """A per-patch tensor [count, width] (ValueError naming it otherwise)."""
    tensor = _tensor(value)
    if tensor.numel() != count * width:
        raise ValueError(f"{name} has shape {list(tensor.shape)}; {count} patches need "
                         f"[{count}, {width}]")
    return tensor.reshape(count, width)


@dataclass(frozen=True, slots=True)
class RawPixels:
    """An image's resized uint8 pixels and the constants that make its pixel_values
    (FetchPixels' `pixel_dtype: "uint8"`): 2.3 MB to copy to the device for a 1024x768 image,
    against 19 MB of float32 patches; `values` computes them there, with the bits imageprep's
    own computation gives (services/common/pixel_patches.py)."""

    hwc: torch.Tensor                     # uint8 [H, W, C]
    patch_size: int
    merge_size: int
    temporal: int
    mean: tuple[float, ...]               # fused: image_mean / rescale_factor
    std: tuple[float, ...]

    @property
    def shape(self) -> tuple[int, int]:
        """pixel_values' [N, C*T*P*P]."""
        height, width, channels = self.hwc.shape
        p = self.patch_size
        return (height // p) * (width // p), channels * self.temporal * p * p

    def values(self, device: torch.device | str) -> torch.Tensor:
        """float32 pixel_values [N, C*T*P*P] on `device` (the pixels copied there first)."""
        return pixel_values(self.hwc.to(device, non_blocking=True), patch_size=self.patch_size,
                            merge_size=self.merge_size, temporal=self.temporal,
                            mean=self.mean, std=self.std)

    @classmethod
    def from_tensors(cls, tensors: Mapping[str, Any]) -> RawPixels:
        """From FetchPixels' pixels_hwc, pixel_norm and patch_layout."""
        hwc = _tensor(tensors[RAW_PIXELS])
        norm = _tensor(tensors[PIXEL_NORM]).float()
        layout = [int(v) for v in _tensor(tensors[PATCH_LAYOUT]).reshape(-1).tolist()]
        if hwc.dtype != torch.uint8 or hwc.dim() != 3:
            raise ValueError(f"pixels_hwc is {hwc.dtype} {list(hwc.shape)}; raw pixels are "
                             "uint8 [H, W, C]")
        channels = hwc.shape[-1]
        if tuple(norm.shape) != (2, channels) or len(layout) != 3 or min(layout) < 1:
            raise ValueError(f"pixel_norm {list(norm.shape)} and patch_layout {layout} do "
                             f"not describe {channels}-channel pixels")
        side = layout[0] * layout[1]
        if hwc.shape[0] % side or hwc.shape[1] % side:
            raise ValueError(f"{hwc.shape[0]}x{hwc.shape[1]} pixels are not a multiple of "
                             f"patch x merge ({side})")
        return cls(hwc, layout[0], layout[1], layout[2], tuple(norm[0].tolist()),
                   tuple(norm[1].tolist()))


def on_device(pixels: torch.Tensor | RawPixels, device: torch.device | str) -> torch.Tensor:
    """An image's pixel_values on `device`: copied (pinned ones asynchronously), or computed
    there from its raw pixels."""
    if isinstance(pixels, RawPixels):
        return pixels.values(device)
    return pixels.to(device, non_blocking=True)


@dataclass(frozen=True, slots=True)
class VisionInput:
    identity: bytes                       # the image's 32-byte semantic identity
    grid: tuple[int, int, int]            # (t, h, w) patches before the spatial merge
    pixel_values: torch.Tensor | RawPixels  # float32 [N, C*T*P*P] (bfloat16 when fetched
                                          # so for a bf16 tower: the rounding its cast does),
                                          # or the raw pixels they are computed from
    positions: torch.Tensor               # int64 [N, 2]
    interp_indices: torch.Tensor | None = None   # int64 [N, 4] (Qwen3-VL)
    interp_weights: torch.Tensor | None = None   # float32 [N, 4]

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]

    def num_tokens(self, merge: int) -> int:
        return self.num_patches // (merge * merge)

    @classmethod
    def from_tensors(cls, identity: bytes, tensors: Mapping[str, Any], merge: int
                     ) -> VisionInput:
        """From FetchPixels' named tensors (numpy or torch): pixel_values (or pixels_hwc,
        pixel_norm and patch_layout: RawPixels), grid_thw, vision_positions (computed when
        absent), interp_indices/interp_weights."""
        grid_values = [int(v) for v in _tensor(tensors["grid_thw"]).reshape(-1).tolist()]
        if len(grid_values) != 3:
            raise ValueError(f"grid_thw holds {len(grid_values)} values; one image is 3")
        grid = (grid_values[0], grid_values[1], grid_values[2])
        pixels: torch.Tensor | RawPixels
        if RAW_PIXELS in tensors:
            pixels = RawPixels.from_tensors(tensors)
            if pixels.merge_size != merge:
                raise ValueError(f"the pixels were prepared for a spatial merge of "
                                 f"{pixels.merge_size}; this model merges {merge}")
        else:
            pixels = _tensor(tensors["pixel_values"])
            if pixels.dtype != torch.bfloat16:
                pixels = pixels.float()
        count = grid[0] * grid[1] * grid[2]
        if len(pixels.shape) != 2 or pixels.shape[0] != count:
            raise ValueError(f"pixel_values has shape {tuple(pixels.shape)}; grid {grid} "
                             f"means {count} patches")
        if grid[1] % merge or grid[2] % merge:
            raise ValueError(f"grid {grid} is not a multiple of the spatial merge {merge}")
        raw = tensors.get("vision_positions")
        positions = (merge_block_positions(grid, merge) if raw is None
                     else _rows(raw, "vision_positions", count, 2).long())
        indices, weights = tensors.get("interp_indices"), tensors.get("interp_weights")
        if indices is not None:
            indices = _rows(indices, "interp_indices", count, 4).long()
        if weights is not None:
            weights = _rows(weights, "interp_weights", count, 4).float()
        return cls(identity, grid, pixels, positions, indices, weights)


@dataclass(frozen=True, slots=True)
class ImageFeatures:
    features: torch.Tensor                      # [tokens, hidden], the model dtype
    deepstack: tuple[torch.Tensor, ...] = ()    # [tokens, hidden] per deepstack layer

    @property
    def num_tokens(self) -> int:
        return int(self.features.shape[0])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.features, *self.deepstack))


@dataclass(frozen=True, slots=True)
class ImageEmbeds:
    rows: torch.Tensor                          # int64 [R]: batch rows holding image tokens
    features: torch.Tensor                      # [R, hidden]
    deepstack: tuple[torch.Tensor, ...] = ()    # [R, hidden] per deepstack layer

    @classmethod
    def gather(cls, pieces: Sequence[tuple[int, ImageFeatures, int, int]],
               device: torch.device | str) -> ImageEmbeds | None:
        """pieces: (first batch row, the image's features, first feature row, count) for
        each image span (or part of one) the batch holds; None when there is none."""
        pieces = [p for p in pieces if p[3] > 0]
        if not pieces:
            return None
        rows = torch.cat([torch.arange(row, row + count) for row, _, _, count in pieces])
        features = torch.cat([f.features[first:first + count]
                              for _, f, first, count in pieces])
        depth = len(pieces[0][1].deepstack)
        deepstack = tuple(torch.cat([f.deepstack[i][first:first + count]
                                     for _, f, first, count in pieces]) for i in range(depth))
        return cls(rows.to(device), features, deepstack)
