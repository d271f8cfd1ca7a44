"""FrontendConfig: one frozen dataclass for the frontend service."""

from __future__ import annotations

from dataclasses import dataclass

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError


@dataclass(frozen=True)
class FrontendConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50051", "gRPC listen address: host:port or unix:///path")
    model: str = option("", "prepared core or Hugging Face model directory (tokenizer, template)")
    engine_address: str = option("127.0.0.1:50052", "engine gRPC address")
    imageprep_address: str = option("127.0.0.1:50053", "imageprep gRPC address ('' = none)")
    frontend_workers: int = option(2, "CPU workers preparing requests (render + tokenize)")
    context_hint: str = option("raise --max-model-len (engine) up to the model's context",
                               "appended to context-overflow errors")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValidationError("frontend needs --model (a core or model directory)",
                                  param="model")
        if not self.engine_address:
            raise ValidationError("frontend needs --engine-address", param="engine_address")
        if self.frontend_workers < 1:
            raise ValidationError("frontend_workers must be >= 1", param="frontend_workers")
