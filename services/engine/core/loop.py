"""EngineCore: the engine-core process's loop around the scheduler and the runner.

    while running:
        handle calls from the servicer (one message type per verb, dispatched by type:
            Submit, Abort, QueryLoad, PauseAdmission, ResumeAdmission, Drain,
            ReplayPrefixBlocks, Shutdown; see core/messages.py)
        plan = scheduler.plan(); step = scheduler.commit(plan, fence); runner.submit(step)
        completion = runner.poll(); updates = scheduler.complete(completion)
        outbox.publish(updates, block events)        # one message per step, never blocking

A request with a grammar whose compilation is not cached yet waits outside the scheduler while
the grammar compiles on a background thread: its `Submit` is answered (admitted, or the
grammar error) once the compilation resolves, and the loop keeps stepping meanwhile.

A failure anywhere in the step notifies every active and queued request (finish ERROR, then a
`Failed` message carrying the typed cause), confirms the runner drained, and ends the loop with
exit code 1. A drain stops admission, lets active requests finish until its deadline, cancels
the rest, confirms the last step finished and only then releases cached resources; a runner
that cannot confirm keeps everything and the drain reports failure.
"""

from __future__ import annotations

import logging
import pickle
import time
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection

from services.common.errors import (
    CancelledError,
    DrainFailure,
    ErrorStage,
    HeliosError,
    InternalError,
    UnavailableError,
    UnsupportedError,
    WorkerFailure,
)
from services.engine.core.build import Engine
from services.engine.core.messages import (
    Abort,
    AdmissionState,
    Call,
    Drain,
    DrainResult,
    ErrorInfo,
    Failed,
    PauseAdmission,
    QueryLoad,
    ReplayPrefixBlocks,
    Reply,
    ResumeAdmission,
    Shutdown,
    Submit,
)
from services.engine.core.outbox import Outbox
from services.engine.core.telemetry import Telemetry, snapshot
from services.engine.grammar import CompiledGrammar
from services.engine.model.moe import expert_load
from services.engine.scheduler.plan import PlanInvalidated
from services.engine.scheduler.requests import Admitted, EngineRequest, FinishReason
from services.engine.vision.preflight import prepare_plan_images

log = logging.getLogger(__name__)

IDLE_POLL_S = 0.05
COMPILE_POLL_S = 0.002      # how often an otherwise idle loop looks at running compilations


@dataclass(slots=True)
class _DrainJob:
    call_id: int
    deadline: float


@dataclass(slots=True)
class _Compiling:
    """A submitted request waiting for its grammar to compile (not yet admitted)."""

    call_id: int
    request: EngineRequest
    future: Future[CompiledGrammar]


class EngineCore:
    def __init__(self, engine: Engine, connection: Connection, outbox: Outbox,
                 session_id: str) -> None:
        self.scheduler = engine.scheduler
        self.runner = engine.runner
        self.grammars = engine.grammars
        self._compiling: list[_Compiling] = []
        self.connection = connection
        self.outbox = outbox
        self.telemetry = Telemetry(session_id)
        self.paused = False
        self.draining = False
        self._drain: _DrainJob | None = None
        self._stopping = False

    # -- the loop ---------------------------------------------------------------------------
    def run(self) -> int:
        while not self._stopping:
            try:
                idle = not self.scheduler.has_work
                self._handle_calls(timeout=(COMPILE_POLL_S if self._compiling else IDLE_POLL_S)
                                   if idle else 0.0)
                if self._compiling:
                    self._admit_compiled()
            except EOFError:
                log.warning("the servicer went away; stopping the engine core")
                self._shutdown()
                return 0
            try:
                self._step()
            except Exception as exc:
                self._fail(exc)
                return 1
            if self._drain is not None:
                self._advance_drain()
        return 0

    def _step(self) -> None:
        """plan -> submit -> complete. With a two-frame runner (window 2) the next step is
        planned and submitted while the last one runs, and the loop waits for the oldest
        completion only when the window is full or nothing new could be planned."""
        scheduler, runner = self.scheduler, self.runner
        submitted = False
        if runner.outstanding < runner.window:
            plan = scheduler.plan()
            if plan is not None:
                fence = scheduler.state.resources.fences.next_fence
                vision = getattr(runner, "vision", None)
                failed = prepare_plan_images(scheduler, vision, plan, fence) \
                    if vision is not None else []
                if failed:      # their images could not be fetched: plan without them
                    self.outbox.publish(failed, scheduler.state.resources.take_block_events())
                    plan = None
            if plan is not None:
                try:
                    runner.submit(scheduler.commit(plan, fence))
                    submitted = True
                except PlanInvalidated:
                    log.debug("plan invalidated before commit; planning again")
        if runner.outstanding and (runner.outstanding >= runner.window or not submitted):
            self._complete(runner.wait())
        while (completion := runner.poll()) is not None:
            self._complete(completion)

    def _complete(self, completion) -> None:
        scheduler = self.scheduler
        step = scheduler.state.in_flight.get(completion.fence)
        lengths = {s.handle: self._prompt_len(s.handle) for s in step.seqs} if step else {}
        updates = scheduler.complete(completion)
        if step is not None:
            self.telemetry.record(step, completion, lengths)
        self.outbox.publish(updates, scheduler.state.resources.take_block_events())

    def _prompt_len(self, handle) -> int:
        seq = self.scheduler.state.running.get(handle.slot)
        return seq.prompt_len if seq is not None else 0

    # -- calls from the servicer ------------------------------------------------------------
    def _handle_calls(self, *, timeout: float) -> None:
        while self.connection.poll(timeout):
            timeout = 0.0
            call = pickle.loads(self.connection.recv_bytes())
            if not isinstance(call, Call):    # no call id to answer: a servicer bug
                log.error("dropped a %s from the servicer: not a Call",
                          type(call).__qualname__)
                continue
            try:
                value = self._dispatch(call)
            except HeliosError as exc:
                self.outbox.reply(Reply(call.call_id, error=ErrorInfo.of(exc)))
                continue
            if value is not _DEFERRED:
                self.outbox.reply(Reply(call.call_id, value))

    def _dispatch(self, call: Call) -> object:
        """One handler per message type; `_DEFERRED` when the reply comes later."""
        match call.message:
            case Submit(request=request):
                return self._submit(call.call_id, request)
            case Abort(request_ids=request_ids):
                return self._abort(request_ids)
            case QueryLoad(query=query):
                model = getattr(self.runner, "model", None)
                return snapshot(self.scheduler, self.telemetry, query,
                                paused=self.paused, draining=self.draining,
                                experts=expert_load(model) if model is not None else None)
            case PauseAdmission():
                self.paused = True
                return self._admission_state()
            case ResumeAdmission():
                self.paused = False
                if self._drain is None:
                    self.draining = False
                return self._admission_state()
            case Drain(timeout_s=timeout_s):
                return self._start_drain(call.call_id, timeout_s)
            case ReplayPrefixBlocks():
                return tuple(self.scheduler.state.resources.cached_blocks())
            case Shutdown():
                self._shutdown()
                return True
        raise InternalError(f"unknown engine-core message {type(call.message).__qualname__} "
                            f"(call {call.call_id})")

    def _admit(self, request: EngineRequest, grammar: CompiledGrammar | None = None
               ) -> Admitted:
        """Queue the request; start fetching its images' pixels (those past its cached
        prefix) so they are on the host when its prefill is planned."""
        admitted = self.scheduler.admit(request, grammar=grammar)
        vision = getattr(self.runner, "vision", None)
        if vision is not None and request.multimodal is not None:
            vision.prefetch(request.multimodal, admitted.usage.cached_tokens)
        return admitted

    def _submit(self, call_id: int, request: EngineRequest) -> Admitted | _Deferred:
        self._check_admission()
        if request.grammar is None:
            return self._admit(request)
        if self.grammars is None:
            raise UnsupportedError("structured outputs are off in this engine "
                                   "(--structured-outputs)", param="grammar")
        compiled = self.grammars.lookup(request.grammar)
        if compiled is not None:
            return self._admit(request, grammar=compiled)
        self._compiling.append(_Compiling(call_id, request,
                                          self.grammars.start(request.grammar)))
        return _DEFERRED

    def _start_drain(self, call_id: int, timeout_s: float) -> _Deferred:
        self.draining = True
        if self._drain is not None:
            raise UnavailableError("a drain is already in progress")
        self._drain = _DrainJob(call_id, time.monotonic() + float(timeout_s))
        return _DEFERRED

    def _check_admission(self) -> None:
        if self.draining:
            raise UnavailableError("the engine is draining", retry_after_s=1.0)
        if self.paused:
            raise UnavailableError("engine admission is paused", retry_after_s=1.0)

    def _admit_compiled(self) -> None:
        """Answer the submits whose grammar finished compiling: admitted, or the error."""
        waiting = []
        for job in self._compiling:
            if not job.future.done():
                waiting.append(job)
                continue
            try:
                compiled = job.future.result()
                self._check_admission()
                value = self._admit(job.request, grammar=compiled)
            except HeliosError as exc:
                self.outbox.reply(Reply(job.call_id, error=ErrorInfo.of(exc)))
                continue
            except Exception as exc:   # the grammar library failed unexpectedly
                error = InternalError(f"compiling the grammar failed: {type(exc).__name__}: "
                                      f"{exc}", stage=ErrorStage.ADMISSION)
                self.outbox.reply(Reply(job.call_id, error=ErrorInfo.of(error)))
                continue
            self.outbox.reply(Reply(job.call_id, value))
        self._compiling = waiting

    def _drop_compiling(self, error: HeliosError, request_ids: set[str] | None = None) -> int:
        """Answer waiting submits (all, or those of `request_ids`) with `error`."""
        dropped = [j for j in self._compiling
                   if request_ids is None or j.request.request_id in request_ids]
        for job in dropped:
            self._compiling.remove(job)
            self.outbox.reply(Reply(job.call_id, error=ErrorInfo.of(error)))
        return len(dropped)

    def _abort(self, request_ids: tuple[str, ...]) -> int:
        aborted = self._drop_compiling(CancelledError("the request was aborted"),
                                       set(request_ids))
        for request_id in request_ids:
            update = self.scheduler.cancel(request_id)
            if update is not None:
                aborted += 1
                self.outbox.publish([update], ())
        return aborted

    def _admission_state(self) -> AdmissionState:
        return AdmissionState(self.paused, self.draining, self.scheduler.num_active)

    # -- drain, shutdown, failure -----------------------------------------------------------
    def _advance_drain(self) -> None:
        job = self._drain
        assert job is not None
        if self.scheduler.num_active and time.monotonic() < job.deadline:
            return
        cancelled = self._cancel_all(FinishReason.CANCELLED)
        result = self._release_after_drain(cancelled)
        self._drain = None
        self.outbox.reply(Reply(job.call_id, result))

    def _release_after_drain(self, cancelled: int) -> DrainResult:
        """Confirm the last step finished; only then release the cache's resources."""
        try:
            while self.scheduler.state.in_flight:
                completion = self.runner.wait()
                self.outbox.publish(self.scheduler.complete(completion), ())
            confirmed = self.runner.drain()
        except HeliosError as exc:
            log.error("drain could not confirm the last step: %s", exc)
            return DrainResult(False, cancelled, f"drain failed, resources kept: {exc}")
        if not confirmed:
            return DrainResult(False, cancelled, "the device did not confirm the last step; "
                                                 "resources kept")
        self.scheduler.state.resources.evict_all()
        self.outbox.publish((), self.scheduler.state.resources.take_block_events())
        return DrainResult(True, cancelled, "drained")

    def _cancel_all(self, reason: FinishReason) -> int:
        self._drop_compiling(UnavailableError("the engine is draining", retry_after_s=1.0))
        self.scheduler.abandon_captures()
        updates = [u for rid in list(self.scheduler.state.requests)
                   if (u := self.scheduler.cancel(rid, reason)) is not None]
        self.outbox.publish(updates, ())
        return len(updates)

    def _shutdown(self) -> None:
        self._cancel_all(FinishReason.CANCELLED)
        if self.grammars is not None:
            self.grammars.close()
        vision = getattr(self.runner, "vision", None)
        if vision is not None:
            vision.ahead.close()            # fetches ahead are abandoned, not awaited
        self._stopping = True
        try:
            while self.scheduler.state.in_flight:
                self.scheduler.complete(self.runner.wait())
            self.runner.drain()
        except HeliosError as exc:
            log.error("shutdown could not drain the runner: %s", exc)

    def _fail(self, exc: BaseException) -> None:
        """The step failed: every request learns why, the runner drains, the loop ends."""
        error = exc if isinstance(exc, HeliosError) else WorkerFailure(
            f"engine core failed: {type(exc).__name__}: {exc}")
        if error is not exc:
            error.__cause__ = exc
        log.error("engine core failed: %s (cause: %s)", error, error.cause_text, exc_info=exc)
        self._drop_compiling(error)
        self.scheduler.fail_all()
        self.scheduler.state.in_flight.clear()
        drained = False
        try:
            drained = self.runner.drain()
        except Exception as drain_exc:   # a poisoned runner: keep its resources
            log.error("drain after failure could not be confirmed: %s", drain_exc)
        if not drained:
            error = DrainFailure(f"{error.message}; the device could not be drained",
                                 cause=error.cause_text)
        self.outbox.send_now(Failed(ErrorInfo.of(error)))
        self._stopping = True


class _Deferred:
    """A handler's result when the reply comes later (grammar compilation, drain)."""

    __slots__ = ()


_DEFERRED = _Deferred()
