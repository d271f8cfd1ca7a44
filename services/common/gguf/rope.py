"""Rotary scaling a GGUF file states -> config.json's `rope_scaling` (None when it states none).

llama.cpp writes scaling two ways:
- metadata `{arch}.rope.scaling.type` (linear, yarn) with `.factor`, `.original_context_length`
  and yarn's `.yarn_beta_fast` / `.yarn_beta_slow`;
- for Llama 3.1-style scaling, no metadata but a `rope_freqs.weight` tensor: the per-frequency
  divisors its converter computed from (factor, low/high frequency factors, original context).
  The divisors are recomputed from the parameters Llama 3.x checkpoints use, and the file's
  tensor must match them; otherwise the file is refused rather than run with the wrong rotary.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from services.common.errors import UnsupportedError
from services.common.gguf.reader import GGUFFile

ROPE_FREQS_TENSOR = "rope_freqs.weight"
# The Llama 3.1 / 3.2 / 3.3 rope_scaling besides `factor` (their config.json files).
LLAMA3_LOW_FREQ_FACTOR = 1.0
LLAMA3_HIGH_FREQ_FACTOR = 4.0
LLAMA3_ORIGINAL_CONTEXT = 8192


def llama3_divisors(head_dim: int, theta: float, factor: float, low_freq_factor: float,
                    high_freq_factor: float, original_context: int) -> np.ndarray:
    """The divisor of each rotary frequency under Llama 3 scaling, [head_dim // 2]."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / inv_freq
    low_wavelen = original_context / low_freq_factor
    high_wavelen = original_context / high_freq_factor
    smooth = (original_context / wavelen - low_freq_factor) / (high_freq_factor -
                                                                low_freq_factor)
    between = 1.0 / ((1.0 - smooth) / factor + smooth)
    return np.where(wavelen < high_wavelen, 1.0, np.where(wavelen > low_wavelen, factor,
                                                           between))


def _from_rope_freqs(gguf_file: GGUFFile, head_dim: int, theta: float) -> dict[str, Any]:
    from gguf.quants import dequantize

    tensor = gguf_file.reader_tensor(ROPE_FREQS_TENSOR)
    divisors = np.asarray(dequantize(tensor.data, tensor.tensor_type),
                          dtype=np.float64).reshape(-1)
    factor = float(divisors.max())
    expected = llama3_divisors(head_dim, theta, factor, LLAMA3_LOW_FREQ_FACTOR,
                               LLAMA3_HIGH_FREQ_FACTOR, LLAMA3_ORIGINAL_CONTEXT)
    if divisors.shape != expected.shape or not np.allclose(divisors, expected, rtol=1e-4):
        raise UnsupportedError(
            f"{gguf_file.path}: tensor {ROPE_FREQS_TENSOR} holds rotary frequency factors "
            "that are not Llama 3 scaling (factor, low 1, high 4, original context 8192); "
            "such a file is not supported", param=ROPE_FREQS_TENSOR)
    return {"rope_type": "llama3", "factor": factor,
            "low_freq_factor": LLAMA3_LOW_FREQ_FACTOR,
            "high_freq_factor": LLAMA3_HIGH_FREQ_FACTOR,
            "original_max_position_embeddings": LLAMA3_ORIGINAL_CONTEXT}


def rope_scaling(gguf_file: GGUFFile, head_dim: int, theta: float) -> dict[str, Any] | None:
    """config.json `rope_scaling` for the file (None: plain rotary)."""
    kind = gguf_file.arch_value("rope.scaling.type")
    factor = gguf_file.arch_value("rope.scaling.factor")
    original = gguf_file.arch_value("rope.scaling.original_context_length")
    if kind in (None, "none") and ROPE_FREQS_TENSOR in gguf_file.tensor_names:
        return _from_rope_freqs(gguf_file, head_dim, theta)
    if kind in (None, "none"):
        return None
    if factor is None:
        raise UnsupportedError(f"{gguf_file.path}: rope scaling {kind!r} without a factor",
                               param="rope.scaling.factor")
    if kind == "linear":
        return {"rope_type": "linear", "factor": float(factor)}
    if kind == "yarn":
        scaling: dict[str, Any] = {"rope_type": "yarn", "factor": float(factor)}
        if original is not None:
            scaling["original_max_position_embeddings"] = int(original)
        for key, name in (("rope.scaling.yarn_beta_fast", "beta_fast"),
                          ("rope.scaling.yarn_beta_slow", "beta_slow")):
            value = gguf_file.arch_value(key)
            if value is not None:
                scaling[name] = float(value)
        return scaling
    raise UnsupportedError(
        f"{gguf_file.path}: rope scaling type {kind!r} is not supported (supported: none, "
        "linear, yarn, and Llama 3 rope_freqs)", param="rope.scaling.type")
