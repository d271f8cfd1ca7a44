"""Typed objects between imageprep, the vision tower and the language model.

    VisionInput     one prepared image (what FetchPixels ships): pixel patches in merge-block
                    order, its patch grid, the patches' (row, column), and for Qwen3-VL the
                    position-table taps and weights
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


@dataclass(frozen=True, slots=True)
class VisionInput:
    identity: bytes                       # the image's 32-byte semantic identity
    grid: tuple[int, int, int]            # (t, h, w) patches before the spatial merge
    pixel_values: torch.Tensor            # float32 [N, C*T*P*P] (bfloat16 when fetched so
                                          # for a bf16 tower: the rounding its cast does)
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
        """From FetchPixels' named tensors (numpy or torch): pixel_values, grid_thw,
        vision_positions (computed when absent), interp_indices/interp_weights."""
        grid_values = [int(v) for v in _tensor(tensors["grid_thw"]).reshape(-1).tolist()]
        if len(grid_values) != 3:
            raise ValueError(f"grid_thw holds {len(grid_values)} values; one image is 3")
        grid = (grid_values[0], grid_values[1], grid_values[2])
        pixels = _tensor(tensors["pixel_values"])
        if pixels.dtype != torch.bfloat16:
            pixels = pixels.float()
        count = grid[0] * grid[1] * grid[2]
        if pixels.dim() != 2 or pixels.shape[0] != count:
            raise ValueError(f"pixel_values has shape {tuple(pixels.shape)}; grid {grid} "
                             f"means {count} patches")
        if grid[1] % merge or grid[2] % merge:
            raise ValueError(f"grid {grid} is not a multiple of the spatial merge {merge}")
        raw = tensors.get("vision_positions")
        positions = (merge_block_positions(grid, merge) if raw is None
                     else _tensor(raw).long().reshape(count, 2))
        indices, weights = tensors.get("interp_indices"), tensors.get("interp_weights")
        return cls(identity, grid, pixels, positions,
                   None if indices is None else _tensor(indices).long(),
                   None if weights is None else _tensor(weights).float())

    def to(self, device: torch.device | str) -> VisionInput:
        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            return None if t is None else t.to(device, non_blocking=True)

        return VisionInput(self.identity, self.grid, self.pixel_values.to(device,
                                                                          non_blocking=True),
                           self.positions.to(device), move(self.interp_indices),
                           move(self.interp_weights))


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
