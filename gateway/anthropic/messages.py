"""POST /v1/messages (streamed or not) and /v1/messages/count_tokens.

Stream order, as the Anthropic SDK checks it: `message_start` (content [], a real
input_tokens), `ping`s anywhere (also as keep-alives), per block `content_block_start` /
`content_block_delta`* / `content_block_stop` with index = the block's position, then
`message_delta` (stop_reason, cumulative usage) and `message_stop`. Every frame has an
`event:` line (the SDK drops frames without one). A failure after the start is
`event: error` with the Anthropic error body, and no `message_stop` follows.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.anthropic.schema import CountTokensRequest, MessagesRequest, ThinkingBlock
from gateway.anthropic.signature import ThinkingSigner, thinking_signer
from gateway.collector import Collector
from gateway.errors import anthropic_error_object
from gateway.generation import KEEPALIVE, EventStream
from gateway.openai.format import new_id
from gateway.request_parts import tool_call_parsing
from gateway.sse import event_stream, sse_event, start_generation, stream_failure
from gateway.state import GatewayState, gateway_state, request_id
from services.common.api.events import (
    Finish,
    FinishReason,
    GenerationEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCallDelta,
    Usage,
    UsageReport,
)
from services.common.api.generate import GenerateRequest, Sampling
from services.common.errors import HeliosError, ValidationError

router = APIRouter()


def stop_reason(finish: Finish | None, has_tool_calls: bool) -> tuple[str, str | None]:
    reason = finish.reason if finish else FinishReason.STOP
    if reason is FinishReason.TOOL_CALLS or (has_tool_calls and reason is FinishReason.STOP):
        return "tool_use", None
    if reason is FinishReason.LENGTH:
        return "max_tokens", None
    if reason is FinishReason.STOP_STRING and finish is not None:
        return "stop_sequence", finish.stop_sequence or None
    return "end_turn", None


def usage_object(usage: Usage) -> dict[str, Any]:
    """Anthropic's split: input_tokens + cache_read_input_tokens = the prompt. The last prompt
    token is always computed (its logits start the output), so it counts as input even when
    the prefix cache held the whole prompt."""
    cached = min(usage.cached_tokens, max(0, usage.prompt_tokens - 1))
    fields = {"input_tokens": usage.prompt_tokens - cached,
              "output_tokens": usage.completion_tokens,
              "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": cached}
    if usage.cached_tokens_host:      # of the cache reads, the engine's host-memory tier's
        fields["cache_read_input_tokens_host"] = min(usage.cached_tokens_host, cached)
    return fields


def check_signatures(body: MessagesRequest, signer: ThinkingSigner) -> None:
    """A thinking block sent back with a signature must carry the one Helios gave it."""
    for i, message in enumerate(body.messages):
        if isinstance(message.content, str):
            continue
        for j, block in enumerate(message.content):
            if isinstance(block, ThinkingBlock) and block.signature and \
                    not signer.verify(block.thinking, block.signature):
                raise ValidationError("Invalid `signature` in `thinking` block: it does not "
                                      "match the thinking text (or was issued under another "
                                      "key)", param=f"messages[{i}].content[{j}].signature")


def to_generation(body: MessagesRequest, message_id: str) -> GenerateRequest:
    body.check_thinking()
    chat = body.generation_chat()
    return GenerateRequest(
        request_id=message_id, model=body.model, input=chat,
        response_format=body.response_format(),
        sampling=Sampling(temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
                          max_tokens=body.max_tokens),
        stop=tuple(s for s in body.stop_sequences or () if s),
        parse_reasoning=None if body.thinking is None else body.thinking.type != "disabled",
        parse_tool_calls=tool_call_parsing(chat), cache_salt=body.cache_salt or "")


@router.post("/v1/messages", tags=["anthropic"])
async def create_message(request: Request, body: MessagesRequest):
    message_id = new_id("msg_")
    state = gateway_state(request)
    signer = thinking_signer(state.config.thinking_signature_key)
    check_signatures(body, signer)
    stream = await start_generation(request, [to_generation(body, message_id)],
                                    wait_first=bool(body.stream))
    if body.stream:
        return event_stream(MessageStream(state, body, message_id, signer).render(stream))
    return JSONResponse(whole_message(await stream.collect(), body, message_id, signer))


@router.post("/v1/messages/count_tokens", tags=["anthropic"])
async def count_tokens(request: Request, body: CountTokensRequest) -> dict[str, int]:
    state = gateway_state(request)
    count = await state.frontend.count_tokens(body.model, chat=body.chat_input(),
                                              trace_id=request_id(request))
    return {"input_tokens": count}


def whole_message(collector: Collector, body: MessagesRequest, message_id: str,
                  signer: ThinkingSigner) -> dict[str, Any]:
    choice = collector.choice(0)
    content: list[dict[str, Any]] = []
    if choice.reasoning:
        content.append({"type": "thinking", "thinking": choice.reasoning,
                        "signature": signer.sign(choice.reasoning)})
    if choice.text or not choice.tool_calls:
        content.append({"type": "text", "text": choice.text})
    for call in choice.tool_calls:
        content.append({"type": "tool_use", "id": call.id or new_id("toolu_"),
                        "name": call.name, "input": call.arguments_object()})
    reason, sequence = stop_reason(choice.finish, bool(choice.tool_calls))
    started = collector.started
    return {"id": message_id, "type": "message", "role": "assistant",
            "model": started.model if started and started.model else body.model,
            "content": content, "stop_reason": reason, "stop_sequence": sequence,
            "usage": usage_object(collector.final_usage())}


class MessageStream:
    """Renders one request's events as Anthropic stream events."""

    def __init__(self, state: GatewayState, body: MessagesRequest, message_id: str,
                 signer: ThinkingSigner) -> None:
        self.state = state
        self.body = body
        self.id = message_id
        self.signer = signer
        self.thinking = ""                    # the open thinking block's text (to sign)
        self.blocks = 0                       # blocks opened so far (next index)
        self.open: str | None = None          # "text" | "thinking" | "tool_use"
        self.open_tool: int | None = None
        self.has_tool_calls = False
        self.finish: Finish | None = None
        self.started = False

    def frame(self, kind: str, **fields: Any) -> bytes:
        return sse_event(kind, {"type": kind, **fields})

    def message_start(self, event: Started) -> bytes:
        usage = usage_object(Usage(prompt_tokens=event.prompt_tokens,
                                   cached_tokens=event.cached_tokens))
        self.started = True
        return self.frame("message_start", message={
            "id": self.id, "type": "message", "role": "assistant",
            "model": event.model or self.body.model, "content": [], "stop_reason": None,
            "stop_sequence": None, "usage": {**usage, "output_tokens": 0}})

    def close_block(self) -> list[bytes]:
        if self.open is None:
            return []
        frames = []
        if self.open == "thinking":   # the signature arrives last, as Anthropic sends it
            frames.append(self.delta({"type": "signature_delta",
                                      "signature": self.signer.sign(self.thinking)}))
            self.thinking = ""
        self.open = None
        self.open_tool = None
        return [*frames, self.frame("content_block_stop", index=self.blocks - 1)]

    def open_block(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        frames = self.close_block()
        self.open = kind
        self.blocks += 1
        return [*frames, self.frame("content_block_start", index=self.blocks - 1, content_block=block)]

    def delta(self, delta: dict[str, Any]) -> bytes:
        return self.frame("content_block_delta", index=self.blocks - 1, delta=delta)

    def frames(self, event: GenerationEvent) -> list[bytes]:
        if isinstance(event, Started):
            return [] if self.started else [self.message_start(event), self.frame("ping")]
        frames: list[bytes] = []
        if not self.started:   # a frontend that sent no `started` first
            frames += [self.message_start(Started(0, "", self.body.model, 0)),
                       self.frame("ping")]
        if getattr(event, "index", 0) != 0:
            return frames
        if isinstance(event, TextDelta) and event.text:
            if self.open != "text":
                frames += self.open_block("text", {"type": "text", "text": ""})
            frames.append(self.delta({"type": "text_delta", "text": event.text}))
        elif isinstance(event, ReasoningDelta) and event.text:
            if self.open != "thinking":
                frames += self.open_block("thinking", {"type": "thinking", "thinking": "",
                                                       "signature": ""})
            self.thinking += event.text
            frames.append(self.delta({"type": "thinking_delta", "thinking": event.text}))
        elif isinstance(event, ToolCallDelta):
            self.has_tool_calls = True
            if self.open != "tool_use" or self.open_tool != event.tool_index:
                frames += self.open_block("tool_use", {
                    "type": "tool_use", "id": event.id or new_id("toolu_"),
                    "name": event.name, "input": {}})
                self.open_tool = event.tool_index
            if event.arguments:
                frames.append(self.delta({"type": "input_json_delta",
                                          "partial_json": event.arguments}))
        elif isinstance(event, Finish):
            self.finish = event
            frames += self.close_block()
        elif isinstance(event, UsageReport):
            frames += self.close_block()
            reason, sequence = stop_reason(self.finish, self.has_tool_calls)
            usage = usage_object(event.usage)
            frames += [self.frame("message_delta",
                                  delta={"stop_reason": reason, "stop_sequence": sequence},
                                  usage=usage),
                       self.frame("message_stop")]
        return frames

    async def render(self, stream: EventStream) -> AsyncIterator[bytes]:
        try:
            async for event in stream.events(self.state.config.sse_keepalive_s):
                if event is KEEPALIVE:
                    yield self.frame("ping")
                    continue
                for frame in self.frames(event):  # type: ignore[arg-type]
                    yield frame
        except HeliosError as exc:
            error = stream_failure(self.state, exc)
            yield sse_event("error", {"type": "error", "error": anthropic_error_object(error)})
        finally:
            await stream.close()
