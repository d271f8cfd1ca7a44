"""Pieces of the API-neutral request that every protocol builds the same way.

OpenAI chat, Responses, Anthropic and Ollama bodies differ in shape, not in what they mean:
content parts become `TextPart` / `ImagePart` (each protocol's part model converts itself with
`to_part`; an empty list is a 400 naming the field), tool choices are checked against the
tools, JSON schemas become a response format, and `tool_choice: none` turns tool-call parsing
off.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from services.common.api.chat import (
    ChatInput,
    Content,
    ContentPart,
    TextPart,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.common.api.generate import ResponseFormat, ResponseFormatType
from services.common.api.json_values import json_text
from services.common.errors import ValidationError


class PartModel(Protocol):
    """A protocol's content-part model (text, refusal, image, document ...)."""

    def to_part(self, param: str) -> ContentPart: ...


def convert_parts(parts: Sequence[PartModel], param: str) -> tuple[ContentPart, ...]:
    """Each part converted, named `param[j]` in errors. An empty list is refused (templates
    would otherwise fail on it with their own, raw message)."""
    check_not_empty(parts, param)
    return tuple(part.to_part(f"{param}[{j}]") for j, part in enumerate(parts))


def check_not_empty(parts: Sequence[object], param: str) -> None:
    if not parts:
        raise ValidationError(f"{param}: must not be an empty list (send a string, or at "
                              "least one content part)", param=param)


def collapse_text(parts: Iterable[ContentPart], separator: str = "") -> Content:
    """Text-only parts as one string, else the parts. Message content keeps its parts (the
    frontend gives each chat template the form it reads); this is for places that need text."""
    parts = tuple(parts)
    if all(isinstance(p, TextPart) for p in parts):
        return separator.join(p.text for p in parts)  # type: ignore[union-attr]
    return parts


def checked_tool_choice(mode: ToolChoiceMode, tools: tuple[ToolDefinition, ...], *,
                        function_name: str = "", parallel: bool | None = None,
                        required_word: str = "required") -> ToolChoice:
    """A tool choice that names one of `tools`, and asks for a call only when there are tools
    (`required_word` is the protocol's name for that mode, for the message)."""
    if mode is ToolChoiceMode.FUNCTION:
        if function_name not in {t.name for t in tools}:
            raise ValidationError(f"tool_choice names {function_name!r}, which is not in tools",
                                  param="tool_choice")
        return ToolChoice(mode, function_name, parallel)
    if mode is ToolChoiceMode.REQUIRED and not tools:
        raise ValidationError(f"tool_choice '{required_word}' needs tools", param="tool_choice")
    return ToolChoice(mode, parallel_tool_calls=parallel)


def tool_call_parsing(chat: ChatInput) -> bool | None:
    """GenerateRequest.parse_tool_calls: off with tool_choice none, else the frontend's default."""
    return False if chat.tool_choice.mode is ToolChoiceMode.NONE else None


def json_schema_format(schema: dict[str, Any] | str, *, name: str = "",
                       strict: bool = False) -> ResponseFormat:
    """A json_schema response format; a schema given as text is passed on unchanged."""
    text = schema if isinstance(schema, str) else json_text(schema)
    return ResponseFormat(ResponseFormatType.JSON_SCHEMA, schema_json=text, name=name,
                          strict=strict)


JSON_OBJECT_FORMAT = ResponseFormat(ResponseFormatType.JSON_OBJECT)
