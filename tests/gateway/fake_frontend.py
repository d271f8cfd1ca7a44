"""A scripted Frontend gRPC servicer, really served (grpc.aio, health, the error interceptor).

The last user message (or the completion prompt) may hold a script, built with `script()`:

    script(text=["Hel", "lo"], numbered=[count, size], reasoning=["hmm"], tools=[{"name": "f", "arguments": ['{"a"', ':1}']}],
           finish="tool_calls", error={"kind": "capacity", "message": "full"}, error_after=2,
           delay_s=0.01, hang=True, prompt_tokens=7, logprobs=True)

Without a script each choice says "Hello from Helios". `error` without `error_after` fails
before `started` (an admission failure); with it, after that many events. `hang` blocks after
`started` until the call is cancelled. Every request is recorded; cancellations are counted.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from services.common.errors import ErrorKind, make_error
from services.common.grpc_errors import ErrorInterceptor
from services.common.pb import common_pb2, frontend_pb2, frontend_pb2_grpc

SCRIPT_PREFIX = "SCRIPT:"
MODEL_ID = "helios-demo"
ROOT = "org/helios-demo-checkpoint"
DEFAULT_TEXT = ("Hello", " from", " Helios")

FINISH = {"stop": common_pb2.FINISH_REASON_STOP, "length": common_pb2.FINISH_REASON_LENGTH,
          "stop_string": common_pb2.FINISH_REASON_STOP_STRING,
          "tool_calls": common_pb2.FINISH_REASON_TOOL_CALLS}


def script(**fields: Any) -> str:
    return SCRIPT_PREFIX + json.dumps(fields)


def _texts(chat: frontend_pb2.ChatInput) -> list[str]:
    texts = []
    for message in chat.messages:
        if message.WhichOneof("content") == "text":
            texts.append(message.text)
        elif message.WhichOneof("content") == "parts":
            texts += [p.text for p in message.parts.parts if p.WhichOneof("part") == "text"]
    return texts


def count_tokens(chat: frontend_pb2.ChatInput | None, text: str = "") -> int:
    """The fake's token count: words over every text, plus 4 per message."""
    if chat is None:
        return len(text.split())
    return sum(len(t.split()) for t in _texts(chat)) + 4 * len(chat.messages)


def find_script(request: frontend_pb2.GenerateRequest) -> dict[str, Any]:
    if request.WhichOneof("input") == "completion":
        candidates = [request.completion.text]
    else:
        candidates = list(reversed(_texts(request.chat)))
    for text in candidates:
        if text.startswith(SCRIPT_PREFIX):
            return json.loads(text[len(SCRIPT_PREFIX):])
    return {}


def _logprobs(text: str) -> list[frontend_pb2.TokenLogprobInfo]:
    return [frontend_pb2.TokenLogprobInfo(
        token_id=7, token=text, token_bytes=text.encode(), logprob=-0.5,
        top=[frontend_pb2.TopLogprobInfo(token_id=7, token=text, token_bytes=text.encode(),
                                         logprob=-0.5),
             frontend_pb2.TopLogprobInfo(token_id=8, token="x", token_bytes=b"x",
                                         logprob=-1.5)])]


EMBEDDING = [0.6, 0.0, 0.8, 0.0]   # what every embedding request gets (normalized)


class FakeFrontend(frontend_pb2_grpc.FrontendServicer):
    def __init__(self) -> None:
        self.requests: list[frontend_pb2.GenerateRequest] = []
        self.metadata: list[dict[str, str]] = []
        self.active = 0
        self.cancelled = 0
        self.completed = 0
        self.max_active = 0

    def _error(self, spec: dict[str, Any]):
        kind = ErrorKind(spec["kind"])
        extra = {k: spec[k] for k in ("prompt_tokens", "max_tokens", "context_length")
                 if k in spec}
        return make_error(kind, spec.get("message", f"scripted {kind.value}"),
                          hint=spec.get("hint", ""), param=spec.get("param", ""),
                          retry_after_s=spec.get("retry_after_s"), service="frontend",
                          **extra)

    def _events(self, request: frontend_pb2.GenerateRequest, spec: dict[str, Any]
                ) -> tuple[list[frontend_pb2.GenerateEvent], int]:
        E = frontend_pb2.GenerateEvent
        if request.embed:        # an embedding: a fixed unit vector, then finish length
            return [E(index=0, embedding=frontend_pb2.EmbeddingEvent(values=EMBEDDING)),
                    E(index=0, finish=frontend_pb2.Finish(
                        reason=common_pb2.FINISH_REASON_LENGTH))], 0
        n = request.n if request.HasField("n") else 1
        logprobs = request.sampling.logprobs or spec.get("logprobs", False)
        events = []
        completion = 0
        for index in range(n):
            for piece in spec.get("reasoning", []):
                events.append(E(index=index, reasoning=frontend_pb2.ReasoningDelta(text=piece)))
                completion += 1
            pieces = spec.get("text", DEFAULT_TEXT if "tools" not in spec else [])
            if "numbered" in spec:   # [count, size]: distinct numbered pieces, bulk output
                count, size = spec["numbered"]
                prefix = spec.get("prefix", "")
                pieces = [f"{prefix}<{i:06d}>" + "x" * size for i in range(count)]
            for piece in pieces:
                event = E(index=index, text=frontend_pb2.TextDelta(text=piece))
                if logprobs:
                    event.logprobs.extend(_logprobs(piece))
                if request.continuous_usage:   # as the frontend: the prompt, tokens so far
                    event.usage_so_far.CopyFrom(common_pb2.Usage(
                        prompt_tokens=spec.get("prompt_tokens", 11),
                        completion_tokens=completion + 1))
                events.append(event)
                completion += 1
            for k, tool in enumerate(spec.get("tools", [])):
                fragments = tool.get("arguments", ["{}"])
                events.append(E(index=index, tool_call=frontend_pb2.ToolCallDelta(
                    tool_index=k, id=tool.get("id", f"call_{index}_{k}"), type="function",
                    name=tool["name"], arguments=fragments[0])))
                for fragment in fragments[1:]:
                    events.append(E(index=index, tool_call=frontend_pb2.ToolCallDelta(
                        tool_index=k, arguments=fragment)))
                completion += len(fragments)
            finish = frontend_pb2.Finish(reason=FINISH[spec.get("finish", "stop")],
                                         stop_sequence=spec.get("stop_sequence", ""),
                                         stop_token_id=spec.get("stop_token_id"))
            events.append(E(index=index, finish=finish))
            if logprobs and spec.get("eos_logprob"):   # a token without text: the EOS
                events[-1].logprobs.extend(_logprobs("<eos>"))
                completion += 1
        return events, completion

    async def Generate(self, request, context) -> AsyncIterator[frontend_pb2.GenerateEvent]:
        self.requests.append(request)
        self.metadata.append({k: v for k, v in context.invocation_metadata()})
        spec = find_script(request)
        if "error" in spec and "error_after" not in spec:
            raise self._error(spec["error"])
        self.active += 1
        self.max_active = max(self.max_active, self.active)
        try:
            prompt_tokens = spec.get("prompt_tokens", 11)
            prompt_text = request.completion.text if request.WhichOneof("input") == \
                "completion" else ""
            yield frontend_pb2.GenerateEvent(index=0, started=frontend_pb2.Started(
                request_id=request.request_id, model=MODEL_ID, prompt_tokens=prompt_tokens,
                cached_tokens=spec.get("cached_tokens", 0), prompt_text=prompt_text))
            if spec.get("hang"):
                await asyncio.Event().wait()
            delay = spec.get("delay_s", 0)
            events, completion_tokens = self._events(request, spec)
            for number, event in enumerate(events):
                if "error_after" in spec and number >= spec["error_after"]:
                    raise self._error(spec["error"])
                if delay:
                    await asyncio.sleep(delay)
                yield event
            yield frontend_pb2.GenerateEvent(index=0, usage=common_pb2.Usage(
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                cached_tokens=spec.get("cached_tokens", 0),
                reasoning_tokens=len(spec.get("reasoning", []))))
            self.completed += 1
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        finally:
            self.active -= 1

    async def CountTokens(self, request, context):
        chat = request.chat if request.WhichOneof("input") == "chat" else None
        return frontend_pb2.CountTokensResponse(input_tokens=count_tokens(chat, request.text))

    async def Tokenize(self, request, context):
        chat = request.chat if request.WhichOneof("input") == "chat" else None
        return frontend_pb2.TokenizeResponse(
            token_ids=list(range(1, count_tokens(chat, request.text) + 1)), max_model_len=4096)

    async def Detokenize(self, request, context):
        return frontend_pb2.DetokenizeResponse(text=" ".join(map(str, request.token_ids)))

    async def ListModels(self, request, context):
        return frontend_pb2.ListModelsResponse(models=[frontend_pb2.ModelCard(
            id=MODEL_ID, aliases=[MODEL_ID, ROOT], root=ROOT, max_model_len=4096,
            capabilities=common_pb2.Capabilities(tools=True, vision=False, reasoning=True),
            created=1_700_000_000, owned_by="helios", architecture="Qwen3ForCausalLM",
            family="qwen3", num_parameters=1_234_567, dtype="bfloat16", size_bytes=2_469_134,
            digest="ab" * 16, chat_template="{{ messages }}")])


class FakeFrontendServer:
    """Serves `FakeFrontend` on 127.0.0.1 from a background thread with its own event loop."""

    def __init__(self) -> None:
        self.servicer = FakeFrontend()
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True,
                                        name="fake-frontend")
        self._thread.start()
        self.port = self._call(self._start())
        self.address = f"127.0.0.1:{self.port}"

    def _call(self, coro):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=30)

    async def _start(self) -> int:
        self.server = grpc.aio.server(interceptors=[ErrorInterceptor("frontend")])
        frontend_pb2_grpc.add_FrontendServicer_to_server(self.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        await self.health.set("", health_pb2.HealthCheckResponse.SERVING)
        return port

    def set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else \
            health_pb2.HealthCheckResponse.NOT_SERVING
        self._call(self.health.set("", status))

    def stop(self) -> None:
        self._call(self.server.stop(grace=0))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
