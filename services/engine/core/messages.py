"""Messages between the gRPC servicer process and the engine-core process (one duplex pipe).

Plain picklable dataclasses of ints, strings, tuples and bytes: never tensors. Typed errors
cross as `ErrorInfo` and are rebuilt on the other side, keeping kind, stage, hint, counts and
cause (an exception's own pickling would drop its keyword fields).

servicer -> core: `Call(call_id, message)`, where `message` is one of the verbs of `CoreCall`
(Submit, Abort, QueryLoad, PauseAdmission, ResumeAdmission, Drain, ReplayPrefixBlocks,
Shutdown); each verb declares the type of its reply value (`reply_type`). The core dispatches
on the message's type and answers every call with one `Reply` (at once, or later for a submit
whose grammar compiles and for a drain); the servicer checks the value against the verb's
`reply_type` (`check_reply`).
core -> servicer: Ready, then Outgoing batches (replies, per-request updates, prefix-cache block
events: one batch per engine step, coalesced when the servicer reads slowly), Failed.

The call id lives in one envelope (`Call`) rather than in every verb: a verb is then a plain
value the client builds without knowing the id, the client numbers every call in one place,
and the core's deferred answers (grammar compilation, drain) keep only the id.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Generic, TypeVar, get_args, get_origin

from services.common.errors import (
    ContextOverflowError,
    ErrorStage,
    HeliosError,
    WorkerFailure,
    make_error,
)
from services.engine.core.telemetry import LoadQuery, LoadSnapshot
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import Admitted, EngineRequest, RequestUpdate

R = TypeVar("R")

PROCEED = b"proceed"     # servicer -> core, once: the model files are verified, load them


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


# -- reply values that only these messages carry ---------------------------------------------

@dataclass(frozen=True, slots=True)
class AdmissionState:
    """The answer to PauseAdmission and ResumeAdmission."""

    paused: bool
    draining: bool
    active_requests: int


@dataclass(frozen=True, slots=True)
class DrainResult:
    """The answer to Drain: `drained` only once the runner confirmed its last step."""

    drained: bool
    cancelled_requests: int
    message: str


# -- servicer -> core ------------------------------------------------------------------------

class CallMessage(Generic[R]):
    """One verb from the servicer to the core. `reply_type` is the type of the value the core
    answers it with (a class, or `tuple[X, ...]`)."""

    __slots__ = ()
    reply_type: ClassVar[Any]


@dataclass(frozen=True, slots=True)
class Submit(CallMessage[Admitted]):
    """Admit a request. Answered once admitted (after its grammar compiled, if it has one)."""

    reply_type: ClassVar[Any] = Admitted
    request: EngineRequest


@dataclass(frozen=True, slots=True)
class Abort(CallMessage[int]):
    """Cancel requests (queued, running or waiting for their grammar); answered with how
    many were live. Idempotent."""

    reply_type: ClassVar[Any] = int
    request_ids: tuple[str, ...]

    def __post_init__(self) -> None:
        if not isinstance(self.request_ids, tuple) or not all(
                isinstance(request_id, str) for request_id in self.request_ids):
            raise TypeError(f"Abort.request_ids must be a tuple of strings, "
                            f"not {self.request_ids!r}")


@dataclass(frozen=True, slots=True)
class QueryLoad(CallMessage[LoadSnapshot]):
    """GetLoad and the metrics scrape: the core's load snapshot."""

    reply_type: ClassVar[Any] = LoadSnapshot
    query: LoadQuery = field(default_factory=LoadQuery)


@dataclass(frozen=True, slots=True)
class PauseAdmission(CallMessage[AdmissionState]):
    """Refuse new submits (unavailable) until ResumeAdmission; live requests go on."""

    reply_type: ClassVar[Any] = AdmissionState


@dataclass(frozen=True, slots=True)
class ResumeAdmission(CallMessage[AdmissionState]):
    """Admit again (and end the draining state once a drain finished)."""

    reply_type: ClassVar[Any] = AdmissionState


@dataclass(frozen=True, slots=True)
class Drain(CallMessage[DrainResult]):
    """Stop admission, let live requests run for `timeout_s`, cancel the rest, confirm the
    last step, release the cache. Answered when that is done."""

    reply_type: ClassVar[Any] = DrainResult
    timeout_s: float


@dataclass(frozen=True, slots=True)
class ReplayPrefixBlocks(CallMessage[tuple[BlockEvent, ...]]):
    """Every ready checkpoint's blocks as stored events, parents first (SubscribePrefixEvents
    with replay_existing)."""

    reply_type: ClassVar[Any] = tuple[BlockEvent, ...]


@dataclass(frozen=True, slots=True)
class Shutdown(CallMessage[bool]):
    """Cancel everything, drain the runner and end the loop (answered True first)."""

    reply_type: ClassVar[Any] = bool


CoreCall = (Submit | Abort | QueryLoad | PauseAdmission | ResumeAdmission | Drain
            | ReplayPrefixBlocks | Shutdown)
CALL_TYPES: tuple[type[CallMessage[Any]], ...] = get_args(CoreCall)


@dataclass(frozen=True, slots=True)
class Call:
    """The envelope: one verb and the id its Reply will carry."""

    call_id: int
    message: CoreCall


def type_name(expected: Any) -> str:
    """`Admitted`, `int`, `tuple[BlockEvent, ...]`: a reply type as the errors name it."""
    origin = get_origin(expected)
    if origin is None:
        return getattr(expected, "__qualname__", repr(expected))
    args = ", ".join("..." if a is Ellipsis else type_name(a) for a in get_args(expected))
    return f"{type_name(origin)}[{args}]"


def conforms(value: object, expected: Any) -> bool:
    """Whether `value` is of the reply type `expected` (a class, or `tuple[X, ...]`). A bool
    is not an int here, and an int is not a bool."""
    if get_origin(expected) is tuple:
        item, ellipsis = get_args(expected)
        assert ellipsis is Ellipsis, f"only tuple[X, ...] reply types: {expected!r}"
        return isinstance(value, tuple) and all(conforms(v, item) for v in value)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, expected)


def check_reply(message: CallMessage[R], value: object) -> R:
    """`value` as `message`'s reply; a value of another type is a WorkerFailure naming the
    verb, the value's type and the declared one."""
    if not conforms(value, message.reply_type):
        raise WorkerFailure(f"the engine core answered {type(message).__qualname__} with "
                        f"{type(value).__qualname__}, expected "
                        f"{type_name(message.reply_type)}")
    return value  # type: ignore[return-value]


# -- core -> servicer ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class CoreInfo:
    """What the servicer reports about the running core (ModelInfo, GetLoad). Defined here, not
    in build.py, so that the servicer unpickles Ready without importing torch."""

    device: str
    dtype: str
    page_size: int
    num_pages: int
    num_snapshots: int
    max_model_len: int
    max_num_seqs: int
    prefill_chunk_size: int
    kv_cache_bytes: int
    vocab_size: int
    vision: bool = False      # images accepted: a vision model with a pixel source



@dataclass(frozen=True, slots=True)
class Ready:
    info: CoreInfo
    session_id: str


@dataclass(frozen=True, slots=True)
class Reply:
    """The answer to one Call: `value` of the verb's `reply_type`, or `error`."""

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
