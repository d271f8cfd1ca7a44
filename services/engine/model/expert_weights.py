"""Expert checkpoint layouts: which `Experts` parameter (and shard) each checkpoint tensor
fills, and the loaders that place it (model/moe.py's `Experts` uses them).

Checkpoints name experts per expert (`<block>.experts.<e>.gate_proj|up_proj|down_proj.weight`,
Mixtral's `w1|w3|w2`) or fused (`<block>.experts.gate_up_proj` [E, 2I, H], `down_proj`
[E, H, I], `gate_up_proj_bias`, `down_proj_bias`). Per-expert shards are "<e>.gate",
"<e>.up" (rows [0:I] / [I:2I] of w_gate_up) and "<e>"; "fused" is the whole tensor and covers
every shard (the strict loader accepts one layout or the other, not both).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from services.engine.model.layers.weights import WeightShapeError

FUSED = "fused"          # the shard of a fused-experts checkpoint tensor (all experts at once)

# checkpoint projection names -> which part of the expert they fill
EXPERT_PROJECTIONS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down",
                      "w1": "gate", "w3": "up", "w2": "down"}
FUSED_EXPERT_TENSORS = {"gate_up_proj": "w_gate_up", "gate_up_proj.weight": "w_gate_up",
                        "down_proj": "w_down", "down_proj.weight": "w_down",
                        "gate_up_proj_bias": "gate_up_bias", "down_proj_bias": "down_bias"}


def expert_checkpoint_target(name: str) -> tuple[str, str] | None:
    """An expert tensor's (parameter name, shard), or None when `name` is not one:
    `<block>.experts.<e>.<gate_proj|up_proj|down_proj|w1|w3|w2>.<weight|bias>` (per expert)
    and `<block>.experts.<gate_up_proj|down_proj>[.weight]`, `..._bias` (fused)."""
    head, marker, rest = name.partition(".experts.")
    if not marker:
        return None
    block = f"{head}.experts"
    fused = FUSED_EXPERT_TENSORS.get(rest)
    if fused is not None:
        return f"{block}.{fused}", FUSED
    parts = rest.split(".")
    if len(parts) != 3 or not parts[0].isdigit() or parts[2] not in ("weight", "bias"):
        return None
    expert, projection, kind = parts
    part = EXPERT_PROJECTIONS.get(projection)
    if part is None:
        return None
    if part == "down":
        return f"{block}.{'w_down' if kind == 'weight' else 'down_bias'}", expert
    return f"{block}.{'w_gate_up' if kind == 'weight' else 'gate_up_bias'}", f"{expert}.{part}"


def expert_rows_loader(num_experts: int, inter: int) -> Callable[..., None]:
    """w_gate_up [E, 2I, ...] / gate_up_bias: "<e>.gate" -> rows [0:I] of expert e, "<e>.up"
    -> [I:2I]; "fused" -> the whole tensor."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        if shard == FUSED:
            _copy(param.data, tensor)
            return
        expert, part = _split_shard(shard, num_experts)
        start = 0 if part == "gate" else inter
        _copy(param.data[expert, start:start + inter], tensor)

    return load


def expert_loader(num_experts: int) -> Callable[..., None]:
    """w_down [E, H, I] / down_bias [E, H]: "<e>" -> expert e; "fused" -> the whole tensor."""

    def load(param: nn.Parameter, tensor: torch.Tensor, shard: str | None) -> None:
        if shard == FUSED:
            _copy(param.data, tensor)
            return
        expert, _ = _split_shard(shard, num_experts)
        _copy(param.data[expert], tensor)

    return load


def _split_shard(shard: str | None, num_experts: int) -> tuple[int, str]:
    head, _, part = (shard or "").partition(".")
    if not head.isdigit() or int(head) >= num_experts:
        raise KeyError(f"no expert shard {shard!r} ({num_experts} experts)")
    return int(head), part


def _copy(destination: torch.Tensor, tensor: torch.Tensor) -> None:
    if tuple(tensor.shape) != tuple(destination.shape):
        raise WeightShapeError(tuple(tensor.shape), tuple(destination.shape))
    destination.copy_(tensor)
