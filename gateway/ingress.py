"""The outermost ASGI layer: request id, CORS, auth, admission, the body phase, disconnects.

Runs on the raw ASGI scope, so everything here happens before FastAPI reads any JSON:

1. `x-request-id` is taken from the client (or Envoy) or generated, stored in the scope state
   and echoed on the response (also as `request-id` on Anthropic routes);
2. CORS (`gateway/cors.py`): a browser preflight is answered here, before auth and admission;
   a disallowed Origin gets 403; an allowed one gets its CORS headers on every response;
3. the API key is checked (401 in the route's protocol shape);
4. body-carrying requests are refused at once when admission is full (429) or paused /
   shutting down (503), before any body byte is read;
5. the body phase: the request takes a body-reader slot (`max_body_readers`, 429 when none is
   left) and its body must arrive within `body_timeout_s`, at `body_min_rate` bytes/s on
   average after `body_grace_s` (408 and the connection closed otherwise), up to
   `max_body_bytes` (413). A slow sender holds only its body-reader slot;
6. with the body complete, the request takes its admission permit (held until the last byte
   of the response is sent, however long it streams), the body is checked for unpaired UTF-16
   surrogate escapes (400: they are not Unicode and cannot cross gRPC) and replayed to the app
   as JSON whatever its content type said (curl's form default, LiteLLM's none), as Ollama
   and vLLM read it;
7. a watcher listens for the client's disconnect and cancels the request task, which cancels
   the frontend call and so the engine request.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from dataclasses import dataclass
from typing import Any

from gateway import cors
from gateway.admission import Admission, BodyReaders, rejection
from gateway.auth import is_authorized
from gateway.errors import (
    HttpError,
    body_timeout,
    error_body,
    http_error,
    origin_refused,
    protocol_for_path,
    too_large,
)
from gateway.metrics import GatewayMetrics, route_label
from gateway.validation import check_body
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


@dataclass(frozen=True, slots=True)
class BodyLimits:
    """The body phase's limits (GatewayConfig's max_body_bytes / body_* settings)."""

    max_bytes: int
    timeout_s: float = 60.0
    min_rate: int = 1024          # bytes/s on average once grace_s has passed; 0 = none
    grace_s: float = 5.0


def json_content_type(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """Every body route takes JSON: read it as JSON whatever the content type says (curl -d
    sends application/x-www-form-urlencoded, LiteLLM's Ollama providers none), as Ollama and
    vLLM do. Only multipart bodies (real form uploads) keep theirs."""
    kept = [(k, v) for k, v in headers if k.lower() != b"content-type"]
    given = cors.header(headers, b"content-type")
    if given is not None and given.lower().lstrip().startswith(b"multipart/"):
        return headers
    return [*kept, (b"content-type", b"application/json")]


class Ingress:
    def __init__(self, app: Any, *, api_key: str, admission: Admission,
                 body_readers: BodyReaders, limits: BodyLimits, origins: cors.OriginPolicy,
                 metrics: GatewayMetrics, default_retry_after_s: float = 1.0) -> None:
        self.app = app
        self.api_key = api_key
        self.admission = admission
        self.body_readers = body_readers
        self.limits = limits
        self.origins = origins
        self.metrics = metrics
        self.default_retry_after_s = default_retry_after_s

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path: str = scope["path"]
        request_id = request_id_from(scope["headers"])
        scope.setdefault("state", {})["request_id"] = request_id
        origin = cors.header(scope["headers"], b"origin")
        if origin is not None and await self._answered_cors(scope, send, origin):
            return
        send = self._decorated_send(send, path, request_id, origin)

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
            # Refused before a single body byte is read when admission is full or closed.
            self.admission.check()
        except HeliosError as exc:
            await self._reject(send, path, request_id, exc, rejection(exc))
            return
        try:
            reader = self.body_readers.try_acquire()
        except HeliosError as exc:
            await self._reject(send, path, request_id, exc, "body_readers")
            return
        with reader:
            body = await self._read_body(scope, receive)
        if body is None:
            return  # the client left while sending
        if isinstance(body, HttpError):
            # The rest of the body is unread (or never comes): close the connection after it.
            await self._send_error(send, path, request_id, body, close=True)
            return
        try:
            permit = self.admission.try_acquire()     # filled (or closed) while the body came
        except HeliosError as exc:
            await self._reject(send, path, request_id, exc, rejection(exc))
            return
        with permit:
            invalid = check_body(body) if len(body) < OFFLOAD_BYTES else \
                await asyncio.to_thread(check_body, body)   # big image bodies: off the loop
            if invalid is not None:
                await self._send_error(send, path, request_id, self._http(invalid))
                return
            scope["headers"] = json_content_type(scope["headers"])
            await self._run(scope, body, receive, send)

    async def _answered_cors(self, scope: Scope, send, origin: bytes) -> bool:
        """Refuse a disallowed origin (403, no CORS headers) or answer an allowed one's
        preflight (204); False when the request goes on."""
        path, request_id = scope["path"], scope["state"]["request_id"]
        send = self._decorated_send(send, path, request_id, None)
        host = (cors.header(scope["headers"], b"host") or b"").decode("latin-1")
        if not self.origins.allows(origin.decode("latin-1"), host):
            await self._send_error(send, path, request_id,
                                   origin_refused(origin.decode("latin-1")))
            return True
        if not cors.is_preflight(scope):
            return False
        await send({"type": "http.response.start", "status": 204,
                    "headers": cors.preflight_headers(origin, scope["headers"])})
        await send({"type": "http.response.body", "body": b""})
        return True

    async def _reject(self, send, path: str, request_id: str, error: HeliosError,
                      reason: str) -> None:
        self.metrics.rejected.labels(reason).inc()
        await self._send_error(send, path, request_id, self._http(error))

    def _http(self, error: HeliosError) -> HttpError:
        return http_error(error, default_retry_after_s=self.default_retry_after_s)

    def _decorated_send(self, send, path: str, request_id: str, origin: bytes | None):
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
                if origin is not None:
                    headers = cors.add_response_headers(headers, origin)
                message = {**message, "headers": headers}
                self.metrics.requests.labels(label, str(message["status"])).inc()
            await send(message)

        return decorated

    async def _send_error(self, send, path: str, request_id: str, error: HttpError, *,
                          close: bool = False) -> None:
        body = json.dumps(error_body(protocol_for_path(path), error, request_id)).encode()  # ascii
        headers = [(b"content-type", b"application/json"),
                   (b"content-length", str(len(body)).encode())]
        if close:
            headers.append((b"connection", b"close"))
        headers += [(k.encode(), v.encode()) for k, v in error.headers().items()]
        self.metrics.errors.labels(error.kind).inc()
        await send({"type": "http.response.start", "status": error.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def _read_body(self, scope: Scope, receive) -> bytes | HttpError | None:
        """The whole body, or the 408 / 413 that ended it, or None if the client left."""
        limits = self.limits
        length = cors.header(scope["headers"], b"content-length")
        if length is not None:
            with contextlib.suppress(ValueError):
                if int(length) > limits.max_bytes:
                    return too_large(limits.max_bytes)
        chunks: list[bytes] = []
        size = 0
        start = asyncio.get_running_loop().time()
        whole = start + limits.timeout_s
        while True:
            # The next chunk must come before the whole-body deadline and before the average
            # rate since the grace period falls below the minimum: size >= rate * (t - grace).
            deadline = whole if not limits.min_rate else \
                min(whole, start + limits.grace_s + size / limits.min_rate)
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                return self._body_timeout(deadline >= whole, size)
            if message["type"] == "http.disconnect":
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limits.max_bytes:
                return too_large(limits.max_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)

    def _body_timeout(self, whole: bool, size: int) -> HttpError:
        limits = self.limits
        log.info("request body too slow; answering 408", extra={"fields": {
            "received_bytes": size, "reason": "deadline" if whole else "min_rate"}})
        if whole:
            return body_timeout(f"the request body did not arrive within {limits.timeout_s:g} s "
                                f"({size} bytes received; raise --body-timeout-s on the "
                                "gateway)")
        return body_timeout(f"the request body arrived slower than {limits.min_rate} bytes/s "
                            f"({size} bytes received; lower --body-min-rate on the gateway)")

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
