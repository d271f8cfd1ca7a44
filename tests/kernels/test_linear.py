"""kernels/skinny_linear.py: linear and norm_linear (the skinny decode projections with the RMS
norm, residual add and gated activation (SiLU or GELU-tanh, and mul) fused in) against float64
references composed here from torch ops: the fused kernel (rows <= MAX_ROWS) and the cuBLAS
fallback above it, over dtypes, odd widths, explicit tilings, bias, residual, both
activations, fp32 logits, strided rows, aliasing of the new residual, untouched inputs and bad
input; on CUDA also the Qwen3 and Gemma 3 decode shapes and CUDA-graph replay with
programmatic dependent launch on and off."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels import pdl as pdl_mod
from services.engine.kernels import skinny_linear
from services.engine.kernels.skinny_linear import (
    MAX_ROWS,
    LinearPlan,
    linear,
    norm_linear,
)
from tests.kernels import reference
from tests.kernels.conftest import HAS_CUDA, INTERPRETED
from tests.support.switches import env_switch

# Triton's interpreter truncates fp32 -> bf16; the norm_linear + activation path rounds four times
# (normed row, gate, up, output), each truncation shrinking the value (~0.3% on average), so
# the errors add up coherently there (~1.5% measured, 2.2% over one 20-output gelu_tanh row)
# where round-to-nearest stays under 1%
TOL = {torch.bfloat16: 3e-2 if INTERPRETED else 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}
FP32_OUT_TOL = 1e-4  # out_dtype=float32 on the kernel path: fp32 accumulation, no bf16 rounding
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
EPS = 1e-6


def _rand(gen: torch.Generator, *shape: int, dtype: torch.dtype, device: torch.device,
          scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale + shift).to(dtype).to(device)


def _weights(gen, n: int, k: int, dtype, device, bias: bool):
    """weight [n, k] scaled so outputs are O(1); bias [n] or None."""
    w = _rand(gen, n, k, dtype=dtype, device=device, scale=k ** -0.5)
    b = _rand(gen, n, dtype=dtype, device=device, scale=0.5) if bias else None
    return w, b


def _ref_linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
    y = x.double() @ w.double().T
    return y if b is None else y + b.double()


GATED = {"silu": reference.silu_and_mul, "gelu_tanh": reference.gelu_tanh_and_mul}


def _ref_norm_linear(x, residual, norm_w, eps, w, b, activation):
    """(float64 y, the expected new residual): the sum rounded to x's dtype as torch's add does,
    the RMS in float64, the normed row rounded to the dtype, the product (+ bias), and with an
    activation gate and up rounded to the dtype before act(gate) * up."""
    summed = x if residual is None else x + residual
    normed = reference.rms_norm(summed, norm_w, eps).to(x.dtype)
    y = _ref_linear(normed, w, b)
    if activation is not None:
        y = GATED[activation](y.to(x.dtype))
    return y, summed


def _check(out: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> None:
    assert out.shape == ref.shape
    assert torch.isfinite(out).all()
    assert reference.rel_error(out, ref) < TOL[dtype]
    assert reference.row_rel_errors(out, ref).max() < 3 * TOL[dtype]


def _assert_sum(summed: torch.Tensor, expect: torch.Tensor) -> None:
    """The residual stream matches the unfused add bit for bit on the GPU; Triton's interpreter
    truncates fp32 -> bf16 instead of rounding to nearest, so there it is within one bf16 ulp."""
    assert summed.shape == expect.shape and summed.dtype == expect.dtype
    if INTERPRETED:
        assert torch.allclose(summed.double(), expect.double(), rtol=2**-7, atol=0)
    else:
        assert torch.equal(summed, expect)


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    sa, sb = a.untyped_storage(), b.untyped_storage()
    a0, b0 = sa.data_ptr(), sb.data_ptr()
    return a0 < b0 + sb.nbytes() and b0 < a0 + sa.nbytes()


def _norm_case(gen, device, dtype, rows, k, n, bias, residual, activation, plan=None,
               x_pad: int = 0) -> None:
    """One norm_linear call against the reference; x (and residual) are column slices of wider
    tensors when x_pad > 0."""
    wide = _rand(gen, rows, k + x_pad, dtype=dtype, device=device, scale=2.0)
    x = wide[:, x_pad // 2 : x_pad // 2 + k]
    res = None
    if residual:
        res_wide = _rand(gen, rows, k + x_pad, dtype=dtype, device=device)
        res = res_wide[:, :k]
    norm_w = _rand(gen, k, dtype=dtype, device=device, scale=0.3, shift=1.0)
    w, b = _weights(gen, n, k, dtype, device, bias)
    x_before = x.clone()
    res_before = None if res is None else res.clone()
    y, new_res = norm_linear(x, res, norm_w, EPS, w, b, activation, plan=plan)
    ref, expect_sum = _ref_norm_linear(x, res, norm_w, EPS, w, b, activation)
    assert y.dtype == dtype
    _check(y, ref, dtype)
    if res is None:
        assert new_res is x
    else:
        _assert_sum(new_res, expect_sum)
        assert not _shares_memory(new_res, x) and not _shares_memory(new_res, res)
        assert torch.equal(res, res_before)
    assert torch.equal(x, x_before)


# ---------------------------------------------------------------------------------------------
# small cases: every machine (Triton's interpreter off CUDA)

# (rows, K, N, bias): rows up to MAX_ROWS take the kernel, the others the cuBLAS fallback
LINEAR_CASES = [
    (1, 64, 48, True),
    (1, 100, 70, False),
    (1, 1030, 40, True),
    (2, 100, 70, False),
    (3, 1030, 40, True),
    (4, 100, 70, True),
    (5, 100, 70, True),
    (9, 1030, 40, False),
    (16, 100, 70, True),      # MAX_ROWS: the last tl.dot step
    (17, 100, 70, True),      # cuBLAS above it
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "k", "n", "bias"), LINEAR_CASES)
def test_linear(rows, k, n, bias, dtype, device, gen) -> None:
    x = _rand(gen, rows, k, dtype=dtype, device=device, scale=2.0)
    w, b = _weights(gen, n, k, dtype, device, bias)
    x_before = x.clone()
    y = linear(x, w, b)
    assert y.dtype == dtype
    _check(y, _ref_linear(x, w, b), dtype)
    assert torch.equal(x, x_before)


# (rows, K, N, bias, residual, activation); with an activation N is 2I (I = N // 2, odd for
# N = 70)
NORM_CASES = [
    (1, 64, 48, False, True, None),
    (1, 100, 70, True, True, "silu"),
    (1, 1030, 40, True, False, None),
    (1, 100, 70, False, False, "silu"),
    (1, 64, 33, True, True, None),
    (1, 100, 70, True, True, "gelu_tanh"),
    (1, 1030, 40, False, False, "gelu_tanh"),
    (2, 100, 70, True, True, "silu"),
    (4, 100, 70, False, False, "silu"),
    (5, 1030, 40, False, True, None),
    (6, 100, 70, True, True, "silu"),
    (8, 64, 48, False, False, "silu"),
    (3, 100, 70, True, True, "gelu_tanh"),
    (6, 64, 48, False, False, "gelu_tanh"),
    (16, 1030, 40, True, True, "silu"),
    (17, 100, 70, True, True, None),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(("rows", "k", "n", "bias", "residual", "activation"), NORM_CASES)
def test_norm_linear(rows, k, n, bias, residual, activation, dtype, device, gen) -> None:
    _norm_case(gen, device, dtype, rows, k, n, bias, residual, activation)


# tilings where N and K are not multiples of the blocks, BLOCK_K > K, BLOCK_N > N, one warp
PLANS = [
    (100, 70, LinearPlan(block_n=16, block_k=64, num_warps=4)),
    (100, 70, LinearPlan(block_n=8, block_k=256, num_warps=4)),
    (100, 70, LinearPlan(block_n=128, block_k=32, num_warps=8)),
    (1030, 38, LinearPlan(block_n=32, block_k=128, num_warps=4)),
    (100, 38, LinearPlan(block_n=4, block_k=16, num_warps=1)),
    # the 2-16-row tl.dot kernel's tilings (any row count through plan=)
    (100, 70, LinearPlan(block_n=16, block_k=16, num_warps=4, block_m=16, num_stages=2)),
    (1030, 38, LinearPlan(block_n=64, block_k=256, num_warps=4, block_m=16, num_stages=3)),
    (100, 70, LinearPlan(block_n=32, block_k=64, num_warps=8, block_m=32, num_stages=5)),
]


@pytest.mark.parametrize(("k", "n", "plan"), PLANS)
def test_explicit_plans(k, n, plan, device, gen, monkeypatch) -> None:
    def no_planning(*args):  # the given plan must be used as it is
        raise AssertionError("plan_linear called although a plan was given")

    monkeypatch.setattr(skinny_linear, "plan_linear", no_planning)
    dtype = torch.bfloat16
    x = _rand(gen, 1, k, dtype=dtype, device=device, scale=2.0)
    w, b = _weights(gen, n, k, dtype, device, bias=True)
    _check(linear(x, w, b, plan=plan), _ref_linear(x, w, b), dtype)
    for activation in ("silu", "gelu_tanh"):
        _norm_case(gen, device, dtype, 1, k, n, bias=True, residual=True, activation=activation,
                   plan=plan)
    # either kernel takes any row count, more rows than one program's too (grid axis 1)
    for count in (3, 20):
        rows = _rand(gen, count, k, dtype=dtype, device=device, scale=2.0)
        out = torch.full((count, n), float("nan"), dtype=dtype, device=device)
        skinny_linear.launch(rows, None, None, 0.0, w, b, out, None, None, plan)
        _check(out, _ref_linear(rows, w, b), dtype)
    _norm_case(gen, device, dtype, 20, k, n - n % 2, bias=True, residual=True,
               activation="silu", plan=plan)


@pytest.mark.parametrize("rows", [1, 3, 4, 7])
def test_linear_float32_out(rows, device, gen) -> None:
    """The logits path: fp32 output from bf16/fp16 operands, without a rounding to the input
    dtype on the kernel path (a tighter bound there than the input dtype's own)."""
    k, n = 1030, 40
    for dtype in (torch.bfloat16, torch.float16):
        x = _rand(gen, rows, k, dtype=dtype, device=device, scale=2.0)
        w, b = _weights(gen, n, k, dtype, device, bias=rows % 2 == 1)
        y = linear(x, w, b, out_dtype=torch.float32)
        assert y.dtype == torch.float32
        ref = _ref_linear(x, w, b)
        tol = FP32_OUT_TOL if rows <= MAX_ROWS else TOL[dtype]
        assert torch.isfinite(y).all()
        assert reference.rel_error(y, ref) < tol
        assert reference.row_rel_errors(y, ref).max() < 3 * tol


@pytest.mark.parametrize("rows", [1, 2, 4, 17])
def test_norm_linear_float32_out(rows, device, gen) -> None:
    """A router's path (model/moe.py forward_residual): norm_linear with out_dtype float32,
    the residual added and normed as ever, the projection not rounded to the input dtype on
    the kernel path; the composition above MAX_ROWS casts its output."""
    k, n = 1030, 40
    for dtype in (torch.bfloat16, torch.float16):
        x = _rand(gen, rows, k, dtype=dtype, device=device, scale=2.0)
        res = _rand(gen, rows, k, dtype=dtype, device=device)
        norm_w = _rand(gen, k, dtype=dtype, device=device, scale=0.3, shift=1.0)
        w, b = _weights(gen, n, k, dtype, device, bias=rows % 2 == 1)
        y, new_residual = norm_linear(x, res, norm_w, EPS, w, b, out_dtype=torch.float32)
        assert y.dtype == torch.float32 and new_residual.dtype == dtype
        ref, summed = _ref_norm_linear(x, res, norm_w, EPS, w, b, None)
        _assert_sum(new_residual, summed)
        tol = TOL[dtype]
        assert reference.rel_error(y, ref) < tol
        assert reference.row_rel_errors(y, ref).max() < 3 * tol


@pytest.mark.parametrize("rows", [3, 6])
def test_strided_rows(rows, device, gen) -> None:
    """x, residual and weight as column slices of wider tensors (row stride > K, last dim
    contiguous); the new residual comes back contiguous."""
    dtype = torch.bfloat16
    k, n = 100, 70
    wide = _rand(gen, rows, 160, dtype=dtype, device=device, scale=2.0)
    x = wide[:, 30 : 30 + k]
    w_wide = _rand(gen, n, 128, dtype=dtype, device=device, scale=k ** -0.5)
    w = w_wide[:, 5 : 5 + k]
    b = _rand(gen, n, dtype=dtype, device=device)
    assert x.stride() == (160, 1) and w.stride() == (128, 1)
    wide_before = wide.clone()
    _check(linear(x, w, b), _ref_linear(x, w, b), dtype)
    assert torch.equal(wide, wide_before)
    _norm_case(gen, device, dtype, rows, k, 2 * 35, bias=True, residual=True, activation="silu",
               x_pad=44)
    _norm_case(gen, device, dtype, rows, k, 2 * 35, bias=False, residual=True,
               activation="gelu_tanh", x_pad=44)
    _norm_case(gen, device, dtype, rows, k, 48, bias=False, residual=False, activation=None,
               x_pad=44)


@pytest.mark.parametrize("rows", [2, 6])
def test_new_residual_aliasing(rows, device, gen) -> None:
    """With a residual: a fresh tensor (neither x nor residual, which are left as they were);
    without: x itself."""
    dtype = torch.bfloat16
    k, n = 64, 24
    x = _rand(gen, rows, k, dtype=dtype, device=device)
    res = _rand(gen, rows, k, dtype=dtype, device=device, scale=4.0)
    norm_w = _rand(gen, k, dtype=dtype, device=device, shift=1.0)
    w, _ = _weights(gen, n, k, dtype, device, bias=False)
    x_before, res_before = x.clone(), res.clone()
    _, new_res = norm_linear(x, res, norm_w, EPS, w)
    assert new_res is not x and new_res is not res
    assert not _shares_memory(new_res, x) and not _shares_memory(new_res, res)
    assert torch.equal(x, x_before) and torch.equal(res, res_before)
    _assert_sum(new_res, x + res)
    new_res.fill_(0)  # writing the returned residual must not touch the inputs
    assert torch.equal(x, x_before) and torch.equal(res, res_before)
    y, same = norm_linear(x, None, norm_w, EPS, w)
    assert same is x
    assert torch.equal(x, x_before)
    _check(y, _ref_norm_linear(x, None, norm_w, EPS, w, None, None)[0], dtype)


def test_no_rows(device) -> None:
    x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
    w = torch.randn(24, 64, device=device).to(torch.bfloat16)
    g = torch.ones(64, dtype=torch.bfloat16, device=device)
    assert linear(x, w).shape == (0, 24)
    assert linear(x, w, out_dtype=torch.float32).dtype == torch.float32
    for activation in ("silu", "gelu_tanh"):
        y, r = norm_linear(x, torch.empty_like(x), g, EPS, w, activation=activation)
        assert y.shape == (0, 12) and r.shape == (0, 64)


@pytest.mark.parametrize("rows", [2, 6])  # the kernel path and the fallback validate alike
def test_bad_input_is_a_validation_error(rows, device) -> None:
    bf16 = torch.bfloat16

    def t(*shape: int, dtype: torch.dtype = bf16) -> torch.Tensor:
        return torch.randn(*shape, device=device).to(dtype)

    x, w, g, res = t(rows, 64), t(24, 64), t(64), t(rows, 64)
    cases = [
        ("does not take rows", lambda: linear(x, t(24, 32))),
        ("does not take rows", lambda: norm_linear(x, res, g, EPS, t(24, 65))),
        ("bias", lambda: linear(x, w, t(23))),
        ("bias", lambda: linear(x, w, t(24, 2)[:, 0])),  # not contiguous
        ("bias", lambda: norm_linear(x, res, g, EPS, w, t(25))),
        ("dtype", lambda: linear(x, t(24, 64, dtype=torch.float16))),
        ("dtype", lambda: norm_linear(x, res, g, EPS, t(24, 64, dtype=torch.float32))),
        ("gate and up", lambda: norm_linear(x, res, g, EPS, t(23, 64), activation="silu")),
        ("gate and up", lambda: norm_linear(x, None, g, EPS, t(25, 64), t(25), "gelu_tanh")),
        # the old positional silu_mul flag, and activations the kernel does not have
        ("bool", lambda: norm_linear(x, res, g, EPS, t(24, 64), None, True)),
        ("bool", lambda: norm_linear(x, res, g, EPS, t(24, 64), None, False)),
        ("activation", lambda: norm_linear(x, res, g, EPS, t(24, 64), None, "gelu")),
        ("activation", lambda: norm_linear(x, res, g, EPS, t(24, 64), None, "relu")),
        ("activation", lambda: norm_linear(x, res, g, EPS, t(24, 64), activation="")),
        ("norm_weight", lambda: norm_linear(x, res, t(63), EPS, w)),
        ("norm_weight", lambda: norm_linear(x, None, t(64, 1), EPS, w)),
        ("residual", lambda: norm_linear(x, t(rows + 1, 64), g, EPS, w)),
        ("residual", lambda: norm_linear(x, t(rows, 32), g, EPS, w)),
        ("residual", lambda: norm_linear(x, t(rows, 64, dtype=torch.float32), g, EPS, w)),
        ("residual", lambda: norm_linear(x, t(64, rows).T, g, EPS, w)),  # last dim strided
        ("x", lambda: linear(t(64, rows).T, w)),  # last dim strided
        ("x", lambda: linear(t(1, rows, 64), w)),
        ("weight", lambda: linear(x, t(24, 64, 2)[..., 0])),
    ]
    for match, call in cases:
        with pytest.raises(ValidationError, match=match):
            call()


# ---------------------------------------------------------------------------------------------
# CUDA only: the real decode shapes, and graph capture with and without PDL

# (name, K, N, kind): "norm" = norm_linear with the residual, "silu" / "gelu_tanh" = norm_linear
# with the residual and that activation (N = 2I), "plain" = linear, "logits" = linear with
# out_dtype=float32
QWEN3_0_6B = [("qkv", 1024, 4096, "norm"), ("o_proj", 2048, 1024, "plain"),
              ("gate_up", 1024, 6144, "silu"), ("down", 3072, 1024, "plain"),
              ("lm_head", 1024, 151936, "logits")]
QWEN3_8B = [("qkv", 4096, 6144, "norm"), ("o_proj", 4096, 4096, "plain"),
            ("gate_up", 4096, 24576, "silu"), ("down", 12288, 4096, "plain")]
GEMMA3 = [("1B-gate_up", 1152, 2 * 6912, "gelu_tanh"), ("4B-gate_up", 2560, 2 * 10240, "gelu_tanh"),
          ("27B-gate_up", 5376, 2 * 21504, "gelu_tanh")]
DECODE = [pytest.param(k, n, kind, id=f"0.6B-{name}") for name, k, n, kind in QWEN3_0_6B] + [
    pytest.param(k, n, kind, id=f"8B-{name}") for name, k, n, kind in QWEN3_8B] + [
    pytest.param(k, n, kind, id=f"gemma3-{name}") for name, k, n, kind in GEMMA3]


@pytest.mark.gpu
@pytest.mark.parametrize(("k", "n", "kind"), DECODE)
def test_gpu_decode_shapes(k, n, kind, device, gen) -> None:
    dtype = torch.bfloat16
    big = torch.Generator(device=device).manual_seed(int(torch.randint(2**62, (1,), generator=gen)))
    w = (torch.randn(n, k, generator=big, device=device) * k ** -0.5).to(dtype)
    w64 = w.double()
    norm_w = _rand(gen, k, dtype=dtype, device=device, scale=0.3, shift=1.0)
    for rows in (1, 2, 4):
        x = _rand(gen, rows, k, dtype=dtype, device=device, scale=2.0)
        res = _rand(gen, rows, k, dtype=dtype, device=device, scale=4.0)
        if kind in ("plain", "logits"):
            out_dtype = torch.float32 if kind == "logits" else None
            y = linear(x, w, out_dtype=out_dtype)
            ref = x.double() @ w64.T
            # fp32 logits keep the kernel's accumulation; the cuBLAS path rounds to bf16 first
            tol = FP32_OUT_TOL if kind == "logits" and rows <= MAX_ROWS else TOL[dtype]
            assert y.dtype == (out_dtype or dtype)
            assert torch.isfinite(y).all()
            assert reference.rel_error(y, ref) < tol
            assert reference.row_rel_errors(y, ref).max() < 3 * tol
            continue
        activation = kind if kind in GATED else None
        y, new_res = norm_linear(x, res, norm_w, EPS, w, activation=activation)
        summed = x + res
        _assert_sum(new_res, summed)
        normed = reference.rms_norm(summed, norm_w, EPS).to(dtype).double()
        ref = normed @ w64.T
        if activation is not None:
            ref = GATED[activation](ref.to(dtype))
        _check(y, ref, dtype)


@pytest.fixture(params=["1", "0"], ids=["pdl-on", "pdl-off"])
def pdl(request, monkeypatch):
    """HELIOS_PDL set for the test, the cached switch re-read before and after."""
    with env_switch(monkeypatch, "HELIOS_PDL", pdl_mod.switched_off) as set_switch:
        set_switch(request.param)
        yield request.param == "1"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("rows", [1, 3])  # the skinny kernels (with PDL when on); the fallback
@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_graph_replay(rows, activation, pdl, device, gen) -> None:
    """A decoder layer's chain of projections (each kernel reading the previous one's output)
    captured in one CUDA graph and replayed on new inputs copied in place; each stage is checked
    against the reference of its actual input, so a stage reading stale data is caught."""
    assert pdl_mod.pdl_enabled(device) == (pdl and torch.cuda.get_device_capability(device)[0] >= 9)
    bf16 = torch.bfloat16
    # the lm_head's 1,024 programs of 3 rows pass what any device holds at once: later
    # programs start only as earlier ones finish, behind the next kernel's early launch
    hidden, qkv_n, inter, vocab = 1024, 4096, 3072, 65536

    def draw(*shape: int, scale: float = 1.0, shift: float = 0.0) -> torch.Tensor:
        return _rand(gen, *shape, dtype=bf16, device=device, scale=scale, shift=shift)

    x, res = draw(rows, hidden), draw(rows, hidden, scale=4.0)
    g1, g2, g3 = (draw(hidden, scale=0.3, shift=1.0) for _ in range(3))
    w_qkv, w_o = draw(qkv_n, hidden, scale=hidden ** -0.5), draw(hidden, qkv_n, scale=qkv_n ** -0.5)
    b_qkv = draw(qkv_n, scale=0.5)
    w_gu, w_down = draw(2 * inter, hidden, scale=hidden ** -0.5), draw(hidden, inter, scale=inter ** -0.5)
    w_head = draw(vocab, hidden, scale=hidden ** -0.5)
    outs: dict[str, torch.Tensor] = {}

    def step() -> None:
        outs["qkv"], outs["r1"] = norm_linear(x, res, g1, EPS, w_qkv, b_qkv)
        outs["o"] = linear(outs["qkv"], w_o)
        outs["act"], outs["r2"] = norm_linear(outs["o"], outs["r1"], g2, EPS, w_gu, None,
                                              activation)
        outs["down"] = linear(outs["act"], w_down)
        outs["h"], outs["r3"] = norm_linear(outs["down"], outs["r2"], g3, EPS, w_head)
        outs["logits"] = linear(outs["down"], w_head, out_dtype=torch.float32)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with pdl_mod.graph_launches():           # PDL (when on), as in the engine's graphs
        with torch.cuda.stream(stream):
            step()  # compiles outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step()
    captured = dict(outs)
    for _ in range(2):
        x.copy_(torch.randn(x.shape, generator=gen).to(bf16))
        res.copy_((torch.randn(res.shape, generator=gen) * 4).to(bf16))
        for o in captured.values():
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        o = captured
        ref, summed = _ref_norm_linear(x, res, g1, EPS, w_qkv, b_qkv, None)
        _check(o["qkv"], ref, bf16)
        assert torch.equal(o["r1"], summed)
        _check(o["o"], _ref_linear(o["qkv"], w_o, None), bf16)
        ref, summed = _ref_norm_linear(o["o"], o["r1"], g2, EPS, w_gu, None, activation)
        _check(o["act"], ref, bf16)
        assert torch.equal(o["r2"], summed)
        _check(o["down"], _ref_linear(o["act"], w_down, None), bf16)
        ref, summed = _ref_norm_linear(o["down"], o["r2"], g3, EPS, w_head, None, None)
        _check(o["h"], ref, bf16)
        assert torch.equal(o["r3"], summed)
        logits_ref = _ref_linear(o["down"], w_head, None)
        tol = FP32_OUT_TOL if rows <= MAX_ROWS else TOL[bf16]
        assert reference.rel_error(o["logits"], logits_ref) < tol
