"""FrontendConfig: one frozen dataclass for the frontend service."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from services.common.config import ServiceConfig, option
from services.common.errors import ValidationError

PARSER_CHOICES = ("auto", "none")


@dataclass(frozen=True)
class FrontendConfig(ServiceConfig):
    listen: str = option("127.0.0.1:50051", "gRPC listen address: host:port or unix:///path")
    model: str = option("", "prepared core or Hugging Face model directory (tokenizer, template)")
    engine_address: str = option("127.0.0.1:50052", "engine gRPC address")
    imageprep_address: str = option("127.0.0.1:50053", "imageprep gRPC address ('' = none)")
    frontend_workers: int = option(2, "CPU workers preparing requests (render + tokenize)")
    context_hint: str = option("raise --max-model-len (engine) up to the model's context",
                               "appended to context-overflow errors")
    tool_parser: str = option("auto", "tool-call format: auto (from the model), none, hermes, "
                                      "llama3_json, deepseek_v3 or harmony")
    reasoning_parser: str = option("auto", "reasoning format: auto (from the model), none, "
                                           "think or harmony")
    default_chat_template_kwargs: str = option(
        "", "JSON object of chat-template variables used when a request does not set them, "
            "e.g. {\"enable_thinking\": false}")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not self.model:
            raise ValidationError("frontend needs --model (a core or model directory)",
                                  param="model")
        if not self.engine_address:
            raise ValidationError("frontend needs --engine-address", param="engine_address")
        if self.frontend_workers < 1:
            raise ValidationError("frontend_workers must be >= 1", param="frontend_workers")
        self.default_template_kwargs  # noqa: B018 - validates the JSON

    @property
    def default_template_kwargs(self) -> dict[str, Any]:
        text = self.default_chat_template_kwargs.strip()
        if not text:
            return {}
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ValidationError(f"default_chat_template_kwargs is not JSON: {exc}",
                                  param="default_chat_template_kwargs") from exc
        if not isinstance(value, dict):
            raise ValidationError("default_chat_template_kwargs must be a JSON object",
                                  param="default_chat_template_kwargs")
        return value
