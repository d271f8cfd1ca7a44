"""A probe kernel for fp8_unpack's words path alone: load an e4m3 tile as words and write
its float32 values (tests/kernels/test_fp8_gpu.py compares them with torch's cast)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from services.engine.kernels.fp8_unpack import load_weights, weight_f32


@triton.jit
def _probe(w_ptr, out_ptr, k_dim, stride, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    n = tl.arange(0, BLOCK_N)
    rows = w_ptr + n[:, None] * stride
    tile = weight_f32(load_weights(rows, 0, k_dim, n >= 0, BLOCK_K, True), BLOCK_N, BLOCK_K,
                      True)
    tl.store(out_ptr + n[:, None] * BLOCK_K + tl.arange(0, BLOCK_K)[None, :], tile)


def convert_tile(tile: torch.Tensor, k_dim: int) -> torch.Tensor:
    """The [N, K] e4m3 CUDA `tile` (K a power of two, k_dim <= K a multiple of 4) through
    load_weights + weight_f32 with E4M3_PTX: float32, zero from k_dim on."""
    n, k = tile.shape
    out = torch.empty(n, k, dtype=torch.float32, device=tile.device)
    _probe[(1,)](tile, out, k_dim, tile.stride(0), BLOCK_N=n, BLOCK_K=k)
    return out
