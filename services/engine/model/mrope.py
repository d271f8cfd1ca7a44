"""Multimodal rotary embeddings (mRoPE): three position rows (T, H, W) per token.

Each of the head's D/2 rotation frequencies reads one of the three rows:

- Qwen2.5-VL (sections): `mrope_section = (s_t, s_h, s_w)` consecutive blocks of frequencies
  read T, H, W in turn;
- Qwen3-VL (interleaved): frequency j reads H when j % 3 == 1 and j < 3 s_h, W when
  j % 3 == 2 and j < 3 s_w, T otherwise.

A text token has the same value on every row, so for text the result is the plain rotary
embedding of that position. `mrope_cos_sin(positions [3, T], table, selector)` gathers the
per-token cos/sin rows [T, D] from the model's ordinary table (`rope.build_cos_sin_cache`):
the decoder layers then rotate row t with entry t of it (positions 0..T-1), so the fused
attention prologue and its kernels are unchanged. Tensor ops only (graph-safe).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def frequency_rows(section: Sequence[int], interleaved: bool) -> list[int]:
    """The position row (0 T, 1 H, 2 W) each of the D/2 frequencies reads."""
    half = sum(section)
    if not interleaved:
        return [row for row, size in enumerate(section) for _ in range(size)]
    rows = [0] * half
    for row, offset in ((1, 1), (2, 2)):
        for j in range(offset, min(3 * section[row], half), 3):
            rows[j] = row
    return rows


def row_selector(section: Sequence[int], interleaved: bool, device: torch.device | str
                 ) -> torch.Tensor:
    """int64 [D]: the row each column of a cos/sin table entry reads (cos half, sin half)."""
    rows = frequency_rows(section, interleaved)
    return torch.tensor(rows + rows, dtype=torch.int64, device=device)


def mrope_cos_sin(positions: torch.Tensor, table: torch.Tensor, selector: torch.Tensor
                  ) -> torch.Tensor:
    """positions int64 [3, T], table [max_pos, D], selector [D] -> per-token cos/sin [T, D]."""
    gathered = table[positions]                                       # [3, T, D]
    index = selector.view(1, 1, -1).expand(1, positions.shape[1], -1)
    return gathered.gather(0, index).squeeze(0)                       # [T, D]


def decode_positions(positions: torch.Tensor, rope_delta: int) -> torch.Tensor:
    """Generated (or text-only) tokens at token index p: p + rope_delta on all three rows."""
    shifted = positions + rope_delta
    return shifted.unsqueeze(0).expand(3, -1)
