"""Triton kernels for the engine's hot ops, one module per kernel.

`services.engine.model.ops` calls a function here, by the same name, when its tensors are on
CUDA and this package exposes it (`getattr(kernels, name, None)`); otherwise it runs its
plain-torch reference. The exported names and signatures match `model/ops.py` exactly:

    rms_norm(x, weight, eps) -> out
    fused_add_rms_norm(x, residual, weight, eps) -> (normed, x + residual)
    apply_rotary(q, k, positions, cos_sin_cache, is_neox=True) -> (q, k)
    silu_and_mul(x) -> out
    gelu_tanh_and_mul(x) -> out                                 (Gemma's gelu_pytorch_tanh)
    write_kv(k, v, k_cache, v_cache, slot_mapping) -> None     (in place)
    paged_attention(q, k_cache, v_cache, meta, scale, sliding_window=0, *, sinks=None) -> out
    qkv_prologue(qkv, q_norm, k_norm, eps, positions, cos_sin_cache, is_neox, k_cache,
                 v_cache, slot_mapping, num_q_heads, num_kv_heads) -> q   (writes K/V)
    linear(x, weight, bias=None, out_dtype=None) -> out        (skinny rows; cuBLAS above)
    norm_linear(x, residual, norm_weight, eps, weight, bias=None, activation=None)
        -> (out, new_residual)          (norm + projection [+ "silu" / "gelu_tanh" and mul])
    fp8_linear(x, weight: Fp8Weight, bias=None, out_dtype=None) -> out
    fp8_norm_linear(x, residual, norm_weight, eps, weight: Fp8Weight, bias=None,
                    activation=None) -> (out, new_residual)      (model/fp8.py's FP8 ops)
    fused_experts(x, w_gate_up, w_down, topk_weights, topk_ids, *, gate_up_bias, down_bias,
                  activation, limit, alpha) -> out        (model/moe.py's op; fused_moe.py)
    fused_moe_routed(x, router_logits, w_gate_up, w_down, top_k, renormalize, ...)
        -> (out, topk_weights, topk_ids)                  (the routing fused in too)

Each also takes keyword-only `out=` buffers (and `scratch=` for attention) so a CUDA graph can
capture it without allocating. Triton is imported lazily: importing this package on a machine
without triton (or without CUDA) costs nothing, and the names are simply absent there, so the
reference path runs. Set TRITON_INTERPRET=1 before first use to run the kernels on the CPU
through Triton's interpreter (the CPU tests do this, on small shapes).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import Any

# exported name -> module (under this package) that defines it
_EXPORTS: dict[str, str] = {
    "rms_norm": "norm",
    "fused_add_rms_norm": "norm",
    "apply_rotary": "rotary",
    "silu_and_mul": "activation",
    "gelu_tanh_and_mul": "activation",
    "write_kv": "kv_write",
    "paged_attention": "attention",
    "qkv_prologue": "prologue",
    "linear": "skinny_linear",
    "norm_linear": "skinny_linear",
    "AttentionScratch": "attention",
    "fp8_linear": "fp8_layers",
    "fp8_norm_linear": "fp8_layers",
    "fused_experts": "fused_moe",
    "fused_moe_routed": "fused_moe",
}

__all__ = ["is_available", *_EXPORTS]


def is_available() -> bool:
    """True when the kernels can run here: triton is importable and there is a CUDA device,
    or Triton's CPU interpreter is switched on (TRITON_INTERPRET=1)."""
    if importlib.util.find_spec("triton") is None:
        return False
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        return True
    import torch

    return torch.cuda.is_available()


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None or not is_available():
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
