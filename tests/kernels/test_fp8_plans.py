"""The FP8 one-row kernel's tilings (kernels/fp8_layers.py): `HELIOS_FP8_SKINNY=cuda-cores-wide`
streams the bf16 tiling's bytes per K step (`wide_plan`), and its sums are the default's."""

from __future__ import annotations

import pytest
import torch

from tests.kernels.test_fp8 import SCHEMES, make_weight, rel, use_skinny

# Qwen3-8B's batch-1 projections: (name, output features, K, gated)
QWEN3_8B = [("qkv", 6144, 4096, False), ("o_proj", 4096, 4096, False),
            ("gate_up", 12288, 4096, True), ("down", 4096, 12288, False)]


@pytest.mark.parametrize(("name", "n_out", "k", "gated"), QWEN3_8B)
def test_the_wide_plan_streams_the_bf16_bytes_per_step(name, n_out, k, gated):
    from services.engine.kernels.fp8_layers import wide_plan
    from services.engine.kernels.skinny_linear import plan_linear

    bf16 = plan_linear(n_out, k, 1, 132, gated)
    wide = wide_plan(bf16, k)
    assert wide.block_n == bf16.block_n
    assert wide.block_k == 2 * bf16.block_k             # one byte a weight: the bf16 bytes
    assert wide.num_warps == min(8, 2 * bf16.num_warps)
    # never past K's power of two (a 1024-wide K step at K = 1024 stays one step)
    assert wide_plan(plan_linear(1024, 1024, 1, 132), 1024).block_k == 1024


def test_only_the_switch_and_channel_scales_take_it(monkeypatch):
    from services.engine.kernels import fp8_layers

    device = torch.device("cpu")
    gen = torch.Generator().manual_seed(0)
    channel, _ = make_weight(4096, 4096, SCHEMES["token-channel"], gen, device)
    block, _ = make_weight(256, 4096, SCHEMES["group-block"], gen, device)
    use_skinny(monkeypatch, fp8_layers, "cuda-cores")
    default = fp8_layers.skinny_plan(channel, 4096, 1, device, False)
    use_skinny(monkeypatch, fp8_layers, "cuda-cores-wide")
    assert fp8_layers.skinny_plan(channel, 4096, 1, device, False) == \
        fp8_layers.wide_plan(default, 4096) != default
    # block-wise weights step one column of 128 x 128 scale blocks either way
    assert fp8_layers.skinny_plan(block, 256, 1, device, False).block_k == fp8_layers.BLOCK


@pytest.mark.parametrize("activation", [None, "silu"])
def test_wide_sums_equal_the_reference(activation, device, gen, monkeypatch):
    """At a K past the bf16 tiling's step (the projection's 1024-wide step becomes 2048, the
    gated one's 256 becomes 512), one row."""
    from services.engine.kernels import fp8_layers
    from services.engine.kernels.common import sm_count
    from services.engine.kernels.skinny_linear import plan_linear

    use_skinny(monkeypatch, fp8_layers, "cuda-cores-wide")
    n, k = 64, 2048
    weight, w64 = make_weight(2 * n if activation else n, k, SCHEMES["token-channel"], gen,
                              device)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16)
    gated = activation is not None
    plan = fp8_layers.skinny_plan(weight, n, 1, device, gated)
    default = plan_linear(n, k, 1, sm_count(device), gated)
    assert plan == fp8_layers.wide_plan(default, k) and plan.block_k == 2 * default.block_k
    if activation is None:
        out = fp8_layers.fp8_linear(x.to(device), weight, None, out_dtype=torch.float32)
        assert rel(out, x.double() @ w64.t()) < 1e-5
        return
    norm_weight = torch.ones(k, dtype=torch.bfloat16, device=device)

    def gated_output(mode: str) -> torch.Tensor:
        use_skinny(monkeypatch, fp8_layers, mode)
        out, _ = fp8_layers.fp8_norm_linear(x.to(device), None, norm_weight, 1e-6, weight,
                                            None, activation=activation)
        return out.float().cpu()

    wide, default = gated_output("cuda-cores-wide"), gated_output("cuda-cores")
    # the same fp32 sums in another order, rounded to bf16 at the same points
    assert torch.allclose(wide, default, rtol=2 ** -7, atol=1e-6)
