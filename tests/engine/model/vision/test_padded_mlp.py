"""vision/layers.py: the encoder's MLPs pad an intermediate width that is not a multiple of 8
(Qwen2.5-VL's 3,420) so cuBLAS takes its aligned kernels. The padding must be invisible: the
checkpoint's tensors load into the leading block, everything else is zero, and the MLP
computes exactly what the unpadded one does; a tensor of the wrong shape is refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from services.engine.model.layers import PackedLinear, PaddedLinear
from services.engine.model.layers.weights import WeightShapeError, weight_loader
from services.engine.model.vision.config import VisionConfig
from services.engine.model.vision.layers import GatedVisionMLP, PlainVisionMLP, aligned_width


@pytest.mark.parametrize(("width", "stored"), [(3420, 3456), (4304, 4304), (36, 64), (64, 64),
                                               (1, 64), (8, 8)])
def test_aligned_width(width, stored) -> None:
    assert aligned_width(width) == stored


def _config(family: str, inter: int, activation: str) -> VisionConfig:
    return VisionConfig(family=family, depth=1, hidden_size=32, intermediate_size=inter,
                        num_heads=2, out_hidden_size=64, patch_size=14, spatial_merge_size=2,
                        temporal_patch_size=2, activation=activation, window_size=112)


def _load(module: torch.nn.Module, tensors: dict[str, tuple[torch.Tensor, str | None]]) -> None:
    params = dict(module.named_parameters())
    for name, (tensor, shard) in tensors.items():
        param = params[name]
        weight_loader(param)(param, tensor, shard)


@pytest.mark.parametrize("activation", ["silu", "quick_gelu"])
def test_gated_mlp_padding_is_exact(activation) -> None:
    gen = torch.Generator().manual_seed(0)
    hidden, inter = 32, 36

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, dtype=torch.float64)

    gate, up, down = draw(inter, hidden), draw(inter, hidden), draw(hidden, inter)
    b_gate, b_up, b_down = draw(inter), draw(inter), draw(hidden)
    mlp = GatedVisionMLP(_config("qwen2_5_vl", inter, activation), device="cpu",
                         dtype=torch.float64)
    for param in mlp.parameters():     # stale memory must not survive into the padding
        param.data.fill_(7.0)
    _load(mlp, {"gate_up_proj.weight": (gate, "gate"), "gate_up_proj.bias": (b_gate, "gate")})
    _load(mlp, {"gate_up_proj.weight": (up, "up"), "gate_up_proj.bias": (b_up, "up"),
                "down_proj.weight": (down, None), "down_proj.bias": (b_down, None)})
    assert mlp.gate_up_proj.weight.shape == (128, hidden)
    assert mlp.down_proj.weight.shape == (hidden, 64)
    x = draw(5, hidden)
    g, u = x @ gate.T + b_gate, x @ up.T + b_up
    act = F.silu(g) if activation == "silu" else g * torch.sigmoid(1.702 * g)
    expected = (act * u) @ down.T + b_down
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)


def test_packed_slots_leave_zero_rows() -> None:
    packed = PackedLinear(4, {"gate": 3, "up": 3}, bias=True, device="cpu",
                          dtype=torch.float32, slot=lambda n: 8)
    assert packed.shards == {"gate": (0, 3), "up": (8, 3)}
    assert packed.weight.shape == (16, 4) and torch.count_nonzero(packed.weight) == 0
    weight_loader(packed.weight)(packed.weight, torch.ones(3, 4), "up")
    assert torch.count_nonzero(packed.weight[8:11]) == 12
    assert torch.count_nonzero(packed.weight) == 12


def test_plain_mlp_padding_is_exact() -> None:
    gen = torch.Generator().manual_seed(1)
    hidden, inter = 32, 52
    fc1, fc2 = torch.randn(inter, hidden, generator=gen), torch.randn(hidden, inter, generator=gen)
    b1, b2 = torch.randn(inter, generator=gen), torch.randn(hidden, generator=gen)
    mlp = PlainVisionMLP(_config("qwen3_vl", inter, "gelu_tanh"), device="cpu",
                         dtype=torch.float64)
    _load(mlp, {"linear_fc1.weight": (fc1.double(), None), "linear_fc1.bias": (b1.double(), None),
                "linear_fc2.weight": (fc2.double(), None), "linear_fc2.bias": (b2.double(), None)})
    assert mlp.linear_fc1.weight.shape == (64, hidden)
    x = torch.randn(3, hidden, generator=gen, dtype=torch.float64)
    expected = F.gelu(x @ fc1.double().T + b1.double(), approximate="tanh") @ fc2.double().T \
        + b2.double()
    torch.testing.assert_close(mlp(x), expected, rtol=1e-12, atol=1e-12)


def test_padded_linear_refuses_the_wrong_shape() -> None:
    layer = PaddedLinear(36, 32, bias=True, device="cpu", dtype=torch.float32, padded_in=64)
    with pytest.raises(WeightShapeError):
        weight_loader(layer.weight)(layer.weight, torch.ones(32, 64), None)   # the padded shape
    with pytest.raises(WeightShapeError):
        weight_loader(layer.bias)(layer.bias, torch.ones(31), None)
    with pytest.raises(ValueError, match="below"):
        PaddedLinear(36, 32, bias=False, device="cpu", dtype=torch.float32, padded_in=32)
