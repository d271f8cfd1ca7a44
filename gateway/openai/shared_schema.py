"""Request-schema pieces the chat and Responses bodies share: refusal parts, the image detail
hint, and `tool_choice` (a mode, or a named function)."""

from __future__ import annotations

from typing import Literal, Protocol

from gateway.request_parts import checked_tool_choice
from gateway.schema import ApiModel
from services.common.api.chat import (
    ContentPart,
    TextPart,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)

ImageDetail = Literal["auto", "low", "high"] | None
ToolChoiceName = Literal["none", "auto", "required"]


class RefusalPart(ApiModel):
    # An assistant's earlier refusal: it goes back to the template as text.
    type: Literal["refusal"]
    refusal: str

    def to_part(self, param: str) -> ContentPart:
        return TextPart(self.refusal)


class NamedChoice(Protocol):
    """A `tool_choice` naming one function (chat nests the name, Responses does not)."""

    @property
    def function_name(self) -> str: ...


def openai_tool_choice(choice: ToolChoiceName | NamedChoice | None,
                       tools: tuple[ToolDefinition, ...], parallel: bool | None) -> ToolChoice:
    if choice is None or isinstance(choice, str):
        return checked_tool_choice(ToolChoiceMode(choice or "auto"), tools, parallel=parallel)
    return checked_tool_choice(ToolChoiceMode.FUNCTION, tools, function_name=choice.function_name,
                               parallel=parallel)
