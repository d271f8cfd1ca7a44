"""Ollama request bodies (/api/chat, /api/generate, /api/show) -> API-neutral requests."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from gateway.images import image_from_bare_base64
from gateway.request_parts import JSON_OBJECT_FORMAT, json_schema_format
from gateway.schema import ApiModel, Int32, ModelName, RequiredModelName, Seed
from services.common.api import generate as domain
from services.common.api.chat import (
    ChatInput,
    ChatMessage,
    CompletionInput,
    Content,
    TextPart,
    ToolCall,
    ToolDefinition,
)
from services.common.api.json_values import json_text
from services.common.errors import UnsupportedError, ValidationError


def model_name(name: str) -> str:
    """Ollama clients add the default tag; Helios' names have none."""
    return name.removesuffix(":latest")


class Options(ApiModel):
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int32 | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    num_predict: Int32 | None = Field(default=None, ge=-2)
    num_ctx: int | None = None              # the context is fixed by the core: ignored
    stop: list[str] | str | None = None
    seed: Seed | None = None
    repeat_penalty: float | None = Field(default=None, gt=0, le=100)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(s for s in stops if s)


class FunctionCall(ApiModel):
    name: str = Field(min_length=1)
    arguments: dict[str, Any] = Field(default_factory=dict)


class ToolCallIn(ApiModel):
    function: FunctionCall
    id: str | None = None


class Message(ApiModel):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str = ""
    images: list[str] | None = None
    tool_calls: list[ToolCallIn] | None = None
    thinking: str | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class FunctionDef(ApiModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(ApiModel):
    type: Literal["function"] = "function"
    function: FunctionDef

    def definition(self) -> ToolDefinition:
        f = self.function
        return ToolDefinition(name=f.name, description=f.description or "",
                              parameters=f.parameters)


class GenerateFields(ApiModel):
    model: RequiredModelName
    format: Literal["", "json"] | dict[str, Any] | None = None
    options: Options | None = None
    stream: bool | None = True
    think: bool | Literal["low", "medium", "high"] | None = None
    keep_alive: float | str | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0, le=20)

    @property
    def streaming(self) -> bool:
        return self.stream is not False

    def response_format(self) -> domain.ResponseFormat:
        if self.format == "json":
            return JSON_OBJECT_FORMAT
        if isinstance(self.format, dict):
            return json_schema_format(self.format)
        return domain.ResponseFormat()

    def template_kwargs(self) -> dict[str, Any]:
        if self.think is None:
            return {}
        kwargs: dict[str, Any] = {"enable_thinking": self.think is not False}
        if isinstance(self.think, str):
            kwargs["reasoning_effort"] = self.think
        return kwargs

    def sampling(self) -> domain.Sampling:
        o = self.options or Options()
        return domain.Sampling(temperature=o.temperature, top_p=o.top_p, top_k=o.top_k,
                               min_p=o.min_p, presence_penalty=o.presence_penalty,
                               frequency_penalty=o.frequency_penalty,
                               repetition_penalty=o.repeat_penalty, seed=o.seed,
                               max_tokens=o.num_predict if o.num_predict and o.num_predict > 0
                               else None,
                               logprobs=bool(self.logprobs), top_logprobs=self.top_logprobs or 0)

    def generation(self, request_id: str, input: ChatInput | CompletionInput
                   ) -> domain.GenerateRequest:
        return domain.GenerateRequest(
            request_id=request_id, model=model_name(self.model), input=input,
            sampling=self.sampling(), stop=(self.options or Options()).stops(),
            response_format=self.response_format(),
            parse_reasoning=None if self.think is None else self.think is not False)


def _message(message: Message, i: int) -> ChatMessage:
    content: Content = message.content
    if message.images:
        images = [image_from_bare_base64(data, param=f"messages[{i}].images[{k}]")
                  for k, data in enumerate(message.images)]
        content = (*images, TextPart(message.content))
    calls = tuple(ToolCall(id=call.id or f"call_{i}_{k}", name=call.function.name,
                           arguments_json=json_text(call.function.arguments))
                  for k, call in enumerate(message.tool_calls or ()))
    return ChatMessage(role=message.role, content=content, tool_calls=calls,
                       name=message.tool_name or "", tool_call_id=message.tool_call_id or "",
                       reasoning_content=message.thinking)


class ChatRequest(GenerateFields):
    messages: list[Message] = Field(default_factory=list)
    tools: list[Tool] | None = None

    def chat_input(self) -> ChatInput:
        tools = tuple(tool.definition() for tool in self.tools or ())
        return ChatInput(messages=tuple(_message(m, i) for i, m in enumerate(self.messages)),
                         tools=tools, template_kwargs=self.template_kwargs())


class GenerateRequest(GenerateFields):
    prompt: str = ""
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = False
    images: list[str] | None = None

    def input(self) -> ChatInput | CompletionInput:
        if self.suffix:
            raise UnsupportedError("suffix (fill-in-the-middle) is not supported",
                                   param="suffix")
        if self.template:
            raise UnsupportedError("a per-request template is not supported; the model's "
                                   "template is fixed by its core", param="template")
        if self.context:
            raise UnsupportedError("context is not supported; use /api/chat for "
                                   "conversations", param="context")
        if self.raw:
            if self.images:
                raise ValidationError("raw prompts cannot carry images", param="images")
            return CompletionInput(text=self.prompt)
        content: Content = self.prompt
        if self.images:
            content = (*(image_from_bare_base64(d, param=f"images[{k}]")
                         for k, d in enumerate(self.images)), TextPart(self.prompt))
        messages = ([ChatMessage(role="system", content=self.system)] if self.system else []) \
            + [ChatMessage(role="user", content=content)]
        return ChatInput(messages=tuple(messages), template_kwargs=self.template_kwargs())


class ShowRequest(ApiModel):
    model: ModelName | None = None
    name: ModelName | None = None  # older clients
    verbose: bool | None = None

    def model_name(self) -> str:
        name = self.model or self.name
        if not name:
            raise ValidationError("model is required", param="model")
        return model_name(name)
