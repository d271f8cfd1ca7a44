"""The model registry: config.json `architectures[0]` -> the family module that runs it.

    architecture = resolve(config)                 # or UnsupportedError listing the supported
    model_config = parse_model_config(config)      # architecture.parse_config(config)
    model = build_model(model_config, device, dtype, max_positions)

Adding an architecture is one family module (its config parsing, decoder layer, checkpoint
names: llama.py, qwen.py, gemma3.py are the examples), one entry in FAMILIES below and one
parity test (tests/engine/model/checkpoints.py); docs/adding-an-architecture.md walks
through it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from services.common.errors import UnsupportedError
from services.common.quantization import parse_quantization
from services.engine.model import gemma3, gpt_oss, llama, mixtral, qwen, qwen3_moe, qwen_vl
from services.engine.model.architecture import Architecture
from services.engine.model.causal_lm import CausalLM
from services.engine.model.config import ModelConfig
from services.engine.model.mxfp4 import keep_mxfp4_experts

FAMILIES = (llama, qwen, gemma3, gpt_oss, qwen_vl, qwen3_moe, mixtral)

REGISTRY: dict[str, Architecture] = {
    entry.name: entry for family in FAMILIES for entry in family.ARCHITECTURES}

SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(sorted(REGISTRY))


def resolve(config: Mapping[str, Any]) -> Architecture:
    architectures = config.get("architectures") or []
    name = architectures[0] if architectures else ""
    entry = REGISTRY.get(name)
    if entry is None:
        raise UnsupportedError(
            f"architecture {name or '(none)'!r} is not supported by the Helios engine "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})", param="architectures")
    return entry


def parse_model_config(config: Mapping[str, Any], quantization: str = "",
                       mxfp4_experts: str = "dequantize") -> ModelConfig:
    """config.json -> ModelConfig (unsupported architectures and features raise
    UnsupportedError; malformed values ValidationError). The FP8 scheme comes from the
    checkpoint's `quantization_config`, else from `quantization` ("fp8": online).
    `mxfp4_experts` "keep": a checkpoint's MXFP4 experts stay packed (mxfp4.py)."""
    model_config = resolve(config).parse_config(config)
    if mxfp4_experts != "dequantize":
        model_config = keep_mxfp4_experts(model_config, config, mxfp4_experts)
    scheme = parse_quantization(config, quantization)
    return dataclasses.replace(model_config, quantization=scheme) if scheme else model_config


def build_model(config: ModelConfig, device: torch.device | str, dtype: torch.dtype,
                max_positions: int | None = None) -> CausalLM:
    """An uninitialised model of `config`'s architecture (the loader or dummy weights fill
    it); max_positions (the rotary tables' length) defaults to `config.max_context`."""
    entry = REGISTRY.get(config.architecture)
    if entry is None:
        raise UnsupportedError(f"architecture {config.architecture!r} is not registered",
                               param="architectures")
    return entry.model_class(config, device, dtype, max_positions or config.max_context)
