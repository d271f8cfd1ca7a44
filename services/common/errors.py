"""Typed errors shared by every service.

One exception class per error *kind* of the contract (proto `helios.v1.ErrorKind`). Each error
keeps its cause (`raise ... from exc`), the stage it happened in (admission, execution,
frontend), the configured hint, and token counts where they apply. Conversion to and from gRPC
status + `ErrorDetail` lives in `services.common.grpc_errors`; the gateway maps kinds to HTTP.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorKind(enum.Enum):
    VALIDATION = "validation"
    UNSUPPORTED = "unsupported"
    CONTEXT_OVERFLOW = "context_overflow"
    CAPACITY = "capacity"
    GRAMMAR = "grammar"
    IMAGE_DECODE = "image_decode"
    MANIFEST = "manifest"
    WORKER_FAILURE = "worker_failure"
    POISONED = "poisoned"
    DRAIN_FAILURE = "drain_failure"
    NOT_FOUND = "not_found"
    UNAVAILABLE = "unavailable"
    CANCELLED = "cancelled"
    INTERNAL = "internal"
    AUTHENTICATION = "authentication"
    RATE_LIMITED = "rate_limited"


class ErrorStage(enum.Enum):
    UNSPECIFIED = "unspecified"
    ADMISSION = "admission"
    EXECUTION = "execution"
    FRONTEND = "frontend"


class HeliosError(Exception):
    """Base of every typed Helios failure. Subclasses fix `kind` and a default `stage`."""

    kind: ClassVar[ErrorKind] = ErrorKind.INTERNAL
    default_stage: ClassVar[ErrorStage] = ErrorStage.EXECUTION

    def __init__(
        self,
        message: str,
        *,
        hint: str = "",
        param: str = "",
        stage: ErrorStage | None = None,
        service: str = "",
        retry_after_s: float | None = None,
        cause: str = "",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.param = param
        self.stage = stage or self.default_stage
        self.service = service
        self.retry_after_s = retry_after_s
        self._cause_text = cause

    @property
    def display_message(self) -> str:
        """The message a client sees: the message, then the configured hint."""
        if self.hint and self.hint not in self.message:
            return f"{self.message} ({self.hint})"
        return self.message

    @property
    def cause_text(self) -> str:
        """The underlying source, for logs: explicit cause text or the exception chain."""
        if self._cause_text:
            return self._cause_text
        cause = self.__cause__ or self.__context__
        parts: list[str] = []
        while cause is not None and len(parts) < 8:
            parts.append(f"{type(cause).__name__}: {cause}")
            cause = cause.__cause__ or cause.__context__
        return " <- ".join(parts)

    def __str__(self) -> str:
        return self.display_message

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, kind={self.kind.value})"


class ValidationError(HeliosError):
    kind = ErrorKind.VALIDATION
    default_stage = ErrorStage.ADMISSION


class UnsupportedError(HeliosError):
    kind = ErrorKind.UNSUPPORTED
    default_stage = ErrorStage.ADMISSION


class ContextOverflowError(HeliosError):
    """Prompt plus requested output tokens do not fit the context."""

    kind = ErrorKind.CONTEXT_OVERFLOW
    default_stage = ErrorStage.ADMISSION

    def __init__(
        self,
        *,
        prompt_tokens: int,
        max_tokens: int,
        context_length: int,
        hint: str = "",
        message: str = "",
        **kwargs,
    ) -> None:
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.context_length = context_length
        message = message or (
            f"This model's maximum context length is {context_length} tokens. However, you "
            f"requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
            f"{max_tokens} for the output)."
        )
        super().__init__(message, hint=hint, **kwargs)


class CapacityError(HeliosError):
    kind = ErrorKind.CAPACITY
    default_stage = ErrorStage.ADMISSION


class GrammarError(HeliosError):
    kind = ErrorKind.GRAMMAR
    default_stage = ErrorStage.ADMISSION


class ImageDecodeError(HeliosError):
    kind = ErrorKind.IMAGE_DECODE
    default_stage = ErrorStage.ADMISSION


class ManifestError(HeliosError):
    kind = ErrorKind.MANIFEST
    default_stage = ErrorStage.ADMISSION


class WorkerFailure(HeliosError):
    kind = ErrorKind.WORKER_FAILURE


class PoisonedError(HeliosError):
    kind = ErrorKind.POISONED


class DrainFailure(HeliosError):
    kind = ErrorKind.DRAIN_FAILURE


class NotFoundError(HeliosError):
    kind = ErrorKind.NOT_FOUND
    default_stage = ErrorStage.ADMISSION


class UnavailableError(HeliosError):
    kind = ErrorKind.UNAVAILABLE
    default_stage = ErrorStage.ADMISSION


class CancelledError(HeliosError):
    kind = ErrorKind.CANCELLED


class InternalError(HeliosError):
    kind = ErrorKind.INTERNAL


class AuthenticationError(HeliosError):
    kind = ErrorKind.AUTHENTICATION
    default_stage = ErrorStage.ADMISSION


class RateLimitedError(HeliosError):
    kind = ErrorKind.RATE_LIMITED
    default_stage = ErrorStage.ADMISSION


ERROR_CLASSES: dict[ErrorKind, type[HeliosError]] = {
    cls.kind: cls
    for cls in (
        ValidationError,
        UnsupportedError,
        ContextOverflowError,
        CapacityError,
        GrammarError,
        ImageDecodeError,
        ManifestError,
        WorkerFailure,
        PoisonedError,
        DrainFailure,
        NotFoundError,
        UnavailableError,
        CancelledError,
        InternalError,
        AuthenticationError,
        RateLimitedError,
    )
}


def make_error(
    kind: ErrorKind,
    message: str,
    *,
    prompt_tokens: int | None = None,
    max_tokens: int | None = None,
    context_length: int | None = None,
    **kwargs,
) -> HeliosError:
    """Build the typed error for `kind` (used when decoding an error from the wire)."""
    cls = ERROR_CLASSES.get(kind, InternalError)
    if cls is ContextOverflowError:
        return ContextOverflowError(
            prompt_tokens=prompt_tokens or 0,
            max_tokens=max_tokens or 0,
            context_length=context_length or 0,
            message=message,
            **kwargs,
        )
    return cls(message, **kwargs)
