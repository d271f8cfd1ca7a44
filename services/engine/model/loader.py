"""load_model: a checkpoint (config.json + safetensors, or a GGUF core) -> its architecture's
model on a device, every parameter filled through its own loader (weights.py)."""

from __future__ import annotations

import logging

import torch

from services.common.core import ModelSource
from services.engine.model.causal_lm import CausalLM
from services.engine.model.checkpoint import checkpoint_tensors
from services.engine.model.registry import build_model, parse_model_config
from services.engine.model.weights import load_weights

log = logging.getLogger(__name__)


def default_dtype(device: torch.device | str) -> torch.dtype:
    """float32 on the CPU (exact tests), bfloat16 on accelerators."""
    return torch.float32 if torch.device(device).type == "cpu" else torch.bfloat16


@torch.inference_mode()
def load_model(source: ModelSource, device: torch.device | str = "cpu",
               dtype: torch.dtype | None = None, *, max_positions: int | None = None,
               quantization: str = "", mxfp4_experts: str = "dequantize") -> CausalLM:
    """Build the model for `source` on `device` and fill it from the checkpoint.

    dtype defaults to float32 on the CPU and bfloat16 elsewhere; max_positions (the rotary
    tables' length, i.e. the longest context) defaults to the config's `max_context`.
    Unsupported architectures raise UnsupportedError listing the supported ones; weights
    that do not match the config raise ManifestError naming the tensor. An FP8 checkpoint
    (its `quantization_config`) loads as FP8; `quantization="fp8"` quantizes a dense one
    at load (model/quantization.py). `mxfp4_experts="keep"` keeps a checkpoint's MXFP4
    experts packed (model/mxfp4.py).
    """
    config = parse_model_config(source.config, quantization, mxfp4_experts)
    dtype = dtype or default_dtype(device)
    model = build_model(config, device, dtype, max_positions)
    load_weights(model, checkpoint_tensors(source), source=str(source.root))
    log.info("loaded %s (%s, %d layers) on %s as %s%s", source.manifest.model_id,
             config.architecture, config.num_hidden_layers, device, dtype,
             f", {config.quantization.name}" if config.quantization else "")
    return model.eval()
