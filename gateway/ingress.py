"""The outermost ASGI layer: request id, auth, admission, body limit, disconnect cancellation.

Runs on the raw ASGI scope, so everything here happens before FastAPI reads any JSON:

1. `x-request-id` is taken from the client (or Envoy) or generated, stored in the scope state
   and echoed on the response (also as `request-id` on Anthropic routes);
2. the API key is checked (401 in the route's protocol shape);
3. body-carrying requests reserve an admission permit (429 full, 503 paused or shutting down)
   that is held until the last byte of the response is sent, however long it streams;
4. the body is read up to `max_body_bytes` (413 above it), checked for unpaired UTF-16
   surrogate escapes (400: they are not Unicode and cannot cross gRPC), then replayed;
5. a watcher listens for the client's disconnect and cancels the request task, which cancels
   the frontend call and so the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from typing import Any

from gateway.admission import Admission, rejection
from gateway.auth import is_authorized
from gateway.errors import HttpError, error_body, http_error, protocol_for_path, too_large
from gateway.metrics import GatewayMetrics, route_label
from gateway.validation import check_unicode
from services.common.errors import AuthenticationError, HeliosError

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Message = dict[str, Any]

BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
OFFLOAD_BYTES = 1 << 20
_REQUEST_ID = re.compile(r"^[\x21-\x7e]{1,200}$")


def request_id_from(headers: list[tuple[bytes, bytes]]) -> str:
    for key, value in headers:
        if key.lower() == b"x-request-id":
            text = value.decode("latin-1").strip()
            if _REQUEST_ID.match(text):
                return text
    return uuid.uuid4().hex


class Ingress:
    def __init__(self, app: Any, *, api_key: str, admission: Admission, max_body_bytes: int,
                 metrics: GatewayMetrics, default_retry_after_s: float = 1.0) -> None:
        self.app = app
        self.api_key = api_key
        self.admission = admission
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics
        self.default_retry_after_s = default_retry_after_s

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        request_id = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        send = self._decorated_send(send, path, request_id)

        if not is_authorized(self.api_key, path, scope["headers"]):
            error = AuthenticationError("missing or invalid API key: send 'Authorization: "
                                        "Bearer <key>'" + (" or 'x-api-key: <key>'"
                                                           if path.startswith("/v1/messages")
                                                           else ""))
            await self._send_error(send, path, request_id, self._http(error))
            return
        if scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        try:
            permit = self.admission.try_acquire()
        except HeliosError as exc:
            self.metrics.rejected.labels(rejection(exc)).inc()
            await self._send_error(send, path, request_id, self._http(exc))
            return
        with permit:
            body = await self._read_body(scope, receive)
            if body is None:
                return  # the client left while sending
            if isinstance(body, HttpError):
                await self._send_error(send, path, request_id, body)
                return
            invalid = check_unicode(body) if len(body) < OFFLOAD_BYTES else \
                await asyncio.to_thread(check_unicode, body)   # big image bodies: off the loop
            if invalid is not None:
                await self._send_error(send, path, request_id, self._http(invalid))
                return
            await self._run(scope, body, receive, send)

    def _http(self, error: HeliosError) -> HttpError:
        return http_error(error, default_retry_after_s=self.default_retry_after_s)

    def _decorated_send(self, send, path: str, request_id: str):
        anthropic = path.startswith("/v1/messages")
        label = route_label(path)

        async def decorated(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                names = {k.lower() for k, _ in headers}
                if b"x-request-id" not in names:
                    headers.append((b"x-request-id", request_id.encode("latin-1")))
                if anthropic and b"request-id" not in names:
                    headers.append((b"request-id", request_id.encode("latin-1")))
                message = {**message, "headers": headers}
                self.metrics.requests.labels(label, str(message["status"])).inc()
            await send(message)

        return decorated

    async def _send_error(self, send, path: str, request_id: str, error: HttpError) -> None:
        body = json.dumps(error_body(protocol_for_path(path), error, request_id)).encode()  # ascii
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        headers += [(k.encode(), v.encode()) for k, v in error.headers().items()]
        self.metrics.errors.labels(error.kind).inc()
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _read_body(self, scope: Scope, receive) -> bytes | HttpError | None:
        for key, value in scope["headers"]:
            if key.lower() == b"content-length":
                with contextlib.suppress(ValueError):
                    if int(value) > self.max_body_bytes:
                        return too_large(self.max_body_bytes)
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                return too_large(self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _run(self, scope: Scope, body: bytes, receive, send) -> None:
        """Run the app with the buffered body; cancel it when the client disconnects."""
        disconnected = asyncio.Event()
        body_pending = True

        async def replay() -> Message:
            nonlocal body_pending
            if body_pending:
                body_pending = False
                return {"type": "http.request", "body": body, "more_body": False}
            await disconnected.wait()
            return {"type": "http.disconnect"}

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            disconnected.set()

        app_task = asyncio.ensure_future(self.app(scope, replay, send))
        watch_task = asyncio.ensure_future(watch())
        try:
            await asyncio.wait({app_task, watch_task}, return_when=asyncio.FIRST_COMPLETED)
            if not app_task.done():
                # The client went away before its response finished: cancel the request
                # (the generation's finally-blocks cancel the frontend call).
                self.metrics.disconnects.inc()
                log.info("client disconnected; cancelling request",
                         extra={"fields": {"request_id": scope["state"]["request_id"]}})
                app_task.cancel()
                await asyncio.wait({app_task})
            elif not app_task.cancelled():
                app_task.result()  # re-raise what the app raised (uvicorn logs it)
        finally:
            for task in (app_task, watch_task):
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(BaseException):
                        await task
            # Whatever happened, nothing this request started upstream outlives it.
            for close in scope["state"].get("closers", ()):
                with contextlib.suppress(Exception):
                    await close()
