"""FP8 kernels against float64 references of quantize-dequantize, small shapes (Triton's CPU
interpreter runs them here: it converts to and from e4m3 and multiplies e4m3 tiles exactly;
on a GPU the same cases run compiled). Bigger shapes and torch._scaled_mm: test_fp8_gpu.py."""

from __future__ import annotations

import os

import pytest
import torch

from services.common.quantization import Fp8Scheme
from services.engine.model.fp8 import (
    FP8_DTYPE,
    Fp8Weight,
    quantize_activation,
    quantize_blocks,
    quantize_rows,
)
from services.engine.model.ops import reference_rms_norm
from tests.support.switches import env_switch

SCHEMES = {
    "token-channel": Fp8Scheme("online", "channel", "token"),
    "group-block": Fp8Scheme("fp8", "block", "group"),
    "static-tensor": Fp8Scheme("compressed-tensors", "tensor", "static"),
}


def _kernels():
    from services.engine.kernels import fp8_gemm, fp8_layers, fp8_quant

    return fp8_quant, fp8_gemm, fp8_layers


def dequant64(q: torch.Tensor, scale: torch.Tensor, group: int = 128) -> torch.Tensor:
    """e4m3 values times their scales in float64 (scales per row, per group or one)."""
    s = scale.double()
    if s.shape[1] > 1:
        s = s.repeat_interleave(group, dim=1)[:, :q.shape[1]]
    return q.double() * s


def make_weight(n: int, k: int, scheme: Fp8Scheme, gen: torch.Generator,
                device: torch.device) -> tuple[Fp8Weight, torch.Tensor]:
    """An Fp8Weight of `scheme` and its float64 dequantized value."""
    dense = torch.randn(n, k, generator=gen) / k ** 0.5
    dense[: n // 4] *= 8   # rows (and blocks) of different magnitudes
    if scheme.weights == "block":
        q, scale = quantize_blocks(dense, scheme.block)
        full = scale.double().repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    elif scheme.weights == "channel":
        q, scale = quantize_rows(dense)
        full = scale.double()[:, None].expand(n, k)
    else:
        amax = dense.abs().amax() / 448
        q = (dense / amax).clamp(-448, 448).to(FP8_DTYPE)
        scale = amax.expand(n).contiguous()
        full = scale.double()[:, None].expand(n, k)
    input_scale = torch.tensor([0.01, 0.03], device=device) if scheme.activations == "static" \
        else None
    weight = Fp8Weight(q.to(device), scale.float().to(device), scheme, input_scale)
    return weight, q.double() * full


def act64(x: torch.Tensor, weight: Fp8Weight) -> torch.Tensor:
    """The activations as the GEMM path sees them: quantized per the scheme, float64."""
    scheme = weight.scheme
    q, scale = quantize_activation(x.cpu(), scheme.activations, scheme.group_size,
                                   None if weight.input_scale is None else weight.input_scale.cpu())
    return dequant64(q, scale, scheme.group_size)


def assert_bf16_equal(got: torch.Tensor, want: torch.Tensor, device: torch.device) -> None:
    """Bit for bit on the GPU; within a bf16 step in Triton 3.6's interpreter, whose float32
    -> bf16 cast truncates instead of rounding."""
    if device.type == "cuda":
        assert torch.equal(got.cpu(), want)
    else:
        assert torch.allclose(got.cpu().float(), want.float(), rtol=2 ** -7, atol=0)


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double().cpu() - b.double().cpu()).norm() / b.double().cpu().norm())


def fp32_gemm_tol(device: torch.device) -> float:
    """Relative error a float32-output FP8 GEMM may have. The interpreter sums in float32;
    Hopper's FP8 tensor cores keep fewer bits in their accumulator (about 14, as DeepSeek-V3
    reports): 1.1e-4 to 2.5e-4 measured on the H200, still 16x under bf16's rounding step."""
    return 1e-3 if device.type == "cuda" else 1e-5


@pytest.mark.parametrize("kind", ["token", "group", "static"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("whole_row", [True, False])   # one load, or the chunked passes
def test_quantize_matches_reference_bits(kind, dtype, whole_row, device, gen, monkeypatch):
    fp8_quant, _, _ = _kernels()
    if not whole_row:
        monkeypatch.setenv("HELIOS_FP8_QUANT_ROW", "chunked")
    x = (torch.randn(5, 200, generator=gen) * 3).to(dtype)
    x[1] = 0.0                                  # an all-zero row: finite, zero codes
    x[2, 130:] *= 40                            # a group far larger than the others
    static = torch.tensor([0.02, 0.05]) if kind == "static" else None
    q, scale = fp8_quant.quantize_fp8(x.to(device), kind, 128,
                                      None if static is None else static.to(device))
    ref_q, ref_scale = quantize_activation(x, kind, 128, static)
    assert q.dtype == FP8_DTYPE and scale.shape == ref_scale.shape
    assert torch.equal(scale.cpu(), ref_scale)
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))
    # float64: e4m3 keeps 3 mantissa bits (<= 2^-4 relative) above its subnormal step
    error = (dequant64(q.cpu(), scale.cpu()) - x.double()).abs()
    bound = x.double().abs() / 16 + dequant64(torch.ones_like(q.cpu(), dtype=torch.float32)
                                              .to(FP8_DTYPE), scale.cpu()) * 2 ** -9
    inside = x.double().abs() <= 448 * dequant64(torch.ones(1, 1).to(FP8_DTYPE),
                                                scale.cpu().amax().reshape(1, 1))
    assert torch.all((error <= bound + 1e-12) | ~inside)


def test_rows_up_to_the_limit_are_quantized_from_one_load(monkeypatch):
    """Rows of up to WHOLE_ROW_MAX columns take the one-load kernel (a block covering the
    row), longer ones and HELIOS_FP8_QUANT_ROW=chunked the chunked passes."""
    fp8_quant, _, _ = _kernels()
    launches: list[dict] = []

    class Recorder:      # stands in for the kernel: records the launch, runs nothing
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs)

    monkeypatch.setattr(fp8_quant, "_quantize_kernel", Recorder())

    def launch(width: int) -> tuple[bool, int]:
        fp8_quant.quantize_fp8(torch.zeros(2, width, dtype=torch.bfloat16), "token")
        return launches[-1]["WHOLE_ROW"], launches[-1]["BLOCK_K"]

    assert launch(12288) == (True, 16384) and launch(4096) == (True, 4096)
    assert launch(28672) == (False, 1024)                       # past WHOLE_ROW_MAX
    monkeypatch.setenv("HELIOS_FP8_QUANT_ROW", "chunked")
    assert launch(4096) == (False, 1024)


@pytest.mark.parametrize("kind", ["token", "group", "static"])
@pytest.mark.parametrize("with_residual", [False, True])
@pytest.mark.parametrize("whole_row", [True, False])
def test_norm_quantize_fused(kind, with_residual, whole_row, device, gen, monkeypatch):
    fp8_quant, _, _ = _kernels()
    if not whole_row:
        monkeypatch.setenv("HELIOS_FP8_QUANT_ROW", "chunked")
    x = torch.randn(4, 320, generator=gen).to(torch.bfloat16)
    residual = torch.randn(4, 320, generator=gen).to(torch.bfloat16) if with_residual else None
    g = (1 + 0.3 * torch.randn(320, generator=gen)).to(torch.bfloat16)
    static = torch.tensor([0.015]) if kind == "static" else None
    q, scale, new_res = fp8_quant.norm_quantize_fp8(
        x.to(device), None if residual is None else residual.to(device), g.to(device), 1e-6,
        kind, 128, None if static is None else static.to(device))
    summed = x if residual is None else x + residual
    assert_bf16_equal(new_res, summed, device)
    normed = reference_rms_norm(summed, g, 1e-6)
    ref_q, ref_scale = quantize_activation(normed, kind, 128, static)
    # the kernel's normed row may differ from the reference's by a bf16 step (its sum order,
    # 1/sqrt against rsqrt; the interpreter's bf16 casts), so a code may move by one e4m3
    # step where that crosses a rounding boundary, never more
    assert torch.allclose(scale.cpu(), ref_scale, rtol=2e-2)
    got, ref = dequant64(q.cpu(), scale.cpu()), dequant64(ref_q, ref_scale)
    step = torch.maximum(ref.abs() / 8, dequant64(torch.ones(1, 1).to(FP8_DTYPE),
                                                 ref_scale) * 2 ** -9)
    assert torch.all((got - ref).abs() <= step * 1.05 + ref.abs() * 2 ** -6 + 1e-12)
    assert (q.cpu().view(torch.uint8) == ref_q.view(torch.uint8)).double().mean() > 0.8
    assert rel(got, normed.double()) < 0.05


@pytest.mark.parametrize("blockwise", [False, True])
@pytest.mark.parametrize(("m", "n", "k"), [(5, 256, 384), (70, 160, 200)])
@pytest.mark.parametrize("out_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [None, 3])   # K split 3 ways (2 for k = 200: 2 K steps)
def test_triton_gemm(blockwise, m, n, k, out_dtype, splits, device, gen):
    _, fp8_gemm, _ = _kernels()
    scheme = SCHEMES["group-block" if blockwise else "token-channel"]
    weight, w64 = make_weight(n, k, scheme, gen, device)
    x = torch.randn(m, k, generator=gen)
    a, a_scale = quantize_activation(x, scheme.activations, 128)
    bias = torch.randn(n, generator=gen)
    out = fp8_gemm.triton_mm(a.to(device), a_scale.to(device), weight.qweight, weight.scale,
                             bias.to(device).to(out_dtype), out_dtype, blockwise=blockwise,
                             splits=splits)
    ref = dequant64(a, a_scale) @ w64.t() + bias.to(out_dtype).double()
    assert out.dtype == out_dtype and out.shape == (m, n)
    assert rel(out, ref) < (fp32_gemm_tol(device) if out_dtype == torch.float32 else 1e-2)


def test_an_unknown_skinny_kernel_is_refused():
    """A mistyped HELIOS_FP8_SKINNY stops the import with the values it takes, rather than
    falling back to the default unnoticed."""
    import subprocess
    import sys

    env = {**os.environ, "HELIOS_FP8_SKINNY": "w8a16"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run([sys.executable, "-c", "import services.engine.kernels.fp8_layers"],
                         env=env, cwd=root, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "HELIOS_FP8_SKINNY='w8a16': expected one of cuda-cores, tensor-cores, w8a8" in \
        run.stderr


@pytest.mark.parametrize(("name", "reader"), [("HELIOS_FP8_GEMM", "gemm_backend"),
                                            ("HELIOS_FP8_SPLIT_K", "split_k_enabled")])
def test_unknown_gemm_switches_are_refused(name, reader, monkeypatch):
    from services.common.errors import ValidationError

    _, fp8_gemm, _ = _kernels()
    read = getattr(fp8_gemm, reader)
    with env_switch(monkeypatch, name, read) as set_switch:
        set_switch("tritonn")
        with pytest.raises(ValidationError, match=f"{name}='tritonn': expected one of"):
            read()


def test_split_k_choice():
    """Split K where the output tiles leave SMs idle, never below 4 K steps a split, and the
    float32 partials' traffic at most half the weight's bytes (K / (16 M) splits)."""
    _, fp8_gemm, _ = _kernels()
    split = fp8_gemm.split_k
    assert split(tiles=192, k_steps=32, sms=132, m_dim=64, k_dim=4096) == 1    # gate_up, M 64
    assert split(tiles=32, k_steps=96, sms=132, m_dim=64, k_dim=12288) == 5    # down, M 64
    assert split(tiles=32, k_steps=32, sms=132, m_dim=64, k_dim=4096) == 4     # o_proj, M 64
    assert split(tiles=48, k_steps=32, sms=132, m_dim=64, k_dim=4096) == 3     # qkv, M 64
    # M = 256: qkv and o_proj would move as many partial bytes as weight bytes (measured
    # slower split on an H100); down_proj, three times deeper, still splits
    assert split(tiles=96, k_steps=32, sms=132, m_dim=256, k_dim=4096) == 1
    assert split(tiles=64, k_steps=32, sms=132, m_dim=256, k_dim=4096) == 1
    assert split(tiles=64, k_steps=96, sms=132, m_dim=256, k_dim=12288) == 3
    assert split(tiles=32, k_steps=8, sms=132, m_dim=1, k_dim=1024) == 2
    assert split(tiles=4, k_steps=3, sms=132, m_dim=1, k_dim=384) == 1


@pytest.mark.parametrize(("backend", "rows", "triton"), [
    ("auto", 1, True), ("auto", 64, True), ("auto", 65, False), ("auto", 256, False),
    ("scaled_mm", 1, False), ("triton", 256, True)])
def test_rowwise_backend_by_rows(backend, rows, triton, monkeypatch):
    """HELIOS_FP8_GEMM=auto: the Triton kernel for decode-sized batches (<= 64 rows, where it
    measured faster than _scaled_mm), _scaled_mm above; the other values force one."""
    _, fp8_gemm, _ = _kernels()
    with env_switch(monkeypatch, "HELIOS_FP8_GEMM", fp8_gemm.gemm_backend) as set_switch:
        set_switch(backend)
        assert fp8_gemm.uses_triton(rows) is triton


def test_split_k_partials_add_in_order(device, gen):
    """Split K (each split's float32 partial, then one ordered sum) equals the unsplit GEMM
    up to the accumulator's rounding (float32 in the interpreter, Hopper's narrower FP8 MMA
    accumulator on a GPU: 4.8e-4 measured on an H100), and the same call twice gives the
    same bits (no atomics)."""
    _, fp8_gemm, _ = _kernels()
    weight, _ = make_weight(256, 1024, SCHEMES["token-channel"], gen, device)
    a, a_scale = quantize_activation(torch.randn(7, 1024, generator=gen), "token", 128)
    a, a_scale = a.to(device), a_scale.to(device)

    def run(splits):
        return fp8_gemm.triton_mm(a, a_scale, weight.qweight, weight.scale, None,
                                  torch.float32, blockwise=False, splits=splits)

    whole, split = run(1), run(4)
    assert torch.equal(split, run(4))
    assert rel(split, whole) < (fp32_gemm_tol(device) if device.type == "cuda" else 1e-6)


def test_rowwise_static_scale(device, gen):
    _, fp8_gemm, _ = _kernels()
    weight, w64 = make_weight(128, 256, SCHEMES["static-tensor"], gen, device)
    x = torch.randn(9, 256, generator=gen)
    a, a_scale = quantize_activation(x, "static", 128, torch.tensor([0.01]))
    out = fp8_gemm.rowwise_mm(a.to(device), a_scale.to(device), weight.qweight, weight.scale,
                              None, torch.float32)
    assert rel(out, dequant64(a, a_scale) @ w64.t()) < fp32_gemm_tol(device)


SKINNY_MODES = ["cuda-cores", "tensor-cores", "w8a8"]


def use_skinny(monkeypatch, fp8_layers, mode: str) -> None:
    """HELIOS_FP8_SKINNY as the module read it at import."""
    monkeypatch.setattr(fp8_layers, "TENSOR_CORES", mode == "tensor-cores")
    monkeypatch.setattr(fp8_layers, "W8A8", mode == "w8a8")


@pytest.fixture(params=SKINNY_MODES)
def skinny(request, monkeypatch):
    """Batch 1's FP8 kernel: the CUDA-core one (default), the tl.dot one on converted tiles
    (HELIOS_FP8_SKINNY=tensor-cores) or the W8A8 one (HELIOS_FP8_SKINNY=w8a8)."""
    _, _, fp8_linear = _kernels()
    use_skinny(monkeypatch, fp8_linear, request.param)
    return request.param


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("rows", [1, 6])
def test_fp8_linear(scheme_name, rows, device, gen, skinny):
    _, _, fp8_linear = _kernels()
    weight, w64 = make_weight(384, 256, SCHEMES[scheme_name], gen, device)
    x = torch.randn(rows, 256, generator=gen).to(torch.bfloat16)
    bias = torch.randn(384, generator=gen).to(torch.bfloat16)
    out = fp8_linear.fp8_linear(x.to(device), weight, bias.to(device), out_dtype=torch.float32)
    # one row (up to 16 on tensor cores): the skinny kernels dequantize the weight (the
    # activations stay bf16); more, or the w8a8 kernel: quantized activations
    w8a16 = not fp8_linear.quantizes_rows(rows)
    a64 = x.double() if w8a16 else act64(x, weight)
    ref = a64 @ w64.t() + bias.double()
    # the skinny kernels' float32 sums; or the tensor-core GEMM
    tol = 1e-5 if w8a16 else fp32_gemm_tol(device)
    assert out.dtype == torch.float32 and rel(out, ref) < tol


@pytest.mark.parametrize(("rows", "scheme_name", "activation"), [
    (1, "group-block", "silu"), (1, "token-channel", "gelu_tanh"), (1, "group-block", None),
    (3, "token-channel", "silu"), (3, "group-block", "gelu_tanh"), (3, "token-channel", None),
    (2, "static-tensor", "silu")])
def test_fp8_norm_linear(scheme_name, activation, rows, device, gen, skinny):
    _, _, fp8_linear = _kernels()
    scheme = SCHEMES[scheme_name]
    weight, w64 = make_weight(256, 256, scheme, gen, device)
    x = torch.randn(rows, 256, generator=gen).to(torch.bfloat16)
    residual = torch.randn(rows, 256, generator=gen).to(torch.bfloat16)
    g = (1 + 0.2 * torch.randn(256, generator=gen)).to(torch.bfloat16)
    out, new_res = fp8_linear.fp8_norm_linear(x.to(device), residual.to(device), g.to(device),
                                              1e-6, weight, None, activation)
    assert_bf16_equal(new_res, x + residual, device)
    normed = reference_rms_norm(x + residual, g, 1e-6)
    w8a16 = not fp8_linear.quantizes_rows(rows)
    a64 = normed.double() if w8a16 else act64(normed, weight)
    y = a64 @ w64.t()
    if activation:
        gate, up = y.chunk(2, dim=-1)
        act = (torch.nn.functional.silu(gate) if activation == "silu"
               else torch.nn.functional.gelu(gate, approximate="tanh"))
        y = act * up
    assert out.dtype == torch.bfloat16 and out.shape == y.shape
    # more rows: the kernel quantizes its own normed row, which may sit a bf16 step from the
    # reference's (see test_norm_quantize_fused), so some codes differ by one e4m3 step
    assert rel(out, y) < (2e-2 if w8a16 else 5e-2)


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("activation", [None, "silu"])
@pytest.mark.parametrize("rows", [1, 3])          # one row: the kernel's ONE_ROW form
def test_w8a8_skinny_equals_the_gemm_path(scheme_name, activation, rows, device, gen,
                                          monkeypatch):
    """HELIOS_FP8_SKINNY=w8a8 quantizes the normed rows in its kernel as norm_quantize_fp8
    does for the GEMM, so both give the same e4m3 operands: their outputs differ only by the
    summation order (a bf16 step at most in the interpreter's float32; on a GPU each path's
    FP8 MMA accumulator rounds on its own K blocking, fp32_gemm_tol, and an element near zero
    may differ by more than its own size: an H100 measured 0.03 at an output of 0.09, so
    there the bound is a bf16 step of the output's largest element)."""
    fp8_quant, _, fp8_layers = _kernels()
    from services.engine.kernels.activation import silu_and_mul

    weight, _ = make_weight(256, 384, SCHEMES[scheme_name], gen, device)
    x = (torch.randn(rows, 384, generator=gen) * 3).to(torch.bfloat16).to(device)
    residual = torch.randn(rows, 384, generator=gen).to(torch.bfloat16).to(device)
    g = (1 + 0.2 * torch.randn(384, generator=gen)).to(torch.bfloat16).to(device)
    scheme = weight.scheme
    q, scales, gemm_res = fp8_quant.norm_quantize_fp8(x, residual, g, 1e-6, scheme.activations,
                                                      scheme.group_size, weight.input_scale)
    gemm = fp8_layers._gemm(q, scales, weight, None, x.dtype)       # fp8_norm_linear's GEMM
    gemm = silu_and_mul(gemm) if activation else gemm
    use_skinny(monkeypatch, fp8_layers, "w8a8")
    w8a8, w8a8_res = fp8_layers.fp8_norm_linear(x, residual, g, 1e-6, weight, None, activation)
    assert torch.equal(gemm_res, w8a8_res)
    assert w8a8.shape == gemm.shape == (rows, 128 if activation else 256)
    if device.type == "cuda":
        assert rel(w8a8, gemm) < 4 * fp32_gemm_tol(device)
        atol = 2 ** -7 * float(gemm.float().abs().max())
    else:
        atol = 1e-5
    torch.testing.assert_close(w8a8.float(), gemm.float(), rtol=2 ** -7, atol=atol)


@pytest.mark.parametrize("rows", [1, 3])     # the skinny kernel and the quantize + GEMM path
def test_bad_norm_inputs_are_validation_errors(rows, device, gen):
    """fp8_norm_linear and norm_quantize_fp8 check their norm operands as norm_linear does
    (kernels/common.py check_norm_inputs), before any launch."""
    from services.common.errors import ValidationError

    fp8_quant, _, fp8_layers = _kernels()
    weight, _ = make_weight(64, 64, SCHEMES["token-channel"], gen, device)
    odd, _ = make_weight(63, 64, SCHEMES["token-channel"], gen, device)

    def t(*shape: int, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype).to(device)

    x, g, res = t(rows, 64), t(64), t(rows, 64)
    cases = [
        ("norm_weight", lambda: fp8_layers.fp8_norm_linear(x, res, t(63), 1e-6, weight)),
        ("norm_weight", lambda: fp8_layers.fp8_norm_linear(x, res, t(64, 2)[:, 0], 1e-6,
                                                            weight)),
        ("residual", lambda: fp8_layers.fp8_norm_linear(x, t(rows + 1, 64), g, 1e-6, weight)),
        ("residual", lambda: fp8_layers.fp8_norm_linear(
            x, t(rows, 64, dtype=torch.float32), g, 1e-6, weight)),
        ("residual", lambda: fp8_layers.fp8_norm_linear(x, t(rows, 128)[:, ::2], g, 1e-6,
                                                         weight)),        # last dim strided
        ("gate and up", lambda: fp8_layers.fp8_norm_linear(x, res, g, 1e-6, odd, None, "silu")),
        ("norm_weight", lambda: fp8_quant.norm_quantize_fp8(x, res, t(65), 1e-6, "token")),
        ("residual", lambda: fp8_quant.norm_quantize_fp8(x, t(rows, 128)[:, ::2], g, 1e-6,
                                                         "token")),
    ]
    for match, call in cases:
        with pytest.raises(ValidationError, match=match):
            call()


def test_the_kernels_package_exports_the_fp8_ops():
    """ops.linear / ops.norm_linear hand an Fp8Weight to these on CUDA (model/fp8.py)."""
    from services.engine.kernels import fp8_layers
    from services.engine.model import ops

    ops.kernel_ops.cache_clear()
    try:
        found = ops.kernel_ops()
        assert found["fp8_linear"] is fp8_layers.fp8_linear
        assert found["fp8_norm_linear"] is fp8_layers.fp8_norm_linear
    finally:
        ops.kernel_ops.cache_clear()


def test_one_row_fp8_plans_follow_the_sweep():
    """fp8_layers.skinny_plan at Qwen3-8B's projections, one row, per-channel scales: the
    tilings the H100 sweep picked (RESULTS.md 2026-12-07, fourteenth session); block-wise
    weights step one 128-wide scale block; more rows keep the tl.dot plan."""
    from services.engine.kernels.fp8_layers import skinny_plan
    from services.engine.kernels.skinny_linear import LinearPlan

    cpu = torch.device("cpu")

    def plan(n, k, gated=False, normed=False, scheme="token-channel", rows=1):
        weight, _ = make_weight(n, k, SCHEMES[scheme], torch.Generator().manual_seed(0), cpu)
        return skinny_plan(weight, n // 2 if gated else n, rows, cpu, gated, normed)

    assert plan(6144, 4096, normed=True) == LinearPlan(16, 512, 8)          # qkv
    assert plan(4096, 4096) == LinearPlan(8, 1024, 4)                       # o_proj
    assert plan(24576, 4096, gated=True, normed=True) == LinearPlan(8, 256, 4)  # gate/up
    assert plan(4096, 12288) == LinearPlan(8, 1024, 4)                      # down
    assert plan(4096, 12288, scheme="group-block").block_k == 128
    assert plan(4096, 12288, rows=8).block_m == 16
