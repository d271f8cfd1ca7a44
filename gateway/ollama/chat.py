"""POST /api/chat and /api/generate: NDJSON streams (the default) or one JSON object.

Each line is `{model, created_at, message: {role, content, thinking?}, done: false}` (chat) or
`{model, created_at, response, thinking?, done: false}` (generate). Tool calls arrive whole,
with `arguments` as a JSON object, in one line after their fragments are complete. The last
line has `done: true`, `done_reason` and the token counts and durations (nanoseconds);
/api/generate adds `context` (the prompt and output token ids). A failure after the stream
started is one `{"error": "..."}` line (the HTTP status stays 200, as Ollama does).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from gateway.collector import Collector
from gateway.generation import KEEPALIVE, EventStream
from gateway.ollama.schema import ChatRequest, GenerateFields, GenerateRequest, model_name
from gateway.openai.format import logprob_value, new_id
from gateway.sse import event_stream, ndjson_line, start_generation, stream_failure
from gateway.state import GatewayState, gateway_state, request_id
from services.common.api.chat import ChatInput, CompletionInput
from services.common.api.events import (
    Finish,
    FinishReason,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    UsageReport,
)
from services.common.errors import HeliosError

router = APIRouter()

NDJSON = "application/x-ndjson"


def created_at() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _logprobs(logprobs: tuple[TokenLogprob, ...] | list[TokenLogprob]) -> list[dict[str, Any]]:
    return [{"token": lp.token, "logprob": logprob_value(lp.logprob),
             "bytes": list(lp.token_bytes),
             "top_logprobs": [{"token": t.token, "logprob": logprob_value(t.logprob),
                               "bytes": list(t.token_bytes)} for t in lp.top]}
            for lp in logprobs]


def load_reply(body: GenerateFields, chat: bool) -> dict[str, Any]:
    """An empty request only 'loads' the model in Ollama: answer done at once."""
    reply: dict[str, Any] = {"model": body.model, "created_at": created_at(), "done": True,
                             "done_reason": "load"}
    if chat:
        reply["message"] = {"role": "assistant", "content": ""}
    else:
        reply["response"] = ""
    return reply


@router.post("/api/chat", tags=["ollama"])
async def chat(request: Request, body: ChatRequest):
    if not body.messages:
        return JSONResponse(load_reply(body, chat=True))
    render = OllamaRender(gateway_state(request), request, body, body.chat_input(), chat=True)
    return await render.respond()


@router.post("/api/generate", tags=["ollama"])
async def generate(request: Request, body: GenerateRequest):
    if not body.prompt and not body.images:
        return JSONResponse(load_reply(body, chat=False))
    render = OllamaRender(gateway_state(request), request, body, body.input(), chat=False)
    return await render.respond()


class OllamaRender:
    def __init__(self, state: GatewayState, request: Request, body: GenerateFields,
                 input: ChatInput | CompletionInput, *, chat: bool) -> None:
        self.state = state
        self.request = request
        self.body = body
        self.input = input
        self.chat = chat
        self.started_ns = time.monotonic_ns()
        self.first_ns: int | None = None
        self.collector = Collector()

    async def respond(self):
        generation = self.body.generation(new_id("ollama-"), self.input)
        stream = await start_generation(self.request, [generation],
                                        wait_first=self.body.streaming)
        if self.body.streaming:
            return event_stream(self.render(stream), media_type=NDJSON)
        async for event in stream.events():
            self.observe(event)
        return JSONResponse(await self.final(whole=True))

    def observe(self, event: Any) -> None:
        if event is KEEPALIVE:
            return
        if self.first_ns is None and not isinstance(event, Started):
            self.first_ns = time.monotonic_ns()
        self.collector.add(event)

    def line(self, content: str = "", thinking: str = "", **extra: Any) -> dict[str, Any]:
        line: dict[str, Any] = {"model": self.body.model, "created_at": created_at()}
        if self.chat:
            message: dict[str, Any] = {"role": "assistant", "content": content}
            if thinking:
                message["thinking"] = thinking
            line["message"] = message
        else:
            line["response"] = content
            if thinking:
                line["thinking"] = thinking
        line["done"] = False
        line.update(extra)
        return line

    def tool_calls(self) -> list[dict[str, Any]]:
        return [{"id": call.id or new_id("call_"),
                 "function": {"index": k, "name": call.name,
                              "arguments": call.arguments_object()}}
                for k, call in enumerate(self.collector.choice(0).tool_calls)]

    async def _context(self) -> list[int] | None:
        """Prompt + output token ids (/api/generate's `context`), from the frontend."""
        client, rid = self.state.frontend, request_id(self.request)
        name = model_name(self.body.model)
        with contextlib.suppress(HeliosError):
            if isinstance(self.input, ChatInput):
                prompt = await client.tokenize(name, chat=self.input, trace_id=rid)
            else:
                prompt = await client.tokenize(name, text=self.input.text or "", trace_id=rid)
            output = await client.tokenize(name, text=self.collector.choice(0).text,
                                           add_special_tokens=False, trace_id=rid)
            return prompt + output
        return None

    async def final(self, *, whole: bool) -> dict[str, Any]:
        choice = self.collector.choice(0)
        usage = self.collector.final_usage()
        end_ns = time.monotonic_ns()
        first_ns = self.first_ns or end_ns
        reason = choice.finish_reason
        line = self.line(choice.text if whole else "", choice.reasoning if whole else "")
        if whole and self.chat and choice.tool_calls:
            line["message"]["tool_calls"] = self.tool_calls()
        if whole and self.body.logprobs:
            line["logprobs"] = _logprobs(choice.logprobs)
        line.update(done=True, done_reason="length" if reason is FinishReason.LENGTH else "stop",
                    total_duration=end_ns - self.started_ns, load_duration=0,
                    prompt_eval_count=usage.prompt_tokens,
                    prompt_eval_duration=first_ns - self.started_ns,
                    eval_count=usage.completion_tokens, eval_duration=end_ns - first_ns)
        if not self.chat:
            context = await self._context()
            if context is not None:
                line["context"] = context
        return line

    def frames(self, event: Any) -> list[bytes]:
        if getattr(event, "index", 0) != 0 or isinstance(event, Started):
            return []
        extra: dict[str, Any] = {}
        if self.body.logprobs and getattr(event, "logprobs", None):
            extra["logprobs"] = _logprobs(event.logprobs)
        if isinstance(event, TextDelta) and (event.text or extra):
            return [ndjson_line(self.line(event.text, **extra))]
        if isinstance(event, ReasoningDelta) and (event.text or extra):
            return [ndjson_line(self.line("", event.text, **extra))]
        if isinstance(event, Finish) and self.chat and self.collector.choice(0).tool_calls:
            line = self.line(**extra)
            line["message"]["tool_calls"] = self.tool_calls()
            return [ndjson_line(line)]
        if extra:   # a finish's tokens that produced no text (an EOS), a tool call's tokens
            return [ndjson_line(self.line("", **extra))]
        return []

    async def render(self, stream: EventStream) -> AsyncIterator[bytes]:
        try:
            async for event in stream.events(self.state.config.sse_keepalive_s):
                self.observe(event)
                if isinstance(event, UsageReport):
                    yield ndjson_line(await self.final(whole=False))
                elif event is not KEEPALIVE:
                    for frame in self.frames(event):
                        yield frame
        except HeliosError as exc:
            yield ndjson_line({"error": stream_failure(self.state, exc).message})
        finally:
            await stream.close()
