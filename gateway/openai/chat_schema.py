"""POST /v1/chat/completions request body (OpenAI + vLLM/SGLang extensions) -> GenerateRequest."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from gateway.images import image_from_url
from gateway.openai.sampling import SamplingFields
from gateway.openai.shared_schema import (
    ImageDetail,
    RefusalPart,
    ToolChoiceName,
    openai_tool_choice,
)
from gateway.request_parts import (
    JSON_OBJECT_FORMAT,
    convert_parts,
    json_schema_format,
    tool_call_parsing,
)
from gateway.schema import ApiModel, ModelName, PositiveUInt32, json_object_text
from services.common.api import chat as domain
from services.common.api.generate import GenerateRequest, ResponseFormat, ResponseFormatType
from services.common.api.json_values import json_text
from services.common.errors import UnsupportedError, ValidationError


class TextPart(ApiModel):
    type: Literal["text"]
    text: str

    def to_part(self, param: str) -> domain.ContentPart:
        return domain.TextPart(self.text)


class ImageUrl(ApiModel):
    url: str
    detail: ImageDetail = None


class ImagePart(ApiModel):
    type: Literal["image_url"]
    image_url: ImageUrl

    def to_part(self, param: str) -> domain.ContentPart:
        return image_from_url(self.image_url.url, detail=self.image_url.detail or "",
                              param=f"{param}.image_url.url")


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

    def definition(self) -> domain.ToolDefinition:
        f = self.function
        return domain.ToolDefinition(name=f.name, description=f.description or "",
                                     parameters=f.parameters, strict=f.strict)


class NamedFunction(ApiModel):
    name: str = Field(min_length=1)


class NamedToolChoice(ApiModel):
    type: Literal["function"] = "function"
    function: NamedFunction

    @property
    def function_name(self) -> str:
        return self.function.name


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


def convert_message(message: Message, i: int) -> domain.ChatMessage:
    param = f"messages[{i}]"
    content: domain.Content
    if isinstance(message.content, list):
        content = convert_parts(message.content, f"{param}.content")
    else:
        content = message.content
    calls = []
    for k, call in enumerate(message.tool_calls or ()):
        args = call.function.arguments
        text = json_text(args) if isinstance(args, dict) else json_object_text(
            args, param=f"{param}.tool_calls[{k}].function.arguments")
        calls.append(domain.ToolCall(id=call.id, name=call.function.name, arguments_json=text))
    reasoning = message.reasoning_content if message.reasoning_content is not None \
        else message.reasoning
    return domain.ChatMessage(role=message.role, content=content, name=message.name or "",
                            tool_calls=tuple(calls), tool_call_id=message.tool_call_id or "",
                            reasoning_content=reasoning)


def template_kwargs(explicit: dict[str, Any] | None, reasoning_effort: str | None
                    ) -> dict[str, Any]:
    """chat_template_kwargs; `reasoning_effort` is passed to the template too (and "none"
    turns thinking off) unless the caller set those keys explicitly."""
    kwargs = dict(explicit or {})
    if reasoning_effort is not None:
        kwargs.setdefault("reasoning_effort", reasoning_effort)
        if reasoning_effort == "none":
            kwargs.setdefault("enable_thinking", False)
    return kwargs


class ChatCompletionRequest(SamplingFields):
    model: ModelName = ""
    messages: list[Message] = Field(min_length=1)
    tools: list[Tool] | None = None
    tool_choice: ToolChoiceName | NamedToolChoice | None = None
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
            if so.structural_tag is not None:
                raise UnsupportedError("structured_outputs.structural_tag is not supported; "
                                       "use json, regex, choice or grammar",
                                       param="structured_outputs.structural_tag")
            given = [name for name in ("json_", "json_object", "regex", "choice", "grammar")
                     if getattr(so, name) not in (None, False)]
            if len(given) > 1:
                raise ValidationError("structured_outputs takes one of json, json_object, "
                                      "regex, choice and grammar",
                                      param="structured_outputs")
            if so.regex is not None:
                return ResponseFormat(ResponseFormatType.REGEX, pattern=so.regex)
            if so.choice is not None:
                return ResponseFormat(ResponseFormatType.CHOICE, choices=tuple(so.choice))
            if so.grammar is not None:
                return ResponseFormat(ResponseFormatType.GRAMMAR, grammar=so.grammar)
        if schema is not None:
            return json_schema_format(schema)
        if so is not None and so.json_object:
            return JSON_OBJECT_FORMAT
        rf = self.response_format
        if rf is None or rf.type == "text":
            return ResponseFormat()
        if rf.type == "json_object":
            return JSON_OBJECT_FORMAT
        if rf.json_schema is None:
            raise ValidationError("response_format json_schema needs a json_schema object",
                                  param="response_format.json_schema")
        spec = rf.json_schema
        return json_schema_format(spec.schema_ or {}, name=spec.name, strict=bool(spec.strict))

    def to_generation(self, request_id: str) -> GenerateRequest:
        if self.chat_template:
            raise UnsupportedError("a per-request chat_template is not supported; the model's "
                                   "template is fixed by its core", param="chat_template")
        if self.top_logprobs and not self.logprobs:
            raise ValidationError("top_logprobs needs logprobs: true", param="top_logprobs")
        if self.continue_final_message and self.add_generation_prompt:
            raise ValidationError("continue_final_message and add_generation_prompt cannot "
                                  "both be true", param="continue_final_message")
        tools = tuple(tool.definition() for tool in self.tools or ())
        chat = domain.ChatInput(
            messages=tuple(convert_message(m, i) for i, m in enumerate(self.messages)),
            tools=tools,
            tool_choice=openai_tool_choice(self.tool_choice, tools, self.parallel_tool_calls),
            add_generation_prompt=False if self.continue_final_message
            else self.add_generation_prompt,
            continue_final_message=self.continue_final_message,
            template_kwargs=template_kwargs(self.chat_template_kwargs, self.reasoning_effort),
            documents=list(self.documents) if self.documents else None)
        max_tokens = self.max_completion_tokens or self.max_tokens
        return GenerateRequest(
            request_id=request_id, model=self.model, input=chat,
            sampling=self.sampling(max_tokens=max_tokens, logprobs=bool(self.logprobs),
                                   top_logprobs=self.top_logprobs or 0),
            stop=self.stop_strings(), include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens, n=self.n,
            response_format=self.response_format_domain(),
            parse_reasoning=self.separate_reasoning,
            continuous_usage=self.continuous_usage, priority=self.priority,
            parse_tool_calls=tool_call_parsing(chat), prompt_logprobs=self.prompt_logprobs,
            cache_salt=self.cache_salt or "")
