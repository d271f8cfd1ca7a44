"""The flow /v1/chat/completions and /v1/completions share: start the generation, then either
stream `data:` chunks or answer one JSON object.

    return await respond(request, generations, streaming=body.streaming,
                         renderer=functools.partial(ChatStream, state, body, completion_id))

A `ChunkStream` subclass says how one event becomes chunks (`frames`) and how the collected
choices become the whole object (`whole`); the framing is common: every chunk carries the same
id, `created` and model, `usage` (null until the usage chunk) when usage was asked for, a
failure after the start is `data: {"error": {...}}` (the OpenAI SDK raises APIError on it), and
`data: [DONE]` ends the stream.
"""

from __future__ import annotations

import abc
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, ClassVar, Protocol

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from gateway.collector import Collector
from gateway.errors import openai_error_object
from gateway.generation import KEEPALIVE, EventStream
from gateway.openai.format import now
from gateway.sse import (
    SSE_DONE,
    SSE_KEEPALIVE,
    event_stream,
    sse_data,
    start_generation,
    stream_failure,
)
from gateway.state import GatewayState
from services.common.api.events import GenerationEvent
from services.common.api.generate import GenerateRequest
from services.common.errors import HeliosError


class StreamedBody(Protocol):
    """What the framing reads from a request body (both bodies are `SamplingFields`)."""

    @property
    def model(self) -> str: ...
    @property
    def include_usage(self) -> bool: ...
    @property
    def continuous_usage(self) -> bool: ...


class ChunkStream(abc.ABC):
    """One OpenAI response: its chunks while streaming, or the whole object."""

    object_type: ClassVar[str]     # the `object` of each chunk

    def __init__(self, state: GatewayState, body: StreamedBody, response_id: str) -> None:
        self.state = state
        self.body = body
        self.id = response_id
        self.created = now()
        self.model = body.model

    @abc.abstractmethod
    def frames(self, event: GenerationEvent) -> list[bytes]:
        """The SSE frames for one upstream event."""

    @abc.abstractmethod
    def whole(self, collector: Collector) -> dict[str, Any]:
        """The non-streamed response object."""

    def chunk(self, choices: list[dict[str, Any]], usage: Any = None) -> bytes:
        frame: dict[str, Any] = {"id": self.id, "object": self.object_type,
                                 "created": self.created, "model": self.model,
                                 "choices": choices}
        if self.body.include_usage or self.body.continuous_usage:
            frame["usage"] = usage
        return sse_data(frame)

    async def render(self, stream: EventStream) -> AsyncIterator[bytes]:
        try:
            async for event in stream.events(self.state.config.sse_keepalive_s):
                if event is KEEPALIVE:
                    yield SSE_KEEPALIVE
                    continue
                for frame in self.frames(event):  # type: ignore[arg-type]
                    yield frame
        except HeliosError as exc:
            yield sse_data({"error": openai_error_object(stream_failure(self.state, exc))})
            return
        finally:
            await stream.close()
        yield SSE_DONE


async def respond(request: Request, generations: Sequence[GenerateRequest], *,
                  streaming: bool, renderer: Callable[[], ChunkStream]) -> Response:
    """Run the generation(s): a streamed response of chunks, or the whole JSON object."""
    stream = await start_generation(request, generations, wait_first=streaming)
    render = renderer()
    if streaming:
        return event_stream(render.render(stream))
    return JSONResponse(render.whole(await stream.collect()))
