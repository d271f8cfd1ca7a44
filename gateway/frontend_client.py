"""The gateway's only door to the frontend: domain objects in, domain objects out.

This is the one gateway module that imports `frontend_pb2`. Requests (`gateway.domain`) become
protobuf here; streamed `GenerateEvent`s become `gateway.events`; gRPC failures become the typed
`HeliosError` they carry (`services.common.grpc_errors.error_from_rpc`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from gateway.domain import (
    ChatInput,
    ChatMessage,
    CompletionInput,
    ContentPart,
    GenerationRequest,
    ModelCard,
    ResponseFormatType,
    Sampling,
    ToolChoiceMode,
)
from gateway.events import (
    Finish,
    FinishReason,
    GenerationEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    UsageReport,
)
from services.common.grpc_errors import error_from_rpc
from services.common.pb import common_pb2, frontend_pb2, frontend_pb2_grpc

UNARY_TIMEOUT_S = 60.0

_TOOL_CHOICE = {
    ToolChoiceMode.AUTO: frontend_pb2.TOOL_CHOICE_MODE_AUTO,
    ToolChoiceMode.NONE: frontend_pb2.TOOL_CHOICE_MODE_NONE,
    ToolChoiceMode.REQUIRED: frontend_pb2.TOOL_CHOICE_MODE_REQUIRED,
    ToolChoiceMode.FUNCTION: frontend_pb2.TOOL_CHOICE_MODE_FUNCTION,
}
_RESPONSE_FORMAT = {
    ResponseFormatType.TEXT: frontend_pb2.RESPONSE_FORMAT_TYPE_TEXT,
    ResponseFormatType.JSON_OBJECT: frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_OBJECT,
    ResponseFormatType.JSON_SCHEMA: frontend_pb2.RESPONSE_FORMAT_TYPE_JSON_SCHEMA,
}
_FINISH = {
    common_pb2.FINISH_REASON_UNSPECIFIED: FinishReason.STOP,
    common_pb2.FINISH_REASON_STOP: FinishReason.STOP,
    common_pb2.FINISH_REASON_LENGTH: FinishReason.LENGTH,
    common_pb2.FINISH_REASON_STOP_STRING: FinishReason.STOP_STRING,
    common_pb2.FINISH_REASON_TOOL_CALLS: FinishReason.TOOL_CALLS,
    common_pb2.FINISH_REASON_CANCELLED: FinishReason.CANCELLED,
    common_pb2.FINISH_REASON_ERROR: FinishReason.ERROR,
}


# ---------------------------------------------------------------------------------------------
# domain -> protobuf

def _content_part_pb(part: ContentPart) -> frontend_pb2.ContentPart:
    if part.image is not None:
        image = part.image
        return frontend_pb2.ContentPart(image=frontend_pb2.ImageInput(
            url=image.url, data=image.data, media_type=image.media_type, detail=image.detail))
    return frontend_pb2.ContentPart(text=part.text or "")


def _message_pb(message: ChatMessage) -> frontend_pb2.ChatMessage:
    pb = frontend_pb2.ChatMessage(role=message.role, name=message.name,
                                  tool_call_id=message.tool_call_id)
    if isinstance(message.content, str):
        pb.text = message.content
    elif message.content is not None:
        pb.parts.parts.extend(_content_part_pb(p) for p in message.content)
    elif message.role == "assistant":
        # A tool-call-only turn (OpenAI content null, Anthropic tool_use blocks only): templates
        # such as Qwen3's read message.content as a string and fail on a missing one, in
        # transformers too; "" renders the same where null works (vLLM sends "" as well).
        pb.text = ""
    for call in message.tool_calls:
        pb.tool_calls.append(frontend_pb2.ToolCall(id=call.id, type=call.type, name=call.name,
                                                   arguments_json=call.arguments_json))
    if message.reasoning_content is not None:
        pb.reasoning_content = message.reasoning_content
    return pb


def chat_input_pb(chat: ChatInput) -> frontend_pb2.ChatInput:
    pb = frontend_pb2.ChatInput(
        messages=[_message_pb(m) for m in chat.messages],
        tools=[frontend_pb2.ToolDefinition(type=t.type, name=t.name, description=t.description,
                                           parameters_json=t.parameters_json,
                                           **({"strict": t.strict} if t.strict is not None else {}))
               for t in chat.tools],
        tool_choice=frontend_pb2.ToolChoice(mode=_TOOL_CHOICE[chat.tool_choice.mode],
                                            function_name=chat.tool_choice.function_name),
        continue_final_message=chat.continue_final_message,
        chat_template_kwargs_json=chat.chat_template_kwargs_json,
        documents_json=chat.documents_json,
    )
    if chat.tool_choice.parallel_tool_calls is not None:
        pb.tool_choice.parallel_tool_calls = chat.tool_choice.parallel_tool_calls
    if chat.add_generation_prompt is not None:
        pb.add_generation_prompt = chat.add_generation_prompt
    return pb


def _sampling_pb(sampling: Sampling) -> common_pb2.SamplingParams:
    pb = common_pb2.SamplingParams(
        min_tokens=sampling.min_tokens, ignore_eos=sampling.ignore_eos,
        stop_token_ids=list(sampling.stop_token_ids), logprobs=sampling.logprobs,
        top_logprobs=sampling.top_logprobs)
    for name in ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "max_tokens"):
        value = getattr(sampling, name)
        if value is not None:
            setattr(pb, name, value)
    if sampling.seed is not None:
        pb.seed = sampling.seed % (1 << 64)  # OpenAI seeds may be negative int64
    for token_id, bias in sampling.logit_bias:
        pb.logit_bias[token_id] = bias
    return pb


def generate_request_pb(request: GenerationRequest) -> frontend_pb2.GenerateRequest:
    pb = frontend_pb2.GenerateRequest(
        request_id=request.request_id, model=request.model,
        sampling=_sampling_pb(request.sampling), stop=list(request.stop),
        include_stop_str_in_output=request.include_stop_str_in_output,
        response_format=frontend_pb2.ResponseFormat(
            type=_RESPONSE_FORMAT[request.response_format.type],
            schema_json=request.response_format.schema_json,
            name=request.response_format.name, strict=request.response_format.strict),
        continuous_usage=request.continuous_usage, priority=request.priority)
    if isinstance(request.input, ChatInput):
        pb.chat.CopyFrom(chat_input_pb(request.input))
    else:
        pb.completion.CopyFrom(_completion_pb(request.input))
    for name in ("skip_special_tokens", "spaces_between_special_tokens", "n",
                 "parse_reasoning", "parse_tool_calls"):
        value = getattr(request, name)
        if value is not None:
            setattr(pb, name, value)
    return pb


def _completion_pb(completion: CompletionInput) -> frontend_pb2.CompletionInput:
    pb = frontend_pb2.CompletionInput(echo=completion.echo)
    if completion.token_ids is not None:
        pb.token_ids.ids.extend(completion.token_ids)
    else:
        pb.text = completion.text or ""
    return pb


# ---------------------------------------------------------------------------------------------
# protobuf -> domain

def _usage(pb: common_pb2.Usage) -> Usage:
    return Usage(prompt_tokens=pb.prompt_tokens, completion_tokens=pb.completion_tokens,
                 cached_tokens=pb.cached_tokens, reasoning_tokens=pb.reasoning_tokens)


def _logprobs(pb: frontend_pb2.GenerateEvent) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(token_id=lp.token_id, token=lp.token, token_bytes=lp.token_bytes,
                     logprob=lp.logprob,
                     top=tuple(TopLogprob(token_id=t.token_id, token=t.token,
                                          token_bytes=t.token_bytes, logprob=t.logprob)
                               for t in lp.top))
        for lp in pb.logprobs)


def event_from_pb(pb: frontend_pb2.GenerateEvent) -> GenerationEvent:
    kind = pb.WhichOneof("event")
    so_far = _usage(pb.usage_so_far) if pb.HasField("usage_so_far") else None
    if kind == "text":
        return TextDelta(pb.index, pb.text.text, _logprobs(pb), so_far)
    if kind == "reasoning":
        return ReasoningDelta(pb.index, pb.reasoning.text, _logprobs(pb), so_far)
    if kind == "tool_call":
        call = pb.tool_call
        return ToolCallDelta(pb.index, call.tool_index, call.id, call.type, call.name,
                             call.arguments, _logprobs(pb), so_far)
    if kind == "finish":
        finish = pb.finish
        return Finish(pb.index, _FINISH.get(finish.reason, FinishReason.STOP),
                      finish.stop_sequence,
                      finish.stop_token_id if finish.HasField("stop_token_id") else None, so_far)
    if kind == "started":
        s = pb.started
        return Started(pb.index, s.request_id, s.model, s.prompt_tokens, s.cached_tokens,
                       s.prompt_text)
    if kind == "usage":
        return UsageReport(_usage(pb.usage), pb.index)
    # An empty event (an unknown field from a newer frontend): keep the stream going.
    return TextDelta(pb.index, "", _logprobs(pb), so_far)


def _card(pb: frontend_pb2.ModelCard) -> ModelCard:
    caps = pb.capabilities
    return ModelCard(
        id=pb.id, aliases=tuple(pb.aliases), root=pb.root, max_model_len=pb.max_model_len,
        tools=caps.tools, vision=caps.vision, reasoning=caps.reasoning, created=pb.created,
        owned_by=pb.owned_by or "helios", architecture=pb.architecture, family=pb.family,
        num_parameters=pb.num_parameters, dtype=pb.dtype, size_bytes=pb.size_bytes,
        digest=pb.digest, chat_template=pb.chat_template)


# ---------------------------------------------------------------------------------------------
# the client

class GenerateCall:
    """One running `Frontend.Generate`: iterate for events; `cancel()` cancels the RPC (and so
    the engine request behind it)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call

    async def events(self) -> AsyncIterator[GenerationEvent]:
        try:
            async for pb in self._call:
                yield event_from_pb(pb)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc

    def cancel(self) -> bool:
        return self._call.cancel()

    def done(self) -> bool:
        return self._call.done()


class FrontendClient:
    """Typed async calls to the frontend over one shared channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = frontend_pb2_grpc.FrontendStub(channel)

    @staticmethod
    def _metadata(request_id: str) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", request_id),) if request_id else ()

    def generate(self, request: GenerationRequest, *, trace_id: str = "") -> GenerateCall:
        call = self._stub.Generate(generate_request_pb(request),
                                   metadata=self._metadata(trace_id))
        return GenerateCall(call)

    async def _unary(self, method, request, trace_id: str):
        try:
            return await method(request, timeout=UNARY_TIMEOUT_S,
                                metadata=self._metadata(trace_id))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc

    async def list_models(self, *, trace_id: str = "") -> list[ModelCard]:
        response = await self._unary(self._stub.ListModels, frontend_pb2.ListModelsRequest(),
                                     trace_id)
        return [_card(card) for card in response.models]

    async def count_tokens(self, model: str, chat: ChatInput | None = None, text: str = "",
                           *, trace_id: str = "") -> int:
        request = frontend_pb2.CountTokensRequest(model=model)
        if chat is not None:
            request.chat.CopyFrom(chat_input_pb(chat))
        else:
            request.text = text
        response = await self._unary(self._stub.CountTokens, request, trace_id)
        return response.input_tokens

    async def tokenize(self, model: str, chat: ChatInput | None = None, text: str = "",
                       *, add_special_tokens: bool | None = None,
                       trace_id: str = "") -> list[int]:
        request = frontend_pb2.TokenizeRequest(model=model)
        if chat is not None:
            request.chat.CopyFrom(chat_input_pb(chat))
        else:
            request.text = text
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        response = await self._unary(self._stub.Tokenize, request, trace_id)
        return list(response.token_ids)

    async def detokenize(self, model: str, token_ids: list[int], *,
                         trace_id: str = "") -> str:
        request = frontend_pb2.DetokenizeRequest(model=model, token_ids=token_ids)
        response = await self._unary(self._stub.Detokenize, request, trace_id)
        return response.text
