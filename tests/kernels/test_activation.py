"""silu_and_mul against float64 over widths, row counts and dtypes."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.activation import silu_and_mul
from tests.kernels import reference

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


def _case(gen, device, rows, inter, dtype) -> None:
    x = (torch.randn(rows, 2 * inter, generator=gen) * 3).to(dtype).to(device)
    out = torch.full((rows, inter), float("nan"), dtype=dtype, device=device)
    silu_and_mul(x, out=out)
    ref = reference.silu_and_mul(x)
    assert torch.isfinite(out).all()
    assert reference.rel_error(out, ref) < TOL[dtype]
    assert reference.row_rel_errors(out, ref).max() < 3 * TOL[dtype]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "inter"), [(1, 64), (9, 300), (4, 3000)])
def test_small(rows, inter, dtype, device, gen) -> None:
    _case(gen, device, rows, inter, dtype)


def test_strided_rows_and_bad_input(device, gen) -> None:
    wide = torch.randn(6, 300, generator=gen).to(torch.bfloat16).to(device)
    x = wide[:, :200]  # row stride 300, last dim contiguous
    ref = reference.silu_and_mul(x)
    assert reference.rel_error(silu_and_mul(x), ref) < TOL[torch.bfloat16]
    with pytest.raises(ValidationError):
        silu_and_mul(torch.randn(2, 7, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "inter"), [(1, 12288), (256, 12288), (4096, 3072), (8192, 12288), (3, 18944)])
def test_gpu_matrix(rows, inter, dtype, device, gen) -> None:
    _case(gen, device, rows, inter, dtype)
