"""Messages between the gRPC servicer process and the engine-core process (one duplex pipe).

Plain picklable dataclasses of ints, strings, tuples and bytes: never tensors. Typed errors
cross as `ErrorInfo` and are rebuilt on the other side, keeping kind, stage, hint, counts and
cause (an exception's own pickling would drop its keyword fields).

servicer -> core: Call (a verb with a call id; the core answers with one Reply)
core -> servicer: Ready, then Outgoing batches (replies, per-request updates, prefix-cache block
events: one batch per engine step, coalesced when the servicer reads slowly), Failed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from services.common.errors import ContextOverflowError, ErrorStage, HeliosError, make_error
from services.engine.core.build import CoreInfo
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import RequestUpdate


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    kind: str
    message: str
    stage: str = ErrorStage.UNSPECIFIED.value
    hint: str = ""
    param: str = ""
    cause: str = ""
    retry_after_s: float | None = None
    prompt_tokens: int | None = None
    max_tokens: int | None = None
    context_length: int | None = None

    @classmethod
    def of(cls, error: HeliosError) -> ErrorInfo:
        counts: dict[str, Any] = {}
        if isinstance(error, ContextOverflowError):
            counts = dict(prompt_tokens=error.prompt_tokens, max_tokens=error.max_tokens,
                          context_length=error.context_length)
        return cls(kind=error.kind.value, message=error.message, stage=error.stage.value,
                   hint=error.hint, param=error.param, cause=error.cause_text,
                   retry_after_s=error.retry_after_s, **counts)

    def error(self) -> HeliosError:
        from services.common.errors import ErrorKind

        return make_error(ErrorKind(self.kind), self.message, hint=self.hint, param=self.param,
                          stage=ErrorStage(self.stage), service="engine", cause=self.cause,
                          retry_after_s=self.retry_after_s, prompt_tokens=self.prompt_tokens,
                          max_tokens=self.max_tokens, context_length=self.context_length)


# -- servicer -> core ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Call:
    call_id: int
    verb: str            # submit, abort, load, pause, resume, drain, prefix_replay, shutdown
    args: Any = None


# -- core -> servicer ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Ready:
    info: CoreInfo
    session_id: str


@dataclass(frozen=True, slots=True)
class Reply:
    call_id: int
    value: Any = None
    error: ErrorInfo | None = None


@dataclass(slots=True)
class Outgoing:
    """One batch: replies first, then request updates, then block events (in that order)."""

    replies: list[Reply] = field(default_factory=list)
    updates: list[RequestUpdate] = field(default_factory=list)
    block_events: list[BlockEvent] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.replies or self.updates or self.block_events)


@dataclass(frozen=True, slots=True)
class Failed:
    """The core cannot continue; every live request fails with `error`."""

    error: ErrorInfo
