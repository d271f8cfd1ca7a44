"""POST /v1/chat/completions request body (OpenAI + vLLM/SGLang extensions) -> GenerationRequest."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gateway.domain import (
    ChatInput,
    ChatMessage,
    ContentPart,
    GenerationRequest,
    ResponseFormat,
    ResponseFormatType,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from gateway.images import image_from_url
from gateway.openai.sampling import SamplingFields
from gateway.schema import ApiModel, PositiveUInt32, json_object_text, json_text
from services.common.errors import UnsupportedError, ValidationError


class TextPart(ApiModel):
    type: Literal["text"]
    text: str


class RefusalPart(ApiModel):
    type: Literal["refusal"]
    refusal: str


class ImageUrl(ApiModel):
    url: str
    detail: Literal["auto", "low", "high"] | None = None


class ImagePart(ApiModel):
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[TextPart | ImagePart | RefusalPart, Field(discriminator="type")]


class FunctionCall(ApiModel):
    name: str = Field(min_length=1)
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(ApiModel):
    id: str = ""
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(ApiModel):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[Part] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None

    @model_validator(mode="after")
    def _check_role(self) -> Message:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "assistant" and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        return self


class FunctionDef(ApiModel):
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(ApiModel):
    type: Literal["function"] = "function"
    function: FunctionDef


class NamedFunction(ApiModel):
    name: str = Field(min_length=1)


class NamedToolChoice(ApiModel):
    type: Literal["function"] = "function"
    function: NamedFunction


class JsonSchemaSpec(ApiModel):
    name: str = "response"
    description: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormatIn(ApiModel):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaSpec | None = None


class StructuredOutputs(ApiModel):
    json_: dict[str, Any] | str | None = Field(default=None, alias="json")
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    structural_tag: Any = None


def convert_parts(parts: list[Part], param: str) -> tuple[ContentPart, ...]:
    converted = []
    for j, part in enumerate(parts):
        if isinstance(part, TextPart):
            converted.append(ContentPart(text=part.text))
        elif isinstance(part, RefusalPart):
            converted.append(ContentPart(text=part.refusal))
        else:
            converted.append(ContentPart(image=image_from_url(
                part.image_url.url, detail=part.image_url.detail or "",
                param=f"{param}[{j}].image_url.url")))
    return tuple(converted)


def convert_message(message: Message, i: int) -> ChatMessage:
    param = f"messages[{i}]"
    content: str | tuple[ContentPart, ...] | None
    if isinstance(message.content, list):
        content = convert_parts(message.content, f"{param}.content")
    else:
        content = message.content
    calls = []
    for k, call in enumerate(message.tool_calls or ()):
        args = call.function.arguments
        text = json_text(args) if isinstance(args, dict) else json_object_text(
            args, param=f"{param}.tool_calls[{k}].function.arguments")
        calls.append(ToolCall(id=call.id, name=call.function.name, arguments_json=text))
    reasoning = message.reasoning_content if message.reasoning_content is not None \
        else message.reasoning
    return ChatMessage(role=message.role, content=content, name=message.name or "",
                       tool_calls=tuple(calls), tool_call_id=message.tool_call_id or "",
                       reasoning_content=reasoning)


def convert_tools(tools: list[Tool] | None) -> tuple[ToolDefinition, ...]:
    return tuple(ToolDefinition(name=t.function.name, description=t.function.description or "",
                                parameters_json=json_text(t.function.parameters)
                                if t.function.parameters is not None else "",
                                strict=t.function.strict)
                 for t in tools or ())


def convert_tool_choice(choice: str | NamedToolChoice | None, tools: tuple[ToolDefinition, ...],
                        parallel: bool | None) -> ToolChoice:
    if choice is None:
        return ToolChoice(ToolChoiceMode.AUTO, parallel_tool_calls=parallel)
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in {t.name for t in tools}:
            raise ValidationError(f"tool_choice names {name!r}, which is not in tools",
                                  param="tool_choice")
        return ToolChoice(ToolChoiceMode.FUNCTION, name, parallel)
    mode = ToolChoiceMode(choice)
    if mode is ToolChoiceMode.REQUIRED and not tools:
        raise ValidationError("tool_choice 'required' needs tools", param="tool_choice")
    return ToolChoice(mode, parallel_tool_calls=parallel)


def template_kwargs(explicit: dict[str, Any] | None, reasoning_effort: str | None) -> str:
    """chat_template_kwargs JSON; `reasoning_effort` is passed to the template too (and
    "none" turns thinking off) unless the caller set those keys explicitly."""
    kwargs = dict(explicit or {})
    if reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", reasoning_effort)
        if reasoning_effort == "none":
            kwargs.setdefault("enable_thinking", False)
    return json_text(kwargs) if kwargs else ""


class ChatCompletionRequest(SamplingFields):
    model: str = ""
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatIn | None = None
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    max_tokens: PositiveUInt32 | None = None
    max_completion_tokens: PositiveUInt32 | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    reasoning_effort: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    documents: list[dict[str, Any]] | None = None
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    include_reasoning: bool = True
    separate_reasoning: bool | None = None
    stream_reasoning: bool = True

    def response_format_domain(self) -> ResponseFormat:
        so = self.structured_outputs
        schema = self.guided_json if self.guided_json is not None else (so.json_ if so else None)
        if so is not None:
            for name in ("regex", "choice", "grammar", "structural_tag"):
                if getattr(so, name) is not None:
                    raise UnsupportedError(f"structured_outputs.{name} is not supported; use "
                                           "json", param=f"structured_outputs.{name}")
        if schema is not None:
            text = schema if isinstance(schema, str) else json_text(schema)
            return ResponseFormat(ResponseFormatType.JSON_SCHEMA, schema_json=text)
        if so is not None and so.json_object:
            return ResponseFormat(ResponseFormatType.JSON_OBJECT)
        rf = self.response_format
        if rf is None or rf.type == "text":
            return ResponseFormat()
        if rf.type == "json_object":
            return ResponseFormat(ResponseFormatType.JSON_OBJECT)
        if rf.json_schema is None:
            raise ValidationError("response_format json_schema needs a json_schema object",
                                  param="response_format.json_schema")
        spec = rf.json_schema
        return ResponseFormat(ResponseFormatType.JSON_SCHEMA,
                              schema_json=json_text(spec.schema_ or {}), name=spec.name,
                              strict=bool(spec.strict))

    def to_generation(self, request_id: str) -> GenerationRequest:
        if self.chat_template:
            raise UnsupportedError("a per-request chat_template is not supported; the model's "
                                   "template is fixed by its core", param="chat_template")
        if self.top_logprobs and not self.logprobs:
            raise ValidationError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValidationError("continue_final_message and add_generation_prompt cannot "
                                  "both be true", param="continue_final_message")
        tools = convert_tools(self.tools)
        chat = ChatInput(
            messages=tuple(convert_message(m, i) for i, m in enumerate(self.messages)),
            tools=tools,
            tool_choice=convert_tool_choice(self.tool_choice, tools, self.parallel_tool_calls),
            add_generation_prompt=False if self.continue_final_message
            else self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            chat_template_kwargs_json=template_kwargs(self.chat_template_kwargs,
                                                      self.reasoning_effort),
            documents_json=json_text(self.documents) if self.documents else "")
        max_tokens = self.max_completion_tokens or self.max_tokens
        return GenerationRequest(
            request_id=request_id, model=self.model, input=chat,
            sampling=self.sampling(max_tokens=max_tokens, logprobs=bool(self.logprobs),
                                   top_logprobs=self.top_logprobs or 0),
            stop=self.stop_strings(), include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens, n=self.n,
            response_format=self.response_format_domain(),
            parse_reasoning=self.separate_reasoning,
            continuous_usage=self.continuous_usage, priority=self.priority,
            parse_tool_calls=False if chat.tool_choice.mode is ToolChoiceMode.NONE else None)
