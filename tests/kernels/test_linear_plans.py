"""kernels/skinny_linear.py's tilings: plan_linear's measured rules and what the kernels need of
any plan, the plan's checks, HELIOS_SKINNY_AHEAD (the one-row kernel two K steps ahead) and
what the H200 compiler makes of it. The kernels' numerics: test_linear.py."""

from __future__ import annotations

import dataclasses

import pytest

from services.common.errors import ValidationError
from services.engine.kernels import skinny_linear
from services.engine.kernels.fused_moe_decode import plan_decode
from services.engine.kernels.skinny_linear import LinearPlan, plan_linear
from tests.support.switches import env_switch


def test_plan_rejects_a_small_dot_tile() -> None:
    with pytest.raises(ValidationError, match="at least 16"):
        LinearPlan(block_n=8, block_k=64, num_warps=4, block_m=16)


@pytest.mark.parametrize(("n", "k", "rows", "gated"), [
    (70, 100, 1, False), (4096, 1024, 1, False), (6144, 4096, 1, False), (4096, 12288, 1, False),
    (6144, 1024, 4, False), (151936, 1024, 2, False), (12, 3, 4, False), (1, 4096, 1, False),
    (4096, 4096, 5, False), (4096, 12288, 16, False), (12288, 4096, 5, True),
    (3072, 1024, 1, True), (12288, 4096, 1, True), (35, 64, 2, True)])
def test_plan_linear(n, k, rows, gated) -> None:
    """The measured tiling rules (plan_linear's docstring) and what the kernel needs of any
    plan: power-of-two blocks (tl.arange), a reduction step covering K when K is small."""
    num_sms = 132
    plan = plan_linear(n, k, rows, num_sms, gated)
    if rows > 1:       # the tl.dot kernel: 16 rows and 64 features per program (plan_rows)
        assert (plan.block_m, plan.block_n, plan.num_warps) == (16, 64, 4)
        assert plan.block_k & (plan.block_k - 1) == 0 and 16 <= plan.block_k <= 256
        assert plan.block_k >= min(k, 64) and plan.num_stages in (3, 5)
        assert plan_linear(n, k, rows, num_sms, gated, normed=True).num_stages == (
            3 if not gated else 5)
        # fp32 tiles fit the shared memory (a 5-stage 64 x 256 fp32 tiling asked for 320 KiB)
        for normed in (False, True):
            wide = plan_linear(n, k, rows, num_sms, gated, normed, elem_bytes=4)
            per_k = 4 * (wide.block_n * (2 if gated else 1) + wide.block_m * (1 + normed))
            assert wide.num_stages * wide.block_k * per_k <= skinny_linear.SHARED_BYTES
        return
    for size in (plan.block_n, plan.block_k):
        assert size & (size - 1) == 0
    assert plan.block_k <= 1024 and plan.block_k >= min(k, 256)
    assert 4 <= plan.block_n <= 16 and plan.num_warps in (4, 8)
    if gated:
        assert (plan.block_n, plan.num_warps) == (8, 4) and plan.block_k <= (512 if k <= 1024 else 256)
    elif n <= 2048:
        assert (plan.block_n, plan.num_warps) == (16, 8)
    elif n >= 32768:
        assert (plan.block_n, plan.block_k) == (8, 256)
    else:
        programs = -(-n // plan.block_n) * rows
        assert programs >= 2 * num_sms or plan.block_n == 4  # every SM busy where N allows


def test_steps_ahead_switch(monkeypatch) -> None:
    """HELIOS_SKINNY_AHEAD=2 gives one-row plans two K steps ahead (the tiling unchanged), the
    fused MoE's decode plans too; plans of more rows are the tl.dot kernel's, unchanged;
    other values are refused."""
    with env_switch(monkeypatch, "HELIOS_SKINNY_AHEAD", skinny_linear.steps_ahead) as set_switch:
        set_switch("1")
        one = plan_linear(4096, 4096, 1, 132)
        set_switch("2")
        assert plan_linear(4096, 4096, 1, 132) == dataclasses.replace(one, ahead=2)
        assert plan_linear(4096, 4096, 5, 132).ahead == 1
        decode = plan_decode(2048, 768, 8, 132)          # the fused MoE's decode kernels too
        assert (decode.gate_up.ahead, decode.down.ahead) == (2, 2)
        set_switch("3")
        with pytest.raises(ValidationError, match="HELIOS_SKINNY_AHEAD='3'"):
            skinny_linear.steps_ahead()
    with pytest.raises(ValidationError, match="ahead must be 1 or 2"):
        LinearPlan(block_n=8, block_k=64, num_warps=4, ahead=3)


AHEAD_SM90 = """
import dataclasses, json, torch
from services.common.quantization import Fp8Scheme
from services.engine.kernels.fp8_layers import fp8_linear, fp8_norm_linear
from services.engine.kernels.skinny_linear import linear, norm_linear
from services.engine.model.fp8 import Fp8Weight
from tests.kernels.sm90_compile import (capture_launches, compile_launch,
                                        qwen3_30b_a3b_decode_experts, report)
bf16, e4m3 = torch.bfloat16, torch.float8_e4m3fn
def fp8(n, k):
    return Fp8Weight(torch.zeros(n, k, dtype=e4m3), torch.ones(n), Fp8Scheme("online", "channel", "token"))
g = torch.ones(4096, dtype=bf16)
x, act = torch.zeros(1, 4096, dtype=bf16), torch.zeros(1, 12288, dtype=bf16)
with capture_launches() as calls:                      # Qwen3-8B's projections at batch 1
    norm_linear(x, x, g, 1e-6, torch.zeros(6144, 4096, dtype=bf16))
    norm_linear(x, x, g, 1e-6, torch.zeros(24576, 4096, dtype=bf16), None, "silu")
    linear(act, torch.zeros(4096, 12288, dtype=bf16))
    fp8_norm_linear(x, x, g, 1e-6, fp8(6144, 4096))
    fp8_norm_linear(x, x, g, 1e-6, fp8(24576, 4096), None, "silu")
    fp8_linear(act, fp8(4096, 12288))
calls += qwen3_30b_a3b_decode_experts()                # the fused MoE's decode kernels
rows = []
for launch in calls:
    for ahead in (1, 2):
        kwargs = {**launch.kwargs, "AHEAD": ahead, "PDL": True}
        if kwargs.get("W_SCALE") == "channel":
            kwargs["E4M3_PTX"] = True          # as launched on CUDA
        r = report("skinny", compile_launch(dataclasses.replace(launch, kwargs=kwargs)))
        rows.append([launch.fn.fn.__name__, kwargs.get("W_SCALE"), ahead, r.registers,
                     r.local_loads])
print(json.dumps(rows))
"""


def test_two_steps_ahead_compile_for_sm90_without_spills() -> None:
    """The one-row kernel two K steps ahead at Qwen3-8B's batch-1 projections, bf16 and e4m3
    weights, and the fused MoE's decode kernels at Qwen3-30B-A3B, compiled for the H200: no
    spills, and the extra step's tiles cost registers (more than one step ahead at each
    launch), all under 255."""
    from tests.kernels.test_package import compiled_json

    rows = compiled_json(AHEAD_SM90)
    assert len(rows) == 16
    for one, two in zip(rows[::2], rows[1::2], strict=True):
        assert one[4] == 0 and two[4] == 0, (one, two)
        assert one[3] < two[3] <= 255, (one, two)
