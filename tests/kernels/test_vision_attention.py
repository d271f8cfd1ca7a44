"""The vision encoder's `triton` attention backend (the paged kernel in its decode form, each
patch row a one-query sequence over its segment's keys) against the `sdpa` backend: unequal
segments (images of different sizes, Qwen2.5-VL windows) and equal ones, head dims that are
and are not powers of two. Small cases through the interpreter on the CPU; the `gpu` case at
the Qwen2.5-VL-7B tower's heads (16 x 80) over a 1024x768 image's windows and full rows."""

from __future__ import annotations

import pytest
import torch

from services.engine.model.vision.layers import Segments, varlen_attention
from tests.kernels.conftest import HAS_CUDA


def _compare(cu_seqlens, heads, dim, device, dtype, tolerance):
    torch.manual_seed(0)
    rows = cu_seqlens[-1]
    q, k, v = (torch.randn(rows, heads, dim, device=device, dtype=dtype) for _ in range(3))
    scale = dim ** -0.5
    want = varlen_attention(q.float(), k.float(), v.float(), Segments.of(cu_seqlens, device),
                            scale)
    got = varlen_attention(q, k, v, Segments.of(cu_seqlens, device, "triton"), scale)
    assert got.shape == want.shape
    error = (got.float() - want).norm() / want.norm()
    assert error <= tolerance, float(error)
    return want, got


@pytest.mark.parametrize("cu_seqlens", [[0, 5, 21, 24], [0, 16, 32, 48], [0, 1, 40]])
@pytest.mark.parametrize("dim", [16, 20])
def test_triton_backend_equals_sdpa(cu_seqlens, dim, device):
    # sdpa masks each row to its own segment: a row that saw another segment's keys (or
    # missed one of its own, causally) would differ by far more than the tolerance
    _compare(cu_seqlens, 2, dim, device, torch.float32, 1e-2 if HAS_CUDA else 1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_qwen2_5_vl_7b_shape_on_cuda():
    from benchmarks.vision_encoder import encoder_segments

    for cu_seqlens in encoder_segments():
        _compare(cu_seqlens, 16, 80, "cuda", torch.bfloat16, 2e-2)
