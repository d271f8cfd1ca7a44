"""FP8 (e4m3) linear layers' math: the weight the ops take, quantization, and the reference
(dequantizing) path every machine runs.

    w = Fp8Weight(qweight e4m3 [N, K], scale float32, scheme, input_scale)
    ops.linear(x, w, bias)                      # -> fp8_linear below
    ops.norm_linear(x, residual, g, eps, w, bias, activation)   # -> fp8_norm_linear

Scales multiply: W ~= qweight * scale, with `scale` [N] (one per output row: per-channel and
per-tensor checkpoints, the latter expanded per shard at load) or [ceil(N/128), ceil(K/128)]
(one per 128x128 block). Activations are quantized as the scheme says: per token (one scale per
row, amax / 448), per token in groups of 128 columns, or with the checkpoint's static
`input_scale` (the largest of a packed layer's shards). e4m3 saturates at 448 (values are
clamped before the cast, which rounds to nearest even).

On CUDA `services.engine.kernels.fp8_linear` / `fp8_norm_linear` run (docs/kernels.md: the
skinny W8A16 kernel at one row, else the quantization kernel and a W8A8 GEMM); elsewhere the
reference below quantizes and dequantizes the activations the same way, dequantizes the weight
and multiplies in float32, so CPU results carry the scheme's rounding.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from services.common.quantization import Fp8Scheme

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
# amax floor: an all-zero row or group gets a tiny scale instead of a division by zero
MIN_AMAX = 1e-10


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """An FP8 projection as the ops see it (built by `Fp8Linear.linear_weight`)."""

    qweight: torch.Tensor              # float8_e4m3fn [N, K]
    scale: torch.Tensor                # float32 [N] rowwise, [ceil(N/bn), ceil(K/bk)] block
    scheme: Fp8Scheme
    input_scale: torch.Tensor | None = None   # float32 [S] (static activations)
    dense: torch.Tensor | None = None   # the dequantized float32 weight (CPU layers keep one)

    @property
    def shape(self) -> torch.Size:
        return self.qweight.shape

    @property
    def block(self) -> bool:
        return self.scheme.weights == "block"

    def dequantize(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [N, K] in `dtype` (computed in float32, or float64 when asked)."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        w = self.qweight.to(work)
        if self.block:
            bn, bk = self.scheme.block
            n, k = w.shape
            scale = self.scale.to(work).repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)
            return (w * scale[:, :k]).to(dtype)
        return (w * self.scale.to(work)[:, None]).to(dtype)


# ---------------------------------------------------------------------------------------------
# Quantization (the loader's and the reference path's)


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], float32 scale [N]) with scale = amax(|row|) / 448."""
    wf = w.float()
    scale = wf.abs().amax(dim=1).clamp(min=MIN_AMAX) / FP8_MAX
    q = (wf / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def quantize_blocks(w: torch.Tensor, block: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (e4m3 [N, K], float32 scale [ceil(N/bn), ceil(K/bk)]) per 128x128 block."""
    bn, bk = block
    n, k = w.shape
    nb, kb = -(-n // bn), -(-k // bk)
    padded = F.pad(w.float(), (0, kb * bk - k, 0, nb * bn - n))
    tiles = padded.view(nb, bn, kb, bk)
    scale = tiles.abs().amax(dim=(1, 3)).clamp(min=MIN_AMAX) / FP8_MAX     # [nb, kb]
    q = (tiles / scale[:, None, :, None]).clamp(-FP8_MAX, FP8_MAX)
    return q.view(nb * bn, kb * bk)[:n, :k].to(FP8_DTYPE).contiguous(), scale


def activation_scales(x: torch.Tensor, kind: str, group: int,
                      input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """The scales quantize_activation divides by: [M, 1] per token, [M, ceil(K/g)] per group,
    [1, 1] static (the largest input_scale)."""
    xf = x.float() if x.dtype != torch.float64 else x
    if kind == "static":
        if input_scale is None:
            raise ValueError("static FP8 activations need an input_scale")
        return input_scale.to(xf.dtype).amax().reshape(1, 1)
    if kind == "token":
        return xf.abs().amax(dim=1, keepdim=True).clamp(min=MIN_AMAX) / FP8_MAX
    m, k = xf.shape
    groups = -(-k // group)
    padded = F.pad(xf, (0, groups * group - k)).view(m, groups, group)
    return padded.abs().amax(dim=2).clamp(min=MIN_AMAX) / FP8_MAX


def expand_group_scales(scale: torch.Tensor, k: int, group: int) -> torch.Tensor:
    """[M, G] (or [M, 1] / [1, 1]) scales -> one per element column [M or 1, K]."""
    if scale.shape[1] == 1:
        return scale
    return scale.repeat_interleave(group, dim=1)[:, :k]


def quantize_activation(x: torch.Tensor, kind: str, group: int,
                        input_scale: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (e4m3 [M, K], float32 scales; see activation_scales)."""
    scale = activation_scales(x, kind, group, input_scale).float()
    xs = x.float() / expand_group_scales(scale, x.shape[1], group)
    return xs.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


def fake_quantize_activation(x: torch.Tensor, kind: str, group: int,
                             input_scale: torch.Tensor | None = None) -> torch.Tensor:
    """quantize then dequantize, in float32 (the reference path's activations)."""
    q, scale = quantize_activation(x, kind, group, input_scale)
    return q.float() * expand_group_scales(scale, x.shape[1], group)


# ---------------------------------------------------------------------------------------------
# The ops (ops.linear / ops.norm_linear hand an Fp8Weight here)


def _kernel(name: str, x: torch.Tensor):  # type: ignore[no-untyped-def]
    from services.engine.model import ops

    return ops.kernel_ops().get(name) if x.is_cuda else None


def reference_fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None,
                         out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """W8A8 as the scheme computes it: activations quantized and dequantized, the weight
    dequantized, the product and bias in float32, cast to out_dtype (x's by default)."""
    scheme = weight.scheme
    xq = fake_quantize_activation(x, scheme.activations, scheme.group_size, weight.input_scale)
    dense = weight.dense if weight.dense is not None else weight.dequantize(torch.float32)
    y = xq @ dense.t()
    if bias is not None:
        y = y + bias.float()
    return y.to(out_dtype or x.dtype)


def fp8_linear(x: torch.Tensor, weight: Fp8Weight, bias: torch.Tensor | None = None,
               out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """x [T, K] @ W^T + bias -> [T, N] (out_dtype: x's by default)."""
    kernel = _kernel("fp8_linear", x)
    if kernel:
        return kernel(x, weight, bias, out_dtype=out_dtype)   # type: ignore[no-any-return]
    return reference_fp8_linear(x, weight, bias, out_dtype)


def fp8_norm_linear(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor,
                    eps: float, weight: Fp8Weight, bias: torch.Tensor | None = None,
                    activation: str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """ops.norm_linear with an FP8 projection: (y, new residual)."""
    kernel = _kernel("fp8_norm_linear", x)
    if kernel:
        return kernel(x, residual, norm_weight, eps, weight, bias,  # type: ignore[no-any-return]
                      activation)
    from services.engine.model import ops

    if residual is None:
        normed, residual = ops.rms_norm(x, norm_weight, eps), x
    else:
        normed, residual = ops.fused_add_rms_norm(x, residual, norm_weight, eps)
    y = reference_fp8_linear(normed, weight, bias)
    return (ops.gated_activation(y, activation) if activation else y), residual
