"""silu_and_mul and gelu_tanh_and_mul against float64 over widths, row counts and dtypes."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.activation import gelu_tanh_and_mul, silu_and_mul
from tests.kernels import reference

TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
# gelu_tanh's exp overflows to inf for gates below about -6 (then the result is 0, as it should
# be); numpy says so when the interpreter runs it
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered in exp:RuntimeWarning")
KERNELS = {"silu": (silu_and_mul, reference.silu_and_mul),
           "gelu_tanh": (gelu_tanh_and_mul, reference.gelu_tanh_and_mul)}


def _case(gen, device, rows, inter, dtype, activation) -> None:
    kernel, ref_fn = KERNELS[activation]
    x = (torch.randn(rows, 2 * inter, generator=gen) * 3).to(dtype).to(device)
    out = torch.full((rows, inter), float("nan"), dtype=dtype, device=device)
    assert kernel(x, out=out) is out
    ref = ref_fn(x)
    assert torch.isfinite(out).all()
    assert reference.rel_error(out, ref) < TOL[dtype]
    assert reference.row_rel_errors(out, ref).max() < 3 * TOL[dtype]


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("rows", "inter"), [(1, 64), (9, 300), (4, 3000)])
def test_small(rows, inter, dtype, activation, device, gen) -> None:
    _case(gen, device, rows, inter, dtype, activation)


def test_gelu_tanh_is_torchs_tanh_gelu(device) -> None:
    """Over gates from -30 to 30 (both tails: where 1 + tanh cancels, where exp overflows) the
    kernel is torch's gelu(approximate="tanh") * up to fp32 rounding, and finite."""
    gate = torch.linspace(-30.0, 30.0, 4001)
    up = torch.linspace(2.0, -1.0, 4001)
    x = torch.cat([gate, up]).view(1, -1).to(device)
    out = gelu_tanh_and_mul(x)
    expect = torch.nn.functional.gelu(gate.double(), approximate="tanh") * up.double()
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double().cpu(), expect, rtol=1e-5, atol=1e-6)
    assert reference.rel_error(reference.gelu_tanh_and_mul(x), expect.to(x.device)) < 1e-12


@pytest.mark.parametrize("kernel", [silu_and_mul, gelu_tanh_and_mul])
def test_strided_rows_and_bad_input(kernel, device, gen) -> None:
    wide = torch.randn(6, 300, generator=gen).to(torch.bfloat16).to(device)
    x = wide[:, :200]  # row stride 300, last dim contiguous
    ref_fn = KERNELS["silu" if kernel is silu_and_mul else "gelu_tanh"][1]
    assert reference.rel_error(kernel(x), ref_fn(x)) < TOL[torch.bfloat16]
    with pytest.raises(ValidationError):
        kernel(torch.randn(2, 7, device=device))
    with pytest.raises(ValidationError):
        kernel(x, out=torch.empty(6, 99, dtype=torch.bfloat16, device=device))


@pytest.mark.gpu
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize(("rows", "inter"), [(1, 12288), (256, 12288), (4096, 3072), (8192, 12288), (3, 18944)])
def test_gpu_matrix(rows, inter, dtype, activation, device, gen) -> None:
    _case(gen, device, rows, inter, dtype, activation)
