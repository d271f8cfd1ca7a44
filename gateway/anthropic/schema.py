"""POST /v1/messages and /v1/messages/count_tokens request bodies -> API-neutral chat input.

Conversion rules: `system` (string or text blocks) plus any `system` / `developer` messages
that Claude Code puts inside `messages` become one leading system message; other unknown roles
(`ctx`, `msg`) count as user turns in place; `tool_result` blocks become tool messages;
`tool_use` blocks become the assistant turn's tool calls (input object -> JSON text, key order
kept); `thinking` goes back as reasoning_content; `cache_control` is ignored.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal

from pydantic import Field

from gateway.images import image_from_base64, image_from_url
from gateway.request_parts import (
    check_not_empty,
    checked_tool_choice,
    collapse_text,
    convert_parts,
    json_schema_format,
)
from gateway.schema import ApiModel, Identifier, Int32, ModelName, PositiveUInt32
from services.common.api.chat import (
    ChatInput,
    ChatMessage,
    Content,
    ContentPart,
    ImagePart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.common.api.generate import ResponseFormat
from services.common.api.json_values import json_text
from services.common.errors import UnsupportedError, ValidationError


class TextBlock(ApiModel):
    type: Literal["text"]
    text: str
    cache_control: Any = None

    def to_part(self, param: str) -> ContentPart:
        return TextPart(self.text)


class Base64Source(ApiModel):
    type: Literal["base64"]
    media_type: str
    data: str


class UrlSource(ApiModel):
    type: Literal["url"]
    url: str


class ImageBlock(ApiModel):
    type: Literal["image"]
    source: Annotated[Base64Source | UrlSource, Field(discriminator="type")]
    cache_control: Any = None

    def to_part(self, param: str) -> ImagePart:
        if isinstance(self.source, Base64Source):
            return image_from_base64(self.source.data, self.source.media_type,
                                     param=param + ".source")
        return image_from_url(self.source.url, param=param + ".source.url")


class ToolUseBlock(ApiModel):
    type: Literal["tool_use"]
    id: str
    name: str = Field(min_length=1)
    input: dict[str, Any] = Field(default_factory=dict)
    cache_control: Any = None


class ToolResultBlock(ApiModel):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[Annotated[TextBlock | ImageBlock, Field(discriminator="type")]] | None \
        = None
    is_error: bool | None = None
    cache_control: Any = None


class ThinkingBlock(ApiModel):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(ApiModel):
    type: Literal["redacted_thinking"]
    data: str = ""


class DocumentBlock(ApiModel):
    type: Literal["document"]
    source: dict[str, Any]
    title: str | None = None
    context: str | None = None
    cache_control: Any = None

    def to_part(self, param: str) -> ContentPart:
        """Plain-text documents join the user's text (title, context, data)."""
        source = self.source
        if source.get("type") == "text" and isinstance(source.get("data"), str):
            return TextPart("\n\n".join(t for t in (self.title, self.context, source["data"])
                                         if t))
        raise UnsupportedError("only plain-text document sources are supported",
                               param=param + ".source")


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock
                  | RedactedThinkingBlock | DocumentBlock, Field(discriminator="type")]


class Message(ApiModel):
    role: str = Field(min_length=1)
    content: str | list[Block]


class Tool(ApiModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    input_schema: dict[str, Any] = Field(default_factory=lambda: {"type": "object"})
    type: str | None = None
    cache_control: Any = None

    def definition(self, param: str) -> ToolDefinition:
        if self.type not in (None, "custom"):
            raise UnsupportedError(f"server tool {self.type!r} is not supported; only "
                                   "custom tools are", param=f"{param}.type")
        return ToolDefinition(name=self.name, description=self.description or "",
                              parameters=self.input_schema)


class ToolChoiceIn(ApiModel):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(ApiModel):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = Field(default=None, ge=0)


class ChatFields(ApiModel):
    """What count_tokens and messages share."""

    model: ModelName = ""
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceIn | None = None
    thinking: ThinkingConfig | None = None

    def chat_input(self) -> ChatInput:
        tools = tuple(tool.definition(f"tools[{i}]") for i, tool in enumerate(self.tools or ()))
        kwargs: dict[str, Any] = {}
        if self.thinking is not None and self.thinking.type != "adaptive":
            kwargs["enable_thinking"] = self.thinking.type == "enabled"
        return ChatInput(messages=tuple(self._messages()), tools=tools,
                         tool_choice=self._tool_choice(tools), template_kwargs=kwargs)

    def _tool_choice(self, tools: tuple[ToolDefinition, ...]) -> ToolChoice:
        choice = self.tool_choice
        if choice is None:
            return ToolChoice()
        parallel = None if choice.disable_parallel_tool_use is None \
            else not choice.disable_parallel_tool_use
        if choice.type == "tool" and (not choice.name
                                      or choice.name not in {t.name for t in tools}):
            raise ValidationError("tool_choice type 'tool' must name one of the tools",
                                  param="tool_choice.name")
        mode = {"tool": ToolChoiceMode.FUNCTION, "auto": ToolChoiceMode.AUTO,
                "any": ToolChoiceMode.REQUIRED, "none": ToolChoiceMode.NONE}[choice.type]
        return checked_tool_choice(mode, tools, function_name=choice.name or "",
                                   parallel=parallel, required_word="any")

    def _system_text(self) -> list[str]:
        if isinstance(self.system, str):
            return [self.system] if self.system else []
        return [block.text for block in self.system or ()]

    def _messages(self) -> list[ChatMessage]:
        system = self._system_text()
        turns: list[ChatMessage] = []
        for i, message in enumerate(self.messages):
            param = f"messages[{i}].content"
            final_assistant = message.role == "assistant" and i == len(self.messages) - 1
            if isinstance(message.content, list) and not final_assistant:
                check_not_empty(message.content, param)   # as Anthropic: except a prefill
            if message.role in ("system", "developer"):
                system.append(message.content if isinstance(message.content, str) else
                              "".join(b.text for b in message.content
                                      if isinstance(b, TextBlock)))
            elif message.role == "assistant":
                turns.append(_assistant(message.content))
            else:
                turns.extend(_user(message.content, param))
        head = [ChatMessage(role="system", content="\n\n".join(system))] if system else []
        return head + turns


def _user(content: str | list[Block], param: str) -> list[ChatMessage]:
    """A user turn: its tool results become tool messages (first), the rest one user message."""
    if isinstance(content, str):
        return [ChatMessage(role="user", content=content)]
    tool_messages: list[ChatMessage] = []
    parts: list[ContentPart] = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        if isinstance(block, TextBlock | ImageBlock | DocumentBlock):
            parts.append(block.to_part(where))
        elif isinstance(block, ToolResultBlock):
            tool_messages.append(_tool_result(block, where))
        elif isinstance(block, ToolUseBlock | ThinkingBlock):
            raise ValidationError(f"{block.type} blocks belong in assistant messages",
                                  param=where)
    user = [ChatMessage(role="user", content=tuple(parts))] if parts else []
    return tool_messages + user


def _tool_result(block: ToolResultBlock, param: str) -> ChatMessage:
    content: Content
    if isinstance(block.content, str):
        content = block.content
    elif not block.content:          # null or [] : an empty result
        content = ""
    else:
        content = collapse_text(convert_parts(block.content, f"{param}.content"))
    if block.is_error and isinstance(content, str):
        content = f"Error: {content}"
    return ChatMessage(role="tool", content=content, tool_call_id=block.tool_use_id)


def _assistant(content: str | list[Block]) -> ChatMessage:
    if isinstance(content, str):
        return ChatMessage(role="assistant", content=content)
    texts, calls, thinking = [], [], []
    for block in content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ToolUseBlock):
            calls.append(ToolCall(id=block.id, name=block.name,
                                  arguments_json=json_text(block.input)))
        elif isinstance(block, ThinkingBlock):
            thinking.append(block.thinking)
    text = "".join(texts)
    return ChatMessage(role="assistant", content=text if text or not calls else None,
                       tool_calls=tuple(calls),
                       reasoning_content="".join(thinking) if thinking else None)


class Metadata(ApiModel):
    user_id: str | None = None


class OutputFormat(ApiModel):
    type: Literal["json_schema"]
    schema_: dict[str, Any] = Field(alias="schema")


class OutputConfig(ApiModel):
    effort: str | None = None
    format: OutputFormat | None = None


class MessagesRequest(ChatFields):
    max_tokens: PositiveUInt32
    stop_sequences: list[str] | None = None
    temperature: float | None = Field(default=None, ge=0, le=1)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int32 | None = Field(default=None, ge=0)
    stream: bool | None = False
    metadata: Metadata | None = None
    service_tier: str | None = None
    output_config: OutputConfig | None = None
    cache_salt: Identifier | None = None     # vLLM's extension: prefix-cache tenant

    def response_format(self) -> ResponseFormat:
        fmt = self.output_config.format if self.output_config else None
        if fmt is None:
            return ResponseFormat()
        return json_schema_format(fmt.schema_)

    def generation_chat(self) -> ChatInput:
        """The chat input, with `output_config.effort` passed to the template."""
        chat = self.chat_input()
        effort = self.output_config.effort if self.output_config else None
        if effort is None:
            return chat
        kwargs = dict(chat.template_kwargs)
        kwargs.setdefault("reasoning_effort", effort)
        return dataclasses.replace(chat, template_kwargs=kwargs)

    def check_thinking(self) -> None:
        thinking = self.thinking
        if thinking is None or thinking.type != "enabled":
            return
        budget = thinking.budget_tokens
        if budget is None or budget < 1024:
            raise ValidationError("thinking.budget_tokens must be >= 1024",
                                  param="thinking.budget_tokens")
        if budget >= self.max_tokens:
            raise ValidationError("thinking.budget_tokens must be less than max_tokens",
                                  param="thinking.budget_tokens")


class CountTokensRequest(ChatFields):
    pass
