"""Incoming protobuf -> frontend domain objects (requests from the gateway).

With `convert_out.py` (events and responses) and `convert_upstream.py` (engine and imageprep
messages), the only frontend modules besides server.py that import generated stubs.

Requests are validated while converting: every rejected field raises ValidationError naming
it (`messages[2].tool_calls[0].arguments`). JSON text fields are parsed strictly (no NaN or
Infinity) with key order kept.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.errors import ValidationError
from services.common.pb import common_pb2, frontend_pb2
from services.frontend.chat.types import (
    ChatInput,
    ChatMessage,
    ContentPart,
    ImagePart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.frontend.generate.types import (
    CompletionInput,
    GenerateRequest,
    ResponseFormatType,
    Sampling,
)

_TOOL_CHOICE = {
    frontend_pb2.TOOL_CHOICE_MODE_AUTO: ToolChoiceMode.AUTO,
    frontend_pb2.TOOL_CHOICE_MODE_NONE: ToolChoiceMode.NONE,
    frontend_pb2.TOOL_CHOICE_MODE_REQUIRED: ToolChoiceMode.REQUIRED,
    frontend_pb2.TOOL_CHOICE_MODE_FUNCTION: ToolChoiceMode.FUNCTION,
}


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_json(text: str, *, param: str) -> Any:
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise ValidationError(f"{param} is not valid JSON: {exc}", param=param) from exc


def parse_json_object(text: str, *, param: str, what: str = "") -> dict[str, Any]:
    value = parse_json(text, param=param)
    if not isinstance(value, dict):
        raise ValidationError(
            f"{what or param} must be a JSON object, got {type(value).__name__}: "
            f"{text[:80]!r}", param=param)
    return value


# ---------------------------------------------------------------------------------------------
# Chat input


def _content(message: frontend_pb2.ChatMessage, where: str) -> Any:
    kind = message.WhichOneof("content")
    if kind == "text":
        return message.text
    if kind is None:
        return None
    parts: list[ContentPart] = []
    for index, part in enumerate(message.parts.parts):
        which = part.WhichOneof("part")
        if which == "text":
            parts.append(TextPart(part.text))
        elif which == "image":
            image = part.image
            if not image.url and not image.data:
                raise ValidationError(f"{where}.content[{index}]: an image needs a url or data",
                                      param=f"{where}.content[{index}]")
            parts.append(ImagePart(image.url, image.data, image.media_type, image.detail))
        else:
            raise ValidationError(f"{where}.content[{index}] is empty",
                                  param=f"{where}.content[{index}]")
    return tuple(parts)


def _tool_call(call: frontend_pb2.ToolCall, where: str) -> ToolCall:
    if not call.name:
        raise ValidationError(f"{where}.name is required", param=f"{where}.name")
    text = call.arguments_json.strip()
    arguments = parse_json_object(text, param=f"{where}.arguments",
                                  what=f"the arguments of tool call {where}") if text else {}
    return ToolCall(call.id, call.type or "function", call.name, arguments)


def message_from_pb(message: frontend_pb2.ChatMessage, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not message.role:
        raise ValidationError(f"{where}.role is required", param=f"{where}.role")
    calls = tuple(_tool_call(call, f"{where}.tool_calls[{j}]")
                  for j, call in enumerate(message.tool_calls))
    return ChatMessage(
        role=message.role,
        content=_content(message, where),
        name=message.name,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        reasoning_content=(message.reasoning_content
                           if message.HasField("reasoning_content") else None),
    )


def _tool(tool: frontend_pb2.ToolDefinition, index: int) -> ToolDefinition:
    where = f"tools[{index}]"
    if not tool.name:
        raise ValidationError(f"{where}.name is required", param=f"{where}.name")
    parameters = (parse_json_object(tool.parameters_json, param=f"{where}.parameters")
                  if tool.parameters_json.strip() else None)
    return ToolDefinition(name=tool.name, type=tool.type or "function",
                          description=tool.description, parameters=parameters,
                          strict=tool.strict if tool.HasField("strict") else None)


def _tool_choice(choice: frontend_pb2.ToolChoice, tools: tuple[ToolDefinition, ...]
                 ) -> ToolChoice:
    mode = _TOOL_CHOICE.get(choice.mode)
    if mode is None:
        raise ValidationError(f"unknown tool_choice mode {choice.mode}", param="tool_choice")
    if mode is ToolChoiceMode.FUNCTION:
        if not choice.function_name:
            raise ValidationError("tool_choice names no function", param="tool_choice")
        if choice.function_name not in {tool.name for tool in tools}:
            raise ValidationError(f"tool_choice names {choice.function_name!r}, which is not "
                                  "among the tools", param="tool_choice")
    parallel = choice.parallel_tool_calls if choice.HasField("parallel_tool_calls") else True
    return ToolChoice(mode, choice.function_name, parallel)


def chat_from_pb(chat: frontend_pb2.ChatInput) -> ChatInput:
    if not chat.messages:
        raise ValidationError("messages must not be empty", param="messages")
    messages = tuple(message_from_pb(m, i) for i, m in enumerate(chat.messages))
    tools = tuple(_tool(t, i) for i, t in enumerate(chat.tools))
    kwargs = (parse_json_object(chat.chat_template_kwargs_json, param="chat_template_kwargs")
              if chat.chat_template_kwargs_json.strip() else {})
    documents = None
    if chat.documents_json.strip():
        documents = parse_json(chat.documents_json, param="documents")
        if not isinstance(documents, list):
            raise ValidationError("documents must be a JSON array", param="documents")
    return ChatInput(
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice(chat.tool_choice, tools),
        add_generation_prompt=(chat.add_generation_prompt
                               if chat.HasField("add_generation_prompt") else None),
        continue_final_message=chat.continue_final_message,
        template_kwargs=kwargs,
        documents=documents,
    )


# ---------------------------------------------------------------------------------------------
# Generate request

_RESPONSE_FORMAT = {
    frontend_pb2.RESPONSE_FORMAT_TYPE_TEXT: ResponseFormatType.TEXT,
    frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT: ResponseFormatType.JSON_OBJECT,
    frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA: ResponseFormatType.JSON_SCHEMA,
}


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


def sampling_from_pb(sampling: common_pb2.SamplingParams) -> Sampling:
    return Sampling(
        temperature=_optional(sampling, "temperature"),
        top_p=_optional(sampling, "top_p"),
        top_k=_optional(sampling, "top_k"),
        min_p=_optional(sampling, "min_p"),
        presence_penalty=_optional(sampling, "presence_penalty"),
        frequency_penalty=_optional(sampling, "frequency_penalty"),
        repetition_penalty=_optional(sampling, "repetition_penalty"),
        seed=_optional(sampling, "seed"),
        max_tokens=_optional(sampling, "max_tokens"),
        min_tokens=sampling.min_tokens,
        ignore_eos=sampling.ignore_eos,
        stop_token_ids=tuple(sampling.stop_token_ids),
        logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs,
        logit_bias=dict(sampling.logit_bias),
    )


def sampling_to_pb(sampling: Sampling) -> common_pb2.SamplingParams:
    message = common_pb2.SamplingParams(
        min_tokens=sampling.min_tokens, ignore_eos=sampling.ignore_eos,
        stop_token_ids=list(sampling.stop_token_ids), logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs)
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "seed", "max_tokens"):
        value = getattr(sampling, name)
        if value is not None:
            setattr(message, name, value)
    for token_id, bias in sampling.logit_bias.items():
        message.logit_bias[token_id] = bias
    return message


def generate_request_from_pb(request: frontend_pb2.GenerateRequest) -> GenerateRequest:
    which = request.WhichOneof("input")
    chat = chat_from_pb(request.chat) if which == "chat" else None
    completion = None
    if which == "completion":
        prompt = request.completion.WhichOneof("prompt")
        completion = CompletionInput(
            text=request.completion.text if prompt == "text" else None,
            token_ids=(tuple(request.completion.token_ids.ids) if prompt == "token_ids"
                       else None),
            echo=request.completion.echo)
        if prompt is None:
            raise ValidationError("the completion has no prompt", param="prompt")
    response_format = _RESPONSE_FORMAT.get(request.response_format.type)
    if response_format is None:
        raise ValidationError("unknown response_format type", param="response_format")
    return GenerateRequest(
        request_id=request.request_id,
        model=request.model,
        chat=chat,
        completion=completion,
        sampling=sampling_from_pb(request.sampling),
        stop=tuple(request.stop),
        include_stop_str_in_output=request.include_stop_str_in_output,
        skip_special_tokens=(request.skip_special_tokens
                             if request.HasField("skip_special_tokens") else True),
        n=request.n if request.HasField("n") else 1,
        response_format=response_format,
        parse_reasoning=_optional(request, "parse_reasoning"),
        parse_tool_calls=_optional(request, "parse_tool_calls"),
        continuous_usage=request.continuous_usage,
        priority=request.priority,
    )
