"""Chat and completion input: what a Generate (or RenderChat, Tokenize, CountTokens) carries.

Mirrors `ChatInput` / `CompletionInput` in `proto/helios/v1/frontend.proto`. The gateway builds
these from OpenAI / Anthropic / Ollama bodies; the frontend receives them (validated by
`convert.chat.chat_input_from_pb`) and turns them into template data.

JSON the caller authored (tool parameters, template kwargs, documents) is held as values, key
order kept; tool-call arguments are held as the JSON text they arrived as, because they are
model output that the frontend must check (and name the field at fault) before rendering.
`None` means "unset: the frontend's default" wherever a field allows it.
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
    """An image in a message; its bytes go to imageprep, the template sees a placeholder."""

    url: str = ""            # a data URL (data:image/png;base64,...), or
    data: bytes = b""        # raw encoded bytes with their media type
    media_type: str = ""     # image/png, image/jpeg, image/webp
    detail: str = ""         # OpenAI's detail hint (informational)


ContentPart = TextPart | ImagePart
# A message's content as the template sees it: a string, a tuple of parts, or None (no content).
Content = str | tuple[ContentPart, ...] | None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An earlier assistant turn's call of a tool."""

    id: str
    name: str
    arguments_json: str = ""     # JSON object text as sent ('' = {}), caller's key order
    type: str = "function"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str                    # system, developer, user, assistant, tool
    content: Content = None
    name: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""       # a tool message: the call it answers
    reasoning_content: str | None = None   # an assistant turn's reasoning, for templates

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
    AUTO = "auto"            # the model decides (default)
    NONE = "none"            # tools are not offered to the model and not parsed
    REQUIRED = "required"    # must call some tool
    FUNCTION = "function"    # must call `function_name`


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function_name: str = ""
    parallel_tool_calls: bool | None = None    # None: the default, true

    @property
    def allows_parallel_calls(self) -> bool:
        return self.parallel_tool_calls is not False


@dataclass(frozen=True, slots=True)
class ChatInput:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    add_generation_prompt: bool | None = None      # None: true unless continuing
    continue_final_message: bool = False           # continue the last assistant message
    template_kwargs: dict[str, Any] = field(default_factory=dict)  # chat_template_kwargs
    documents: list[Any] | None = None             # documents for RAG templates

    @property
    def images(self) -> tuple[ImagePart, ...]:
        return tuple(image for message in self.messages for image in message.images)

    @property
    def offers_tools(self) -> bool:
        """Tools reach the template (tool_choice none hides them from the model)."""
        return bool(self.tools) and self.tool_choice.mode is not ToolChoiceMode.NONE


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """A raw prompt: text or token ids (exactly one)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    echo: bool = False           # prepend the prompt to the output text
