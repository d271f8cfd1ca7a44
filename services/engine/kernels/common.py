"""Small helpers every kernel wrapper uses: input checks and device facts.

Wrappers check shapes, dtypes and strides on the host (metadata only, never tensor values, so
no check synchronizes the device and every wrapper stays CUDA-graph capturable).
"""

from __future__ import annotations

import functools
import os

import torch

from services.common.errors import UnsupportedError, ValidationError

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def check_float(name: str, t: torch.Tensor) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise UnsupportedError(f"{name}: dtype {t.dtype} is not supported (bf16, fp16, fp32)")


# KV pages: the compute dtypes, or e4m3 (kv_cache_dtype fp8; kernels/fp8_quant.py rounds)
KV_CACHE_DTYPES = (*FLOAT_DTYPES, torch.float8_e4m3fn)


def check_kv_cache_dtype(name: str, t: torch.Tensor) -> None:
    if t.dtype not in KV_CACHE_DTYPES:
        raise UnsupportedError(f"{name}: dtype {t.dtype} is not supported (bf16, fp16, fp32, "
                               "float8_e4m3fn)")


def check_rank(name: str, t: torch.Tensor, rank: int) -> None:
    if t.dim() != rank:
        raise ValidationError(f"{name}: expected {rank} dims, got shape {tuple(t.shape)}")


def check_last_dim_contiguous(name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValidationError(f"{name}: the last dim must be contiguous (strides {t.stride()})")


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = {t.device for t in tensors.values()}
    if len(devices) > 1:
        listing = ", ".join(f"{n}={t.device}" for n, t in tensors.items())
        raise ValidationError(f"tensors on different devices: {listing}")


def check_norm_inputs(x: torch.Tensor, residual: torch.Tensor | None,
                      norm_weight: torch.Tensor) -> None:
    """A fused norm's operands: norm_weight [K] contiguous float on x's device; residual, if
    any, x's shape and dtype, last dim contiguous, on x's device."""
    k_dim = x.shape[-1]
    if norm_weight.shape != (k_dim,) or norm_weight.stride(0) != 1:
        raise ValidationError(f"norm_weight: expected ({k_dim},) contiguous, "
                              f"got {tuple(norm_weight.shape)}")
    check_float("norm_weight", norm_weight)
    check_same_device(x=x, norm_weight=norm_weight)
    if residual is not None:
        if residual.shape != x.shape or residual.dtype != x.dtype:
            raise ValidationError(f"residual: expected {tuple(x.shape)} {x.dtype}, "
                                  f"got {tuple(residual.shape)} {residual.dtype}")
        check_last_dim_contiguous("residual", residual)
        check_same_device(x=x, residual=residual)


def check_gated_rows(weight_rows: int, activation: str | None) -> None:
    """A gated activation splits the weight's rows into gate and up halves."""
    if activation and weight_rows % 2:
        raise ValidationError(f"weight: {weight_rows} rows cannot split into gate and up "
                              "halves")


def check_out(name: str, out: torch.Tensor, shape: tuple[int, ...], like: torch.Tensor) -> None:
    """An `out=` buffer must have exactly the result's shape, dtype and device."""
    if tuple(out.shape) != shape or out.dtype != like.dtype or out.device != like.device:
        raise ValidationError(
            f"{name}: expected {shape} {like.dtype} on {like.device}, "
            f"got {tuple(out.shape)} {out.dtype} on {out.device}"
        )
    if not out.is_contiguous():
        raise ValidationError(f"{name}: must be contiguous (strides {out.stride()})")


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessors of `device` (132 on an H200); a fixed 132 off CUDA (interpreter runs)."""
    if device.type != "cuda":
        return 132
    return _sm_count(device.index if device.index is not None else torch.cuda.current_device())


def env_choice(name: str, values: tuple[str, ...]) -> str:
    """An environment switch: unset is the first of `values`; anything else not among them is
    refused by name (a typo must not fall back to the default unnoticed)."""
    value = os.environ.get(name, "").strip().lower() or values[0]
    if value not in values:
        raise ValidationError(f"{name}={value!r}: expected one of {', '.join(values)}")
    return value
