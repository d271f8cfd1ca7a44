"""POST /v1/chat/completions: chat.completion objects and chat.completion.chunk streams.

Stream: the first delta of each choice carries `role: "assistant"`; text goes in `content`,
reasoning in both `reasoning` and `reasoning_content`; tool calls stream as `{index, id, type,
function: {name, arguments: ""}}` then argument fragments; the last chunk of a choice carries
its `finish_reason`; with `stream_options.include_usage` every chunk has `usage: null` and one
extra chunk with `choices: []` carries the usage; `data: [DONE]` ends it. A failure after the
stream started is sent as `data: {"error": {...}}` (the OpenAI SDK raises APIError on it).
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request

from gateway.collector import Collector
from gateway.openai.chat_schema import ChatCompletionRequest
from gateway.openai.format import (
    chat_logprobs,
    finish_reason,
    new_id,
    now,
    prompt_logprobs_object,
    stop_reason,
    usage_object,
)
from gateway.openai.stream import ChunkStream, respond
from gateway.state import GatewayState, gateway_state
from services.common.api.events import (
    Finish,
    FinishReason,
    GenerationEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    ToolCallDelta,
    UsageReport,
)

router = APIRouter()


@router.post("/v1/chat/completions", tags=["openai"])
async def chat_completions(request: Request, body: ChatCompletionRequest):
    completion_id = new_id("chatcmpl-")
    generation = body.to_generation(completion_id)
    return await respond(request, [generation], streaming=body.streaming,
                         renderer=functools.partial(ChatStream, gateway_state(request), body,
                                                    completion_id))


def chat_completion(collector: Collector, body: ChatCompletionRequest,
                    completion_id: str) -> dict[str, Any]:
    choices = []
    for choice in collector.choices:
        reasoning = choice.reasoning if body.include_reasoning and choice.reasoning else None
        message: dict[str, Any] = {
            "role": "assistant",
            "content": choice.text if (choice.text or not choice.tool_calls) else None,
            "reasoning": reasoning, "reasoning_content": reasoning,
        }
        if choice.tool_calls:
            # a call cut off by the length limit keeps its arguments as generated (partial)
            cut_off = len(choice.tool_calls) - 1 \
                if choice.finish_reason is FinishReason.LENGTH else -1
            message["tool_calls"] = [
                {"id": call.id or new_id("call_"), "type": "function",
                 "function": {"name": call.name,
                              "arguments": call.arguments or ("" if k == cut_off else "{}")}}
                for k, call in enumerate(choice.tool_calls)]
        choices.append({
            "index": choice.index, "message": message,
            "logprobs": chat_logprobs(choice.logprobs, body.top_logprobs or 0)
            if body.logprobs else None,
            "finish_reason": finish_reason(choice.finish_reason, bool(choice.tool_calls)),
            "stop_reason": stop_reason(choice.finish, body.stop_token_ids),
        })
    started = collector.started
    response = {"id": completion_id, "object": "chat.completion", "created": now(),
                "model": (started.model if started and started.model else body.model),
                "choices": choices, "system_fingerprint": None,
                "usage": usage_object(collector.final_usage())}
    if body.prompt_logprobs is not None:     # vLLM: the rendered prompt's, on the response
        response["prompt_logprobs"] = prompt_logprobs_object(
            collector.prompt_logprobs.get(0), body.prompt_logprobs)
    return response


class ChatStream(ChunkStream):
    """Renders one request's events as chat.completion.chunk SSE frames."""

    object_type = "chat.completion.chunk"
    body: ChatCompletionRequest

    def __init__(self, state: GatewayState, body: ChatCompletionRequest, completion_id: str):
        super().__init__(state, body, completion_id)
        self.announced: set[int] = set()
        self.has_tool_calls: set[int] = set()
        self.held_reasoning: dict[int, str] = {}   # stream_reasoning=false buffers here

    def whole(self, collector: Collector) -> dict[str, Any]:
        return chat_completion(collector, self.body, self.id)

    def choice(self, index: int, delta: dict[str, Any], *, logprobs: Any = None,
               finish: Finish | None = None) -> dict[str, Any]:
        if index not in self.announced:
            self.announced.add(index)
            delta = {"role": "assistant", **delta}
        entry: dict[str, Any] = {"index": index, "delta": delta, "logprobs": logprobs,
                                 "finish_reason": None}
        if finish is not None:
            entry["finish_reason"] = finish_reason(finish.reason, index in self.has_tool_calls)
            entry["stop_reason"] = stop_reason(finish, self.body.stop_token_ids)
        return entry

    def _logprobs(self, event: TextDelta | ReasoningDelta | ToolCallDelta | Finish) -> Any:
        if not self.body.logprobs or not event.logprobs:
            return None
        return chat_logprobs(event.logprobs, self.body.top_logprobs or 0)

    def _usage_so_far(self, event: Any) -> Any:
        so_far = getattr(event, "usage_so_far", None)
        if self.body.continuous_usage and so_far is not None:
            return usage_object(so_far)
        return None

    def _flush_reasoning(self, index: int) -> list[bytes]:
        text = self.held_reasoning.pop(index, "")
        if not text:
            return []
        return [self.chunk([self.choice(index, {"reasoning": text,
                                                "reasoning_content": text})])]

    def frames(self, event: GenerationEvent) -> list[bytes]:
        if isinstance(event, Started):
            self.model = event.model or self.model
            return [self.chunk([self.choice(i, {"content": ""})])
                    for i in range(self.body.n or 1) if i not in self.announced]
        if isinstance(event, UsageReport):
            if self.body.include_usage:
                return [self.chunk([], usage_object(event.usage))]
            return []
        usage = self._usage_so_far(event)
        if isinstance(event, ReasoningDelta):
            if not self.body.include_reasoning or not event.text or \
                    not self.body.stream_reasoning:
                if self.body.include_reasoning and not self.body.stream_reasoning:
                    self.held_reasoning[event.index] = \
                        self.held_reasoning.get(event.index, "") + event.text
                # the text waits (or is dropped); its tokens' logprobs go now, once
                logprobs = self._logprobs(event)
                return [] if logprobs is None else \
                    [self.chunk([self.choice(event.index, {}, logprobs=logprobs)], usage)]
            delta = {"reasoning": event.text, "reasoning_content": event.text}
            return [self.chunk([self.choice(event.index, delta,
                                            logprobs=self._logprobs(event))], usage)]
        frames = self._flush_reasoning(event.index)
        if isinstance(event, TextDelta):
            if event.text or event.logprobs:
                frames.append(self.chunk([self.choice(
                    event.index, {"content": event.text},
                    logprobs=self._logprobs(event))], usage))
        elif isinstance(event, ToolCallDelta):
            self.has_tool_calls.add(event.index)
            call: dict[str, Any] = {"index": event.tool_index,
                                    "function": {"arguments": event.arguments}}
            if event.name or event.id:
                call = {"index": event.tool_index, "id": event.id or new_id("call_"),
                        "type": event.type or "function",
                        "function": {"name": event.name, "arguments": event.arguments}}
            frames.append(self.chunk([self.choice(event.index, {"tool_calls": [call]},
                                                  logprobs=self._logprobs(event))], usage))
        elif isinstance(event, Finish):
            frames.append(self.chunk([self.choice(event.index, {}, finish=event,
                                                  logprobs=self._logprobs(event))], usage))
        return frames
