"""HTTP errors: typed Helios errors -> status, headers and each protocol's error JSON.

Status per kind follows docs/contract.md: 400 validation / unsupported / context overflow /
grammar / image decode, 401 authentication, 403 origin not allowed (CORS), 404 not found,
408 request body too slow, 429 rate limited (+ Retry-After),
503 capacity / unavailable (+ Retry-After), 500 execution failures (+ `x-should-retry: false`).
Each protocol then has its own body: OpenAI `{"error": {message, type, param, code}}`,
Anthropic `{"type": "error", "error": {type, message}, "request_id"}`, Ollama `{"error": msg}`.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

from services.common.errors import ContextOverflowError, ErrorKind, HeliosError


class Protocol(enum.Enum):
    OPENAI = "openai"
    ANTHROPIC = "anthropic"
    OLLAMA = "ollama"


def protocol_for_path(path: str) -> Protocol:
    """Which protocol's error shape a path speaks."""
    if path.startswith("/v1/messages"):
        return Protocol.ANTHROPIC
    if path.startswith("/api/") or path == "/":
        return Protocol.OLLAMA
    return Protocol.OPENAI


_STATUS: dict[ErrorKind, int] = {
    ErrorKind.VALIDATION: 400,
    ErrorKind.UNSUPPORTED: 400,
    ErrorKind.CONTEXT_OVERFLOW: 400,
    ErrorKind.GRAMMAR: 400,
    ErrorKind.IMAGE_DECODE: 400,
    ErrorKind.AUTHENTICATION: 401,
    ErrorKind.NOT_FOUND: 404,
    ErrorKind.RATE_LIMITED: 429,
    ErrorKind.CAPACITY: 503,
    ErrorKind.UNAVAILABLE: 503,
    ErrorKind.CANCELLED: 499,
    ErrorKind.MANIFEST: 500,
    ErrorKind.WORKER_FAILURE: 500,
    ErrorKind.POISONED: 500,
    ErrorKind.DRAIN_FAILURE: 500,
    ErrorKind.INTERNAL: 500,
}

# Conventional OpenAI `code` strings where one exists; otherwise the kind itself.
_OPENAI_CODE: dict[ErrorKind, str] = {
    ErrorKind.VALIDATION: "invalid_value",
    ErrorKind.CONTEXT_OVERFLOW: "context_length_exceeded",
    ErrorKind.AUTHENTICATION: "invalid_api_key",
    ErrorKind.RATE_LIMITED: "rate_limit_exceeded",
    ErrorKind.CAPACITY: "server_overloaded",
    ErrorKind.UNAVAILABLE: "service_unavailable",
}

_OPENAI_TYPE = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "invalid_request_error",
                405: "invalid_request_error", 408: "invalid_request_error",
                413: "invalid_request_error",
                429: "rate_limit_error", 499: "invalid_request_error",
                503: "service_unavailable_error"}

_ANTHROPIC_TYPE = {400: "invalid_request_error", 401: "authentication_error",
                   403: "permission_error", 404: "not_found_error",
                   405: "invalid_request_error", 408: "timeout_error",
                   413: "request_too_large",
                   429: "rate_limit_error", 499: "invalid_request_error",
                   503: "overloaded_error", 529: "overloaded_error"}


@dataclass(frozen=True, slots=True)
class HttpError:
    """One error as the HTTP layer sends it, before the protocol picks its body shape."""

    status: int
    message: str                     # display message (hint already appended)
    kind: str                        # Helios error kind, or an HTTP-level reason
    param: str | None = None
    code: str | None = None          # OpenAI-style code
    retry_after_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)  # e.g. context-overflow counts

    def headers(self) -> dict[str, str]:
        headers: dict[str, str] = {}
        if self.status in (429, 503):
            seconds = self.retry_after_s if self.retry_after_s is not None else 1.0
            headers["retry-after"] = str(max(1, math.ceil(seconds)))
            headers["retry-after-ms"] = str(max(0, round(seconds * 1000)))
        if self.status >= 500 and self.status != 503:
            # Execution failures are deterministic: tell the SDKs not to retry them.
            headers["x-should-retry"] = "false"
        return headers


def http_error(error: HeliosError, *, default_retry_after_s: float = 1.0) -> HttpError:
    status = _STATUS.get(error.kind, 500)
    details: dict[str, Any] = {}
    if isinstance(error, ContextOverflowError):
        details = {"prompt_tokens": error.prompt_tokens, "max_tokens": error.max_tokens,
                   "context_length": error.context_length}
    code = _OPENAI_CODE.get(error.kind, error.kind.value)
    if error.kind is ErrorKind.NOT_FOUND and error.param == "model":
        code = "model_not_found"
    retry = error.retry_after_s
    if status in (429, 503) and retry is None:
        retry = default_retry_after_s
    return HttpError(status=status, message=error.display_message, kind=error.kind.value,
                     param=error.param or None, code=code, retry_after_s=retry,
                     details=details)


def too_large(limit: int) -> HttpError:
    return HttpError(status=413, kind="request_too_large", code="request_too_large",
                     message=f"request body exceeds the limit of {limit} bytes "
                             "(raise --max-body-bytes on the gateway)")


def body_timeout(message: str) -> HttpError:
    """408: the request body did not arrive in time (the body deadline or minimum rate)."""
    return HttpError(status=408, kind="request_timeout", code="request_timeout", message=message)


def origin_refused(origin: str) -> HttpError:
    """403: a browser origin the gateway does not allow (CORS, `--allowed-origins`)."""
    return HttpError(status=403, kind="origin_not_allowed", code="origin_not_allowed",
                     message=f"origin {origin!r} is not allowed (add it to --allowed-origins "
                             "on the gateway)")


def route_error(status: int, message: str) -> HttpError:
    """404 for unknown routes, 405 for wrong methods (Starlette's own HTTP exceptions)."""
    kind = "not_found" if status == 404 else "method_not_allowed" if status == 405 else "http"
    return HttpError(status=status, kind=kind, code=kind, message=message)


def openai_error_object(error: HttpError) -> dict[str, Any]:
    return {"message": error.message,
            "type": _OPENAI_TYPE.get(error.status, "server_error"),
            "param": error.param, "code": error.code, **error.details}


def anthropic_error_object(error: HttpError) -> dict[str, Any]:
    return {"type": _ANTHROPIC_TYPE.get(error.status, "api_error"), "message": error.message}


def error_body(protocol: Protocol, error: HttpError, request_id: str = "") -> dict[str, Any]:
    if protocol is Protocol.ANTHROPIC:
        body: dict[str, Any] = {"type": "error", "error": anthropic_error_object(error)}
        if request_id:
            body["request_id"] = request_id
        return body
    if protocol is Protocol.OLLAMA:
        return {"error": error.message}
    return {"error": openai_error_object(error)}
