"""The experts' weights: the `Experts` parameters (dense, or `Mxfp4Experts` kept MXFP4), which
parameter (and shard) each checkpoint tensor fills, and the loaders that place it (model/moe.py
runs the experts over them).

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

from services.engine.model.layers.weights import WeightShapeError, parameter
from services.engine.model.mxfp4 import GROUP, Mxfp4Weight

MOE_ACTIVATIONS = ("silu", "swiglu_oai")   # model/moe.py's and kernels/fused_moe.py's
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


class Experts(nn.Module):
    """E experts' weights, fused: `w_gate_up` [E, 2I, H], `w_down` [E, H, I] (+ biases)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 bias: bool = False, activation: str = "silu", limit: float = 7.0,
                 alpha: float = 1.702, device: torch.device | str, dtype: torch.dtype) -> None:
        super().__init__()
        if activation not in MOE_ACTIVATIONS:
            raise ValueError(f"unknown expert activation {activation!r}")
        self.num_experts, self.hidden_size = num_experts, hidden_size
        self.intermediate_size = intermediate_size
        self.activation, self.limit, self.alpha = activation, limit, alpha
        self.dtype = dtype
        gate_up = tuple(f"{e}.{part}" for e in range(num_experts) for part in ("gate", "up"))
        down = tuple(str(e) for e in range(num_experts))
        rows = expert_rows_loader(num_experts, intermediate_size)
        whole = expert_loader(num_experts)
        self._matrices(device, dtype, rows, gate_up, whole, down)
        self.gate_up_bias = self.down_bias = None
        if bias:
            self.gate_up_bias = parameter(num_experts, 2 * intermediate_size, device=device,
                                          dtype=dtype, loader=rows, shards=gate_up,
                                          covers={FUSED: gate_up})
            self.down_bias = parameter(num_experts, hidden_size, device=device, dtype=dtype,
                                       loader=whole, shards=down, covers={FUSED: down})

    def _matrices(self, device: torch.device | str, dtype: torch.dtype,
                  rows: Callable[..., None], gate_up: tuple[str, ...],
                  whole: Callable[..., None], down: tuple[str, ...]) -> None:
        """`w_gate_up` [E, 2I, H] and `w_down` [E, H, I] in `dtype`, loaded per expert
        (`gate_up` / `down` shards) or fused."""
        self.w_gate_up = parameter(self.num_experts, 2 * self.intermediate_size,
                                   self.hidden_size, device=device, dtype=dtype, loader=rows,
                                   shards=gate_up, covers={FUSED: gate_up})
        self.w_down = parameter(self.num_experts, self.hidden_size, self.intermediate_size,
                                device=device, dtype=dtype, loader=whole, shards=down,
                                covers={FUSED: down})


class Mxfp4Experts(Experts):
    """The experts with MXFP4 matrices (MoEConfig expert_format "mxfp4", engine setting
    `mxfp4_experts: keep`): `w_gate_up_blocks` uint8 [E, 2I, H/2] + `w_gate_up_scales`
    [E, 2I, H/32], `w_down_blocks` [E, H, I/2] + `w_down_scales` [E, H, I/32] (a family's
    loaders fill them: gpt_oss.py); `w_gate_up` / `w_down` are their `Mxfp4Weight`s (the
    fused-MoE kernel dequantizes tiles, the torch path one expert at a time). Biases dense."""

    w_gate_up_blocks: nn.Parameter
    w_gate_up_scales: nn.Parameter
    w_down_blocks: nn.Parameter
    w_down_scales: nn.Parameter

    def _matrices(self, device: torch.device | str, dtype: torch.dtype,
                  rows: Callable[..., None], gate_up: tuple[str, ...],
                  whole: Callable[..., None], down: tuple[str, ...]) -> None:
        experts, hidden, inter = self.num_experts, self.hidden_size, self.intermediate_size
        if hidden % GROUP or inter % GROUP:
            raise ValueError(f"MXFP4 experts need hidden ({hidden}) and intermediate "
                             f"({inter}) sizes that are multiples of {GROUP}")
        for name, out, k in (("w_gate_up", 2 * inter, hidden), ("w_down", hidden, inter)):
            setattr(self, f"{name}_blocks",
                    parameter(experts, out, k // 2, device=device, dtype=torch.uint8))
            setattr(self, f"{name}_scales",
                    parameter(experts, out, k // GROUP, device=device, dtype=torch.uint8))

    def _packed(self, name: str) -> Mxfp4Weight:
        """The Mxfp4Weight of `name`'s parameters, made once (every eager forward asks) and
        again only if a parameter object was replaced."""
        blocks, scales = getattr(self, f"{name}_blocks"), getattr(self, f"{name}_scales")
        cache: dict[str, Mxfp4Weight] = self.__dict__.setdefault("_packed_weights", {})
        weight = cache.get(name)
        if weight is None or weight.blocks is not blocks or weight.scales is not scales:
            weight = cache[name] = Mxfp4Weight(blocks, scales, self.dtype)
        return weight

    @property
    def w_gate_up(self) -> Mxfp4Weight:            # type: ignore[override]
        return self._packed("w_gate_up")

    @property
    def w_down(self) -> Mxfp4Weight:               # type: ignore[override]
        return self._packed("w_down")
