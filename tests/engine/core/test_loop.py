"""EngineCore in-process over a real pipe, with the fake runner: typed calls (every reply
checked against its verb's declared type), drain, failure, unknown messages."""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
import threading
import time
from dataclasses import dataclass
from typing import Any, ClassVar

import pytest

from services.common.errors import InternalError, UnavailableError, WorkerFailure
from services.engine.core.build import CoreInfo, Engine
from services.engine.core.loop import EngineCore
from services.engine.core.messages import (
    Abort,
    Call,
    CallMessage,
    Drain,
    Failed,
    Outgoing,
    PauseAdmission,
    QueryLoad,
    ReplayPrefixBlocks,
    Reply,
    ResumeAdmission,
    Shutdown,
    Submit,
    check_reply,
)
from services.engine.core.outbox import Outbox
from services.engine.core.telemetry import LoadQuery
from services.engine.prefix.records import BlockEvent
from tests.engine.scheduler.conftest import make_engine, prompt_of, request


@dataclass(frozen=True, slots=True)
class Bogus(CallMessage[int]):
    """A verb the core does not know (not one of CoreCall)."""

    reply_type: ClassVar[Any] = int
    value: int = 0


class Harness:
    def __init__(self, **engine_args) -> None:
        self.scheduler, self.runner = make_engine(**engine_args)
        info = CoreInfo("cpu", "float32", 4, 256, 32, 4096, 4, 64, 0, 1000)
        self.ours, theirs = multiprocessing.Pipe(duplex=True)
        self.outbox = Outbox(theirs)
        self.core = EngineCore(Engine(self.scheduler, self.runner, info,
                                      self.scheduler.grammars), theirs,
                               self.outbox, "test-session")
        self.exit_code: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.ids = itertools.count(1)
        self.replies: dict[int, Reply] = {}
        self.sent: dict[int, CallMessage] = {}
        self.updates: list = []
        self.failed: Failed | None = None
        self.thread.start()

    def _run(self) -> None:
        self.exit_code = self.core.run()

    def send(self, message: CallMessage) -> int:
        call_id = next(self.ids)
        self.sent[call_id] = message
        # any CallMessage, also verbs the core does not know (Bogus)
        self.ours.send_bytes(pickle.dumps(Call(call_id, message)))  # type: ignore[arg-type]
        return call_id

    def pump(self, until, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not until():
            assert time.monotonic() < deadline, "timed out waiting for the core"
            if self.ours.poll(0.05):
                message = pickle.loads(self.ours.recv_bytes())
                if isinstance(message, Outgoing):
                    for reply in message.replies:
                        self.replies[reply.call_id] = reply
                    self.updates.extend(message.updates)
                elif isinstance(message, Failed):
                    self.failed = message

    def call(self, message: CallMessage):
        """Send `message`, wait for its reply: the value (checked against the verb's declared
        reply type, as the servicer does) or the typed error raised."""
        return self.result(self.send(message))

    def result(self, call_id: int):
        self.pump(lambda: call_id in self.replies)
        reply = self.replies[call_id]
        if reply.error is not None:
            raise reply.error.error()
        return check_reply(self.sent[call_id], reply.value)

    def finished(self, request_id: str) -> bool:
        return any(u.request_id == request_id and u.finished for u in self.updates)

    def stop(self) -> None:
        if self.thread.is_alive():
            assert self.call(Shutdown()) is True
        self.thread.join(10)


@pytest.fixture
def harness():
    created: list[Harness] = []

    def make(**kwargs) -> Harness:
        created.append(Harness(**kwargs))
        return created[-1]
    yield make
    for h in created:
        h.stop()


def test_submit_runs_to_completion_and_load_reports_it(harness):
    h = harness()
    admitted = h.call(Submit(request("a", prompt_of(40), 5)))
    assert admitted.usage.prompt_tokens == 40
    h.pump(lambda: h.finished("a"))
    h.pump(lambda: not h.scheduler.has_work)     # a's terminal capture, before telemetry is on
    tokens = [t for u in h.updates for d in u.deltas for t in d.token_ids]
    assert len(tokens) == 5
    load = h.call(QueryLoad(LoadQuery(include_requests=True, include_graphs=True,
                                              completions_after=0)))
    assert load.requests_completed == 1 and load.generation_tokens == 5
    assert load.launches_by_kind["prefill"] >= 1 and load.graphs
    assert load.completions == ()      # telemetry was off until this query asked for it
    h.call(Submit(request("b", prompt_of(20), 3)))
    h.pump(lambda: h.finished("b"))
    h.pump(lambda: not h.scheduler.has_work)     # the terminal capture step too
    load = h.call(QueryLoad(LoadQuery(completions_after=0)))
    kinds = [record.kind for record in load.completions]
    assert kinds == ["prefill", "decode", "decode", "snapshot"]
    assert sum(r.output_tokens for r in load.completions) == 3
    assert load.completions[0].prompt_tokens == 20
    sequences = [r.sequence for r in load.completions]
    assert sequences == sorted(sequences)
    later = h.call(QueryLoad(LoadQuery(completions_after=sequences[-1])))
    assert later.completions == ()


def test_pause_refuses_submissions_until_resumed(harness):
    h = harness()
    assert h.call(PauseAdmission()).paused
    with pytest.raises(UnavailableError, match="paused"):
        h.call(Submit(request("a", prompt_of(5), 2)))
    assert not h.call(ResumeAdmission()).paused
    h.call(Submit(request("a", prompt_of(5), 2)))
    h.pump(lambda: h.finished("a"))


def test_drain_cancels_waits_for_the_last_step_and_releases_the_cache(harness):
    h = harness()
    h.call(Submit(request("done", prompt_of(30), 2)))
    h.pump(lambda: h.finished("done"))
    h.pump(lambda: not h.scheduler.has_work)     # done's terminal capture ran: the gate below
    h.runner.gate = threading.Event()              # holds the loop inside slow's first step
    h.call(Submit(request("slow", prompt_of(30), 900)))
    drain = h.send(Drain(0.0))
    h.runner.gate.set()
    h.pump(lambda: drain in h.replies)
    result = h.result(drain)
    assert result.drained and result.cancelled_requests == 1
    assert h.finished("slow")
    res = h.scheduler.state.resources
    assert res.cache.num_checkpoints == 0 and res.pages.num_free == res.pages.capacity
    with pytest.raises(UnavailableError, match="draining"):
        h.call(Submit(request("late", prompt_of(5), 2)))


def test_a_drain_that_cannot_confirm_keeps_resources(harness):
    h = harness()
    h.call(Submit(request("done", prompt_of(30), 2)))
    h.pump(lambda: h.finished("done"))
    h.pump(lambda: not h.scheduler.has_work)
    cached = h.scheduler.state.resources.cache.num_checkpoints
    assert cached == 2                           # the prompt and the terminal state
    h.runner.drain_ok = False
    result = h.call(Drain(0.0))
    assert not result.drained and "kept" in result.message
    assert h.scheduler.state.resources.cache.num_checkpoints == cached


def test_a_failing_step_fails_every_request_and_ends_with_exit_1(harness):
    h = harness(max_num_seqs=1)
    h.runner.fail_at = 3
    h.runner.gate = threading.Event()           # the loop waits inside its first step
    h.call(Submit(request("active", prompt_of(10), 50)))
    queued = h.send(Submit(request("queued", prompt_of(10), 50)))
    h.runner.gate.set()
    h.pump(lambda: h.failed is not None)
    assert h.replies[queued].error is None       # admitted (then failed with the rest)
    h.thread.join(10)
    assert h.exit_code == 1
    error = h.failed.error.error()
    assert isinstance(error, WorkerFailure) and "injected device fault" in error.cause_text
    counters = h.scheduler.state.counters
    assert counters.requests_failed == 2 and h.scheduler.num_active == 0


def test_abort_and_prefix_replay_answer_with_their_declared_types(harness):
    h = harness()
    h.call(Submit(request("done", prompt_of(130), 2)))
    h.pump(lambda: h.finished("done"))
    h.pump(lambda: not h.scheduler.has_work)
    blocks = h.call(ReplayPrefixBlocks())
    assert isinstance(blocks, tuple) and blocks       # 130 prompt tokens: two full blocks
    assert all(isinstance(b, BlockEvent) and b.stored for b in blocks)
    assert sum(len(b.block_keys) for b in blocks) >= 2
    assert list(blocks) == h.scheduler.state.resources.cache.cached_blocks()
    # sent back to back: "long" (900 tokens) is live when the abort arrives
    submitted = h.send(Submit(request("long", prompt_of(20, salt=1), 900)))
    aborted = h.send(Abort(("long", "unknown")))
    assert h.result(submitted).request_id == "long"
    assert h.result(aborted) == 1
    h.pump(lambda: h.finished("long"))
    assert h.call(Abort(("long",))) == 0              # idempotent
    last = [u for u in h.updates if u.request_id == "long"][-1]
    assert last.deltas[-1].finish_reason.value == "cancelled"


def test_unknown_messages_are_refused_with_an_internal_error(harness):
    h = harness()
    with pytest.raises(InternalError, match="unknown engine-core message Bogus"):
        h.call(Bogus(3))
    call_id = next(h.ids)                             # the old string verb, in the envelope
    h.sent[call_id] = Bogus()
    h.ours.send_bytes(pickle.dumps(Call(call_id, "submit")))  # type: ignore[arg-type]
    with pytest.raises(InternalError, match="unknown engine-core message str"):
        h.result(call_id)
    h.ours.send_bytes(pickle.dumps(("pause", None)))  # no envelope, no id: dropped
    state = h.call(PauseAdmission())                  # and the loop went on
    assert state.paused and not h.core.draining


def test_a_reply_of_the_wrong_type_is_a_worker_failure_naming_both(harness):
    h = harness()
    h.core._abort = lambda request_ids: list(request_ids)   # a core answering the wrong type
    with pytest.raises(WorkerFailure, match="answered Abort with list, expected int"):
        h.call(Abort(("a",)))
    h.core._admission_state = lambda: True
    with pytest.raises(WorkerFailure, match="answered PauseAdmission with bool, expected "
                                            "AdmissionState"):
        h.call(PauseAdmission())
