"""rms_norm and fused_add_rms_norm against float64, over widths, row counts, dtypes and
strided inputs; `out=` aliasing for the in-place form."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.norm import fused_add_rms_norm, rms_norm
from tests.kernels import reference
from tests.kernels.conftest import INTERPRETED

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _rand(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: torch.device, scale: float = 1.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(dtype).to(device)


def _assert_sum(summed: torch.Tensor, expect: torch.Tensor) -> None:
    """The residual stream matches the unfused add bit for bit on the GPU; Triton's interpreter
    truncates fp32 -> bf16 instead of rounding to nearest, so there it is within one bf16 ulp."""
    if INTERPRETED:
        assert torch.allclose(summed.double(), expect.double(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(summed, expect)


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert torch.isfinite(out).all()
    assert reference.rel_error(out, ref) < TOL[dtype]
    assert reference.row_rel_errors(out, ref).max() < 3 * TOL[dtype]


SMALL = [(1, 64), (7, 128), (33, 96), (5, 1000), (3, 4096)]
GPU = [(1, 4096), (256, 4096), (4097, 4096), (8192, 1024), (64, 8192), (2, 16384), (3, 20000), (1000, 128)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "hidden"), SMALL)
def test_rms_norm_small(rows, hidden, dtype, device, gen) -> None:
    x = _rand(gen, rows, hidden, dtype=dtype, device=device, scale=3.0)
    w = _rand(gen, hidden, dtype=dtype, device=device)
    out = torch.full_like(x, float("nan"))
    rms_norm(x, w, 1e-6, out=out)
    _check(out, reference.rms_norm(x, w, 1e-6), dtype)


@pytest.mark.parametrize(("rows", "hidden"), SMALL)
def test_fused_add_small(rows, hidden, device, gen) -> None:
    dtype = torch.bfloat16
    x = _rand(gen, rows, hidden, dtype=dtype, device=device)
    res = _rand(gen, rows, hidden, dtype=dtype, device=device, scale=4.0)
    normed, summed = fused_add_rms_norm(x, res, _w := _rand(gen, hidden, dtype=dtype, device=device), 1e-5)
    _assert_sum(summed, x + res)
    _check(normed, reference.rms_norm(x + res, _w, 1e-5), dtype)


def test_in_place_and_strided(device, gen) -> None:
    dtype = torch.bfloat16
    qkv = _rand(gen, 9, 6, 64, dtype=dtype, device=device)
    q = qkv[:, :4]  # [9, 4, 64] view: rows are not evenly strided across the two dims
    w = _rand(gen, 64, dtype=dtype, device=device)
    _check(rms_norm(q, w, 1e-6), reference.rms_norm(q, w, 1e-6), dtype)
    before = qkv.clone()
    rms_norm(q, w, 1e-6, out=torch.empty_like(q))
    assert torch.equal(qkv, before)  # read in place, nothing written back
    normed, summed = fused_add_rms_norm(q, qkv[:, 2:], w, 1e-6)  # two strided [9, 4, 64] views
    _assert_sum(summed, q + qkv[:, 2:])
    _check(normed, reference.rms_norm(q + qkv[:, 2:], w, 1e-6), dtype)
    x = _rand(gen, 5, 256, dtype=dtype, device=device)
    res = _rand(gen, 5, 256, dtype=dtype, device=device)
    expect_sum = x + res
    expect = reference.rms_norm(expect_sum, w.new_ones(256), 1e-6)
    normed, summed = fused_add_rms_norm(x, res, w.new_ones(256), 1e-6, out=x, residual_out=res)
    assert normed.data_ptr() == x.data_ptr() and summed.data_ptr() == res.data_ptr()
    _assert_sum(res, expect_sum)
    _check(x, expect, dtype)


def test_bad_input_is_a_validation_error(device) -> None:
    x = torch.randn(4, 64, device=device)
    with pytest.raises(ValidationError):
        rms_norm(x, torch.randn(32, device=device), 1e-6)
    with pytest.raises(ValidationError):
        fused_add_rms_norm(x, torch.randn(4, 32, device=device), torch.randn(64, device=device), 1e-6)
    with pytest.raises(ValidationError):
        rms_norm(x, torch.randn(64, device=device), 1e-6, out=torch.empty(4, 64, dtype=torch.float16, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("rows", "hidden"), GPU)
def test_gpu_matrix(rows, hidden, dtype, device, gen) -> None:
    x = _rand(gen, rows, hidden, dtype=dtype, device=device, scale=2.0)
    res = _rand(gen, rows, hidden, dtype=dtype, device=device)
    w = _rand(gen, hidden, dtype=dtype, device=device)
    out = torch.full_like(x, float("nan"))
    rms_norm(x, w, 1e-6, out=out)
    _check(out, reference.rms_norm(x, w, 1e-6), dtype)
    normed, summed = fused_add_rms_norm(x, res, w, 1e-6)
    _assert_sum(summed, x + res)
    _check(normed, reference.rms_norm(x + res, w, 1e-6), dtype)
