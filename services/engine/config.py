"""EngineConfig: one frozen dataclass for the engine service (flags, env HELIOS_*, YAML)."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError


@dataclass(frozen=True)
class EngineConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50052", "gRPC listen address: host:port or unix:///path")
    model: str = option("", "prepared core or Hugging Face model directory")
    imageprep_address: str = option("", "imageprep gRPC address (pixels for vision models)")
    device: str = option("auto", "auto, cpu, cuda or cuda:N")
    max_num_seqs: int = option(64, "live request slots")
    prefill_chunk_size: int = option(512, "prompt tokens per prefill step (multiple of 64)")
    max_model_len: int | None = option(None, "context limit (default: the model's)")
    context_hint: str = option("raise --max-model-len (engine) up to the model's context",
                               "appended to context-overflow errors")
    capacity_hint: str = option("raise --max-num-seqs or the KV cache budget (engine)",
                                "appended to capacity errors")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValidationError("engine needs --model (a core or model directory)",
                                  param="model")
        if self.max_num_seqs < 1:
            raise ValidationError("max_num_seqs must be >= 1", param="max_num_seqs")
        if self.prefill_chunk_size < 64 or self.prefill_chunk_size % 64:
            raise ValidationError("prefill_chunk_size must be a positive multiple of 64",
                                  param="prefill_chunk_size")
