"""Per-patch positions: 2-D vision positions and the learned position-table interpolation.

`vision_positions` gives each patch its (row, column) in the patch grid, in the merge-block
order of `pixel_values`; the vision encoder's 2-D rotary embedding reads it.

Qwen3-VL adds a learned S x S position table (S = 48) resampled to each image's grid by
bilinear interpolation with align_corners=True. `table_interpolation` returns, per patch, the 4
flattened table indices and their weights, computed in float32 in the same operation order as
transformers' vision helper (source coordinate = index * (S - 1) / max(size - 1, 1), floor, the
two neighbours clamped to the table, hat-kernel weights, outer product rows x columns), so the
bytes match with no tolerance.
"""

from __future__ import annotations

import torch

from services.imageprep.prepared import ImageGeometry


def vision_positions(geometry: ImageGeometry) -> torch.Tensor:
    """[N, 2] int64 (row, column) per patch, merge-block order, repeated for grid_t frames."""
    h, w, m = geometry.grid_h, geometry.grid_w, geometry.merge_size
    rows = torch.arange(h).view(h, 1).expand(h, w)
    cols = torch.arange(w).view(1, w).expand(h, w)

    def block_order(grid: torch.Tensor) -> torch.Tensor:
        return grid.reshape(h // m, m, w // m, m).transpose(1, 2).flatten()

    frame = torch.stack([block_order(rows), block_order(cols)], dim=-1)
    return frame.repeat(geometry.grid_t, 1)


def _axis_taps(index: torch.Tensor, size: int, side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two taps per target position on one axis of `size` cells, into a `side`-long table."""
    coordinate = index.to(torch.float32)
    # A full-length divisor tensor (not a scalar) keeps this a true per-element division.
    divisor = torch.full_like(index, max(size - 1, 1))
    source = coordinate * (side - 1) / divisor
    floor = torch.floor(source)
    offsets = torch.arange(0, 2)
    taps = (floor.long()[:, None] + offsets).clamp(0, side - 1)
    distance = (source[:, None] - floor[:, None] - offsets).abs()
    weights = (1 - distance).clamp(min=0)
    return taps, weights


def table_interpolation(positions: torch.Tensor, geometry: ImageGeometry,
                        side: int) -> tuple[torch.Tensor, torch.Tensor]:
    """([N, 4] int64 indices into the flattened side x side table, [N, 4] float32 weights)."""
    row_taps, row_weights = _axis_taps(positions[:, 0], geometry.grid_h, side)
    col_taps, col_weights = _axis_taps(positions[:, 1], geometry.grid_w, side)
    indices = (row_taps[:, :, None] * side + col_taps[:, None, :]).reshape(-1, 4)
    weights = (row_weights[:, :, None] * col_weights[:, None, :]).reshape(-1, 4)
    return indices, weights
