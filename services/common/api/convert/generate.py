"""Generate requests <-> `helios.v1.GenerateRequest` (and `SamplingParams`, which the frontend
also sends on to the engine)."""

from __future__ import annotations

from typing import Any

from services.common.api.chat import ChatInput, CompletionInput
from services.common.api.convert.chat import chat_input_from_pb, chat_input_to_pb
from services.common.api.convert.enums import enum_mapping
from services.common.api.generate import (
    GenerateRequest,
    ResponseFormat,
    ResponseFormatType,
    Sampling,
)
from services.common.errors import ValidationError
from services.common.pb import common_pb2, frontend_pb2

_RESPONSE_FORMAT = enum_mapping(ResponseFormatType, frontend_pb2.ResponseFormatType,
                                "RESPONSE_FORMAT_TYPE_")

# Sampling fields that are `optional` in the proto: unset stays unset.
_OPTIONAL_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                      "frequency_penalty", "repetition_penalty", "max_tokens")
# GenerateRequest fields that are `optional` in the proto.
_OPTIONAL_REQUEST = ("skip_special_tokens", "spaces_between_special_tokens", "n",
                     "parse_reasoning", "parse_tool_calls", "prompt_logprobs")


def _optional(message: Any, name: str) -> Any:
    return getattr(message, name) if message.HasField(name) else None


# ---------------------------------------------------------------------------------------------
# Sampling

def sampling_to_pb(sampling: Sampling) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(
        min_tokens=sampling.min_tokens, ignore_eos=sampling.ignore_eos,
        stop_token_ids=list(sampling.stop_token_ids), logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs)
    for name in _OPTIONAL_SAMPLING:
        value = getattr(sampling, name)
        if value is not None:
            setattr(pb, name, value)
    if sampling.seed is not None:
        pb.seed = sampling.seed % (1 << 64)  # OpenAI seeds may be negative int64
    for token_id, bias in sampling.logit_bias:
        pb.logit_bias[token_id] = bias
    return pb


def sampling_from_pb(pb: common_pb2.SamplingParams) -> Sampling:
    return Sampling(
        **{name: _optional(pb, name) for name in _OPTIONAL_SAMPLING},
        seed=_optional(pb, "seed"),
        min_tokens=pb.min_tokens,
        ignore_eos=pb.ignore_eos,
        stop_token_ids=tuple(pb.stop_token_ids),
        logprobs=pb.logprobs,
        top_logprobs=pb.top_logprobs,
        logit_bias=tuple(pb.logit_bias.items()),
    )


# ---------------------------------------------------------------------------------------------
# Completion input and response format

def completion_input_to_pb(completion: CompletionInput) -> frontend_pb2.CompletionInput:
    pb = frontend_pb2.CompletionInput(echo=completion.echo)
    if completion.token_ids is not None:
        pb.token_ids.ids.extend(completion.token_ids)
    else:
        pb.text = completion.text or ""
    return pb


def completion_input_from_pb(pb: frontend_pb2.CompletionInput) -> CompletionInput:
    prompt = pb.WhichOneof("prompt")
    if prompt is None:
        raise ValidationError("the completion has no prompt", param="prompt")
    return CompletionInput(
        text=pb.text if prompt == "text" else None,
        token_ids=tuple(pb.token_ids.ids) if prompt == "token_ids" else None,
        echo=pb.echo)


def response_format_to_pb(response_format: ResponseFormat) -> frontend_pb2.ResponseFormat:
    return frontend_pb2.ResponseFormat(
        type=_RESPONSE_FORMAT.to_pb[response_format.type],
        schema_json=response_format.schema_json, name=response_format.name,
        strict=response_format.strict, pattern=response_format.pattern,
        choices=list(response_format.choices), grammar=response_format.grammar)


def response_format_from_pb(pb: frontend_pb2.ResponseFormat) -> ResponseFormat:
    kind = _RESPONSE_FORMAT.from_pb.get(pb.type)
    if kind is None:
        raise ValidationError("unknown response_format type", param="response_format")
    return ResponseFormat(kind, pb.schema_json, pb.name, pb.strict, pb.pattern,
                          tuple(pb.choices), pb.grammar)


# ---------------------------------------------------------------------------------------------
# GenerateRequest

def generate_request_to_pb(request: GenerateRequest) -> frontend_pb2.GenerateRequest:
    pb = frontend_pb2.GenerateRequest(
        request_id=request.request_id, model=request.model,
        sampling=sampling_to_pb(request.sampling), stop=list(request.stop),
        include_stop_str_in_output=request.include_stop_str_in_output,
        response_format=response_format_to_pb(request.response_format),
        continuous_usage=request.continuous_usage, priority=request.priority,
        embed=request.embed, cache_salt=request.cache_salt)
    if isinstance(request.input, ChatInput):
        chat_input_to_pb(request.input, pb.chat)
    elif isinstance(request.input, CompletionInput):
        pb.completion.CopyFrom(completion_input_to_pb(request.input))
    for name in _OPTIONAL_REQUEST:
        value = getattr(request, name)
        if value is not None:
            setattr(pb, name, value)
    return pb


def generate_request_from_pb(pb: frontend_pb2.GenerateRequest) -> GenerateRequest:
    which = pb.WhichOneof("input")
    request_input: ChatInput | CompletionInput | None = None
    if which == "chat":
        request_input = chat_input_from_pb(pb.chat)
    elif which == "completion":
        request_input = completion_input_from_pb(pb.completion)
    return GenerateRequest(
        request_id=pb.request_id,
        model=pb.model,
        input=request_input,
        sampling=sampling_from_pb(pb.sampling),
        stop=tuple(pb.stop),
        include_stop_str_in_output=pb.include_stop_str_in_output,
        response_format=response_format_from_pb(pb.response_format),
        continuous_usage=pb.continuous_usage,
        priority=pb.priority,
        embed=pb.embed,
        cache_salt=pb.cache_salt,
        **{name: _optional(pb, name) for name in _OPTIONAL_REQUEST},
    )
