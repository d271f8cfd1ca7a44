"""The pieces both Qwen vision towers share: packed variable-length non-causal attention,
the 2-D rotary table, the patch embedding, LayerNorm and the vision block.

Attention over packed images: every image (Qwen2.5-VL: every window) is one segment of the
patch rows, `cu_seqlens` its boundaries, and a patch attends to every patch of its segment
and to nothing else. `varlen_attention` pads the segments into a batch [S, Lmax] and runs
SDPA with a key-padding mask (one call per distinct shape; exact on the CPU in float32), or,
with the `triton` backend (`Segments.of(..., backend="triton")`, CUDA), the engine's paged
attention kernel over the segments' keys (encoder_attention.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from services.engine.model import ops
from services.engine.model.layers import Linear, PackedLinear, PaddedLinear, RMSNorm
from services.engine.model.layers.weights import parameter
from services.engine.model.vision.config import VisionConfig
from services.engine.model.vision.encoder_attention import (
    PagedSegments,
    check_backend,
    paged_segment_attention,
)


@dataclass(frozen=True, slots=True)
class Segments:
    """Packed rows cut into segments (images or windows), laid out once per tower pass and
    shared by every block that attends over them: (segment, offset) of each row, the key
    mask of the padded batch, or None when every segment has the same length."""

    count: int
    longest: int
    segment: torch.Tensor | None = None     # int64 [N]
    offset: torch.Tensor | None = None      # int64 [N]
    keys: torch.Tensor | None = None        # bool [S, 1, 1, L]
    paged: PagedSegments | None = None      # the triton backend's layout (else SDPA)
    flat: torch.Tensor | None = None        # int64 [N]: segment * longest + offset

    @classmethod
    def of(cls, cu_seqlens: Sequence[int], device: torch.device | str,
           backend: str = "sdpa") -> Segments:
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        if check_backend(backend) == "triton":
            return cls(len(lengths), max(lengths), paged=PagedSegments.of(cu_seqlens, device))
        if len(set(lengths)) == 1:
            return cls(len(lengths), lengths[0])
        sizes = torch.tensor(lengths)
        segment = torch.repeat_interleave(torch.arange(len(lengths)), sizes)
        offset = torch.arange(int(cu_seqlens[-1])) - torch.tensor(
            cu_seqlens[:-1]).repeat_interleave(sizes)
        longest = max(lengths)
        keys = torch.arange(longest)[None, :] < sizes[:, None]
        return cls(len(lengths), longest, segment.to(device), offset.to(device),
                   keys[:, None, None, :].to(device), flat=(segment * longest + offset).to(device))


def varlen_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     segments: Segments, scale: float) -> torch.Tensor:
    """Non-causal attention within each segment: q/k/v [N, H, D] -> [N, H, D]."""
    if segments.paged is not None:
        return paged_segment_attention(q, k, v, segments.paged, scale)
    num_rows, heads, dim = q.shape
    if segments.segment is None:                 # equal segments: a plain batched call
        count, length = segments.count, segments.longest

        def batched(x: torch.Tensor) -> torch.Tensor:
            return x.view(count, length, heads, dim).transpose(1, 2)

        out = F.scaled_dot_product_attention(batched(q), batched(k), batched(v), scale=scale)
        return out.transpose(1, 2).reshape(num_rows, heads, dim)
    segment, offset, flat = segments.segment, segments.offset, segments.flat
    assert flat is not None
    padded = []
    for x in (q, k, v):
        # rows copied along one dim (an index_put over (segment, offset) took 31 us a tensor
        # for the 7B's 3,996 patches on an H200: 2.6 ms of a 23 ms pass)
        buffer = x.new_zeros(segments.count * segments.longest, heads, dim)
        buffer.index_copy_(0, flat, x)
        padded.append(buffer.view(segments.count, segments.longest, heads, dim)
                      .transpose(1, 2))                              # [S, H, L, D]
    out = F.scaled_dot_product_attention(padded[0], padded[1], padded[2],
                                         attn_mask=segments.keys,
                                         scale=scale)                # [S, H, L, D]
    return out.transpose(1, 2)[segment, offset]


def vision_rotary_table(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """positions int64 [N, 2] (patch row, column) -> cos/sin rows [N, head_dim] in the layout
    `ops.apply_rotary` reads: the first D/4 frequencies turn with the row, the next D/4 with
    the column (Qwen's axial 2-D rope), cos in the first half and sin in the second."""
    spatial = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, spatial, 2, dtype=torch.float32,
                                             device=positions.device) / spatial))
    freqs = positions.float()[..., None] * inv_freq                    # [N, 2, D/4]
    angles = freqs.flatten(1)                                          # [N, D/2]: rows, cols
    return torch.cat((angles.cos(), angles.sin()), dim=-1)


class Weights(nn.Module):
    """A bare holder of checkpoint-named parameters (`proj.weight`, `pos_embed.weight`)."""

    weight: nn.Parameter
    bias: nn.Parameter | None

    def __init__(self, weight: nn.Parameter, bias: nn.Parameter | None = None) -> None:
        super().__init__()
        self.weight = weight
        self.bias = bias


class PatchEmbed(nn.Module):
    """The Conv3d over (temporal, patch, patch) with stride = kernel, as one projection of
    each patch's C*T*P*P values (the weight keeps the checkpoint's 5-D shape)."""

    def __init__(self, config: VisionConfig, *, bias: bool, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.proj = Weights(
            parameter(config.hidden_size, config.in_channels, config.temporal_patch_size,
                      config.patch_size, config.patch_size, device=device, dtype=dtype),
            parameter(config.hidden_size, device=device, dtype=dtype) if bias else None)
        self.hidden_size = config.hidden_size

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [N, C*T*P*P] -> [N, hidden]."""
        weight = self.proj.weight.reshape(self.hidden_size, -1)
        return F.linear(pixels.to(weight.dtype), weight, self.proj.bias)


class LayerNorm(nn.Module):
    def __init__(self, size: int, eps: float, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter(size, device=device, dtype=dtype)
        self.bias = parameter(size, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)


def activate(x: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "silu":
        return F.silu(x)
    if activation == "gelu_tanh":
        return F.gelu(x, approximate="tanh")
    if activation == "gelu":
        return F.gelu(x)
    if activation == "quick_gelu":
        return x * torch.sigmoid(1.702 * x)
    raise ValueError(f"unknown vision activation {activation!r}")


class VisionAttention(nn.Module):
    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads, self.head_dim = config.num_heads, config.head_dim
        self.qkv = Linear(hidden, 3 * hidden, bias=True, device=device, dtype=dtype)
        self.proj = Linear(hidden, hidden, bias=True, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor, rows: torch.Tensor,
                segments: Segments) -> torch.Tensor:
        """x [N, hidden], rotary [N, D] (rows: 0..N-1) -> [N, hidden]."""
        n = x.shape[0]
        # one copy lays q, k and v out contiguously (three .contiguous() calls were three
        # kernels a block)
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, self.head_dim).transpose(0, 1) \
            .contiguous().unbind(0)
        q, k = ops.apply_rotary(q, k, rows, rotary, True)
        out = varlen_attention(q, k, v, segments, self.head_dim ** -0.5)
        return self.proj(out.reshape(n, -1))


def aligned_width(features: int) -> int:
    """The MLP's intermediate width as the encoder stores it: unchanged when a multiple of 8,
    else padded to a multiple of 64. Qwen2.5-VL's 3,420 leaves the activation's rows and the
    down projection's weight off 16-byte alignment, where cuBLAS falls back to an sm80 kernel
    at half the speed of its Hopper ones (6.25 ms of a 23 ms encoder pass on an H200,
    RESULTS.md 2026-12-06, eighth session). The padding is zeros (act(0) * 0 = 0 and zero
    weights: the same sums); dummy weights draw random values there like everywhere else."""
    return features if features % 8 == 0 else -(-features // 64) * 64


class GatedVisionMLP(nn.Module):
    """Qwen2.5-VL's block MLP: act(gate) * up -> down, every projection with a bias."""

    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        inter, hidden = config.intermediate_size, config.hidden_size
        self.activation = config.activation
        self.gate_up_proj = PackedLinear(hidden, {"gate": inter, "up": inter}, bias=True,
                                         device=device, dtype=dtype, slot=aligned_width)
        self.down_proj = PaddedLinear(inter, hidden, bias=True, device=device, dtype=dtype,
                                      padded_in=aligned_width(inter))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.gate_up_proj(x)
        if self.activation in ops.GATED_ACTIVATIONS:     # one kernel on CUDA (the decoder's)
            return self.down_proj(ops.gated_activation(gate_up, self.activation))
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(activate(gate, self.activation) * up)


class PlainVisionMLP(nn.Module):
    """Qwen3-VL's block MLP: fc1 -> act -> fc2 (the intermediate padded as `aligned_width`
    says: fc1's extra rows and bias are zero, so act(0) = 0 meets fc2's zero columns)."""

    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        inter, hidden = config.intermediate_size, config.hidden_size
        self.activation = config.activation
        width = aligned_width(inter)
        self.linear_fc1 = PaddedLinear(hidden, inter, bias=True, device=device, dtype=dtype,
                                       padded_out=width)
        self.linear_fc2 = PaddedLinear(inter, hidden, bias=True, device=device, dtype=dtype,
                                       padded_in=width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(activate(self.linear_fc1(x), self.activation))


class VisionBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x)). Qwen2.5-VL: RMSNorm and the
    gated MLP; Qwen3-VL: LayerNorm and the plain MLP."""

    def __init__(self, config: VisionConfig, *, device: torch.device | str,
                 dtype: torch.dtype) -> None:
        super().__init__()
        self.norm1: nn.Module
        self.norm2: nn.Module
        self.mlp: nn.Module
        if config.family == "qwen2_5_vl":
            self.norm1 = RMSNorm(config.hidden_size, 1e-6, device=device, dtype=dtype)
            self.norm2 = RMSNorm(config.hidden_size, 1e-6, device=device, dtype=dtype)
            self.mlp = GatedVisionMLP(config, device=device, dtype=dtype)
        else:
            self.norm1 = LayerNorm(config.hidden_size, 1e-6, device=device, dtype=dtype)
            self.norm2 = LayerNorm(config.hidden_size, 1e-6, device=device, dtype=dtype)
            self.mlp = PlainVisionMLP(config, device=device, dtype=dtype)
        self.attn = VisionAttention(config, device=device, dtype=dtype)

    def forward(self, x: torch.Tensor, rotary: torch.Tensor, rows: torch.Tensor,
                segments: Segments) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), rotary, rows, segments)
        return x + self.mlp(self.norm2(x))
