"""kernels/skinny_linear.py's tilings: plan_linear's measured rules and what the kernels need of
any plan, and the plan's checks. The kernels' numerics: test_linear.py."""

from __future__ import annotations

import pytest

from services.common.errors import ValidationError
from services.engine.kernels import skinny_linear
from services.engine.kernels.skinny_linear import LinearPlan, plan_linear


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

