"""Chat input as the frontend sees it: typed, validated, independent of protobuf.

`convert.py` builds these from `helios.v1.ChatInput`; `template_data.py` turns them into the
plain dicts and lists a chat template reads. JSON fields (tool arguments, tool parameters,
documents, template kwargs) are already parsed here, with key order kept.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class TextPart:
    text: str


@dataclass(frozen=True, slots=True)
class ImagePart:
    """An image in a message; the bytes go to imageprep, the template sees a placeholder."""

    url: str = ""            # data URL (data:image/png;base64,...)
    data: bytes = b""        # or raw encoded bytes with their media type
    media_type: str = ""
    detail: str = ""


ContentPart = TextPart | ImagePart
# A message's content: a string, a list of parts, or None (no content at all).
Content = str | tuple[ContentPart, ...] | None


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    type: str                      # "function"
    name: str
    arguments: dict[str, Any]      # the parsed arguments object, caller's key order


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str                      # system, developer, user, assistant, tool
    content: Content = None
    name: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning_content: str | None = None

    @property
    def images(self) -> tuple[ImagePart, ...]:
        if isinstance(self.content, tuple):
            return tuple(p for p in self.content if isinstance(p, ImagePart))
        return ()


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    name: str
    type: str = "function"
    description: str = ""
    parameters: dict[str, Any] | None = None   # JSON Schema object (None: not given)
    strict: bool | None = None


class ToolChoiceMode(enum.Enum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    FUNCTION = "function"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function_name: str = ""
    parallel_tool_calls: bool = True


@dataclass(frozen=True, slots=True)
class ChatInput:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    add_generation_prompt: bool | None = None      # None: true unless continuing
    continue_final_message: bool = False
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    documents: list[Any] | None = None

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(image for message in self.messages for image in message.images)

    @property
    def offers_tools(self) -> bool:
        """Tools reach the template (tool_choice none hides them from the model)."""
        return bool(self.tools) and self.tool_choice.mode is not ToolChoiceMode.NONE
