"""Event-stream framing (SSE and NDJSON) and the streamed-response plumbing every route shares.

Streams are never compressed or buffered: `Cache-Control: no-cache, no-transform` and
`X-Accel-Buffering: no` tell proxies so, and the gateway adds no compression middleware.
A streamed response starts only after the first upstream event (or after one keep-alive
interval), so failures before generation starts (validation, 404, capacity) still get their
real HTTP status; later failures become the protocol's error event.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from gateway.errors import HttpError, http_error
from gateway.generation import EventStream
from gateway.state import GatewayState, gateway_state, request_id
from services.common.api.generate import GenerateRequest
from services.common.errors import HeliosError

log = logging.getLogger(__name__)

SSE_DONE = b"data: [DONE]\n\n"
SSE_KEEPALIVE = b": keep-alive\n\n"
STREAM_HEADERS = {"cache-control": "no-cache, no-transform", "x-accel-buffering": "no"}


def dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def sse_data(value: Any) -> bytes:
    return f"data: {dumps(value)}\n\n".encode()


def sse_event(name: str, value: Any) -> bytes:
    return f"event: {name}\ndata: {dumps(value)}\n\n".encode()


def ndjson_line(value: Any) -> bytes:
    return (dumps(value) + "\n").encode()


def event_stream(body: AsyncIterator[bytes], media_type: str = "text/event-stream"
                 ) -> StreamingResponse:
    return StreamingResponse(body, media_type=media_type, headers=STREAM_HEADERS)


async def start_generation(request: Request, requests: Sequence[GenerateRequest], *,
                           wait_first: bool) -> EventStream:
    """Start the frontend call(s) for this HTTP request.

    The ingress layer closes the stream (cancelling its calls) when the HTTP request ends,
    however it ends. With `wait_first`, wait up to one keep-alive interval for the first event
    so that an early failure raises here, before any response header is sent.
    """
    state = gateway_state(request)
    stream = EventStream(state.frontend, requests, trace_id=request_id(request))
    request.scope.setdefault("state", {}).setdefault("closers", []).append(state.track(stream))
    stream.start()
    if wait_first and await stream.wait_first(state.config.sse_keepalive_s):
        state.metrics.first_event.observe(max(0.0, time.time() - stream.created))
    return stream


def stream_failure(state: GatewayState, exc: HeliosError) -> HttpError:
    """A failure after the stream started: count and log it, return what to send."""
    state.metrics.stream_errors.labels(exc.kind.value).inc()
    log.warning("stream failed after it started: %s: %s", exc.kind.value, exc.display_message)
    return http_error(exc, default_retry_after_s=state.config.retry_after_s)
