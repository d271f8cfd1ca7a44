"""Typed errors on the wire: HeliosError <-> gRPC status + `helios.v1.ErrorDetail`.

A failure travels as a gRPC status code plus the `grpc-status-details-bin` trailer holding a
`google.rpc.Status` with one packed `ErrorDetail`. `ErrorInterceptor` converts what a servicer
raises; `error_from_rpc` turns what a client receives back into the same typed error, so an
engine `CapacityError` reaches the gateway as a `CapacityError` with its hint and cause.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf import any_pb2
from google.rpc import status_pb2

from services.common.errors import (
    CancelledError,
    ContextOverflowError,
    ErrorKind,
    ErrorStage,
    HeliosError,
    InternalError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
    make_error,
)
from services.common.pb import common_pb2

log = logging.getLogger(__name__)

DETAILS_KEY = "grpc-status-details-bin"

_STATUS_FOR_KIND: dict[ErrorKind, grpc.StatusCode] = {
    ErrorKind.VALIDATION: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.UNSUPPORTED: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.CONTEXT_OVERFLOW: grpc.StatusCode.OUT_OF_RANGE,
    ErrorKind.CAPACITY: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorKind.GRAMMAR: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.IMAGE_DECODE: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorKind.MANIFEST: grpc.StatusCode.FAILED_PRECONDITION,
    ErrorKind.WORKER_FAILURE: grpc.StatusCode.INTERNAL,
    ErrorKind.POISONED: grpc.StatusCode.INTERNAL,
    ErrorKind.DRAIN_FAILURE: grpc.StatusCode.INTERNAL,
    ErrorKind.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorKind.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorKind.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorKind.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorKind.AUTHENTICATION: grpc.StatusCode.UNAUTHENTICATED,
    ErrorKind.RATE_LIMITED: grpc.StatusCode.RESOURCE_EXHAUSTED,
}

_PB_KIND: dict[ErrorKind, Any] = {
    kind: common_pb2.ErrorKind.Value(f"ERROR_KIND_{kind.name}") for kind in ErrorKind
}
_KIND_FROM_PB = {value: kind for kind, value in _PB_KIND.items()}
_PB_STAGE: dict[ErrorStage, Any] = {
    stage: common_pb2.ErrorStage.Value(f"ERROR_STAGE_{stage.name}") for stage in ErrorStage
}
_STAGE_FROM_PB = {value: stage for stage, value in _PB_STAGE.items()}


# Errors travel in headers (grpc-message, the details trailer), which gRPC caps at 8 KiB (soft)
# and 16 KiB (hard) per call: a message quoting a huge request field (a 1 MB model name) failed
# the whole call with RESOURCE_EXHAUSTED. Each text is clipped to a UTF-8 byte budget that keeps
# the trailers under the soft limit even when every character needs escaping.
_MESSAGE_BYTES = 768
_HINT_BYTES = 384
_PARAM_BYTES = 192


def clip(text: str, limit: int) -> str:
    """`text` cut to at most `limit` UTF-8 bytes (on a character boundary), marked when cut."""
    data = text.encode("utf-8", "surrogatepass")
    if len(data) <= limit:
        return text
    return data[:limit - 3].decode("utf-8", "ignore") + "..."


def status_code_for(error: HeliosError) -> grpc.StatusCode:
    return _STATUS_FOR_KIND.get(error.kind, grpc.StatusCode.INTERNAL)


def error_to_detail(error: HeliosError, *, service: str = "") -> common_pb2.ErrorDetail:
    detail = common_pb2.ErrorDetail(
        kind=_PB_KIND[error.kind],
        stage=_PB_STAGE[error.stage],
        message=clip(error.message, _MESSAGE_BYTES),
        hint=clip(error.hint, _HINT_BYTES),
        param=clip(error.param, _PARAM_BYTES),
        cause=clip(error.cause_text, _MESSAGE_BYTES),
        service=error.service or service,
    )
    if isinstance(error, ContextOverflowError):
        detail.prompt_tokens = error.prompt_tokens
        detail.max_tokens = error.max_tokens
        detail.context_length = error.context_length
    if error.retry_after_s is not None:
        detail.retry_after_s = error.retry_after_s
    return detail


def error_from_detail(detail: common_pb2.ErrorDetail) -> HeliosError:
    def opt(name: str) -> int | None:
        return getattr(detail, name) if detail.HasField(name) else None

    return make_error(
        _KIND_FROM_PB.get(detail.kind, ErrorKind.INTERNAL),
        detail.message,
        hint=detail.hint,
        param=detail.param,
        stage=_STAGE_FROM_PB.get(detail.stage, ErrorStage.UNSPECIFIED),
        service=detail.service,
        cause=detail.cause,
        retry_after_s=detail.retry_after_s if detail.HasField("retry_after_s") else None,
        prompt_tokens=opt("prompt_tokens"),
        max_tokens=opt("max_tokens"),
        context_length=opt("context_length"),
    )


def error_trailer(error: HeliosError, *, service: str = "") -> tuple[tuple[str, bytes], ...]:
    """Trailing metadata carrying the packed ErrorDetail."""
    packed = any_pb2.Any()
    packed.Pack(error_to_detail(error, service=service))
    status = status_pb2.Status(
        code=status_code_for(error).value[0], message=clip(error.display_message, _MESSAGE_BYTES),
        details=[packed]
    )
    return ((DETAILS_KEY, status.SerializeToString()),)


def error_from_rpc(exc: grpc.RpcError) -> HeliosError:
    """Decode a client-side RpcError into the typed error it carries (or the closest kind)."""
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    text = exc.details() if hasattr(exc, "details") else str(exc)
    trailers = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in trailers or ():
        if key == DETAILS_KEY:
            status = status_pb2.Status.FromString(value)
            for packed in status.details:
                detail = common_pb2.ErrorDetail()
                if packed.Unpack(detail):
                    return error_from_detail(detail)
    # A status without our detail: transport failures and unimplemented RPCs.
    if code == grpc.StatusCode.UNAVAILABLE:
        return UnavailableError(f"upstream unavailable: {text}", retry_after_s=1.0)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return UnavailableError(f"upstream deadline exceeded: {text}", retry_after_s=1.0)
    if code == grpc.StatusCode.CANCELLED:
        return CancelledError(f"cancelled: {text}")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return UnsupportedError(f"not implemented: {text}")
    if code == grpc.StatusCode.NOT_FOUND:
        return NotFoundError(text)
    return InternalError(f"upstream failed with {code.name}: {text}")


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


class ErrorInterceptor(grpc.aio.ServerInterceptor):
    """The one place where servicer exceptions become gRPC statuses with typed details.

    HeliosError -> its status code + ErrorDetail. Any other exception -> INTERNAL with the
    exception chain as cause (logged with its traceback). Cancellation passes through.
    """

    def __init__(self, service: str) -> None:
        self._service = service

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith("/helios."):
            return handler  # health and reflection keep their own handlers
        if handler.unary_unary:
            return grpc.unary_unary_rpc_method_handler(
                self._wrap_unary(handler.unary_unary, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                self._wrap_stream(handler.unary_stream, method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return handler

    async def _abort(self, context: grpc.aio.ServicerContext, error: HeliosError, method: str):
        if error.kind in (ErrorKind.INTERNAL, ErrorKind.WORKER_FAILURE, ErrorKind.POISONED):
            log.error("%s failed: %s (cause: %s)", method, error.display_message, error.cause_text)
        else:
            log.info("%s rejected: %s: %s", method, error.kind.value, error.display_message)
        await context.abort(
            status_code_for(error),
            clip(error.display_message, _MESSAGE_BYTES),
            trailing_metadata=error_trailer(error, service=self._service),
        )

    def _convert(self, exc: BaseException, method: str) -> HeliosError:
        if isinstance(exc, HeliosError):
            return exc
        log.exception("%s raised an unexpected %s", method, type(exc).__name__, exc_info=exc)
        error = InternalError(f"internal error in {self._service}: {type(exc).__name__}: {exc}")
        error.__cause__ = exc
        return error

    async def _unimplemented(self, context: grpc.aio.ServicerContext, method: str) -> None:
        # The generated base servicer raises NotImplementedError for RPCs not built yet.
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method} is not implemented")

    def _wrap_unary(self, behavior: Handler, method: str) -> Handler:
        async def wrapper(request, context):
            try:
                result = behavior(request, context)
                return await result if inspect.isawaitable(result) else result
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except NotImplementedError:
                await self._unimplemented(context, method)
            except Exception as exc:
                await self._abort(context, self._convert(exc, method), method)

        return wrapper

    def _wrap_stream(self, behavior, method: str):
        async def wrapper(request, context) -> AsyncIterator[Any]:
            try:
                stream = behavior(request, context)
                if hasattr(stream, "__aiter__"):
                    async for item in stream:
                        yield item
                else:
                    for item in stream:
                        yield item
            except (asyncio.CancelledError, grpc.aio.AbortError):
                raise
            except NotImplementedError:
                await self._unimplemented(context, method)
            except Exception as exc:
                await self._abort(context, self._convert(exc, method), method)

        return wrapper
