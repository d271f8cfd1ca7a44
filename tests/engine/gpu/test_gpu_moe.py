"""The MoE architectures on the GPU through the GraphRunner (decode graphs at every capacity,
two-frame overlap; the fused-MoE kernel in every MLP): float32 gives the CPU path's tokens,
bf16 stays within test_gpu_runner.py's bounds of a float32 reference."""

from __future__ import annotations

import pytest

from tests.engine.gpu.test_gpu_runner import (
    _check_bf16_against_float32,
    _check_float32_matches_the_cpu,
)
from tests.engine.model.checkpoints import SPECS, build_checkpoint

pytestmark = pytest.mark.gpu

MOE_ARCHITECTURES = ("qwen3-moe", "qwen3-moe-step2", "mixtral")


@pytest.fixture(scope="module", params=MOE_ARCHITECTURES)
def moe_checkpoint(request, tmp_path_factory):
    return build_checkpoint(SPECS[request.param], tmp_path_factory.mktemp(request.param))


def test_moe_in_float32_matches_the_cpu_path(moe_checkpoint):
    _check_float32_matches_the_cpu(moe_checkpoint)


def test_moe_in_bf16_against_a_float32_reference(moe_checkpoint):
    _check_bf16_against_float32(moe_checkpoint)
