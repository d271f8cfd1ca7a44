"""EngineCore in-process over a real pipe, with the fake runner: calls, drain, failure."""

from __future__ import annotations

import itertools
import multiprocessing
import pickle
import threading
import time

import pytest

from services.common.errors import UnavailableError, WorkerFailure
from services.engine.core.build import CoreInfo, Engine
from services.engine.core.loop import EngineCore
from services.engine.core.messages import Call, Failed, Outgoing
from services.engine.core.outbox import Outbox
from services.engine.core.telemetry import LoadQuery
from tests.engine.scheduler.conftest import make_engine, prompt_of, request


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
        self.replies: dict[int, object] = {}
        self.updates: list = []
        self.failed: Failed | None = None
        self.thread.start()

    def _run(self) -> None:
        self.exit_code = self.core.run()

    def send(self, verb: str, args=None) -> int:
        call_id = next(self.ids)
        self.ours.send_bytes(pickle.dumps(Call(call_id, verb, args)))
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

    def call(self, verb: str, args=None):
        call_id = self.send(verb, args)
        self.pump(lambda: call_id in self.replies)
        reply = self.replies[call_id]
        if reply.error is not None:
            raise reply.error.error()
        return reply.value

    def finished(self, request_id: str) -> bool:
        return any(u.request_id == request_id and u.finished for u in self.updates)

    def stop(self) -> None:
        if self.thread.is_alive():
            self.call("shutdown")
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
    admitted = h.call("submit", request("a", prompt_of(40), 5))
    assert admitted.usage.prompt_tokens == 40
    h.pump(lambda: h.finished("a"))
    h.pump(lambda: not h.scheduler.has_work)     # a's terminal capture, before telemetry is on
    tokens = [t for u in h.updates for d in u.deltas for t in d.token_ids]
    assert len(tokens) == 5
    load = h.call("load", LoadQuery(include_requests=True, include_graphs=True,
                                    completions_after=0))
    assert load.requests_completed == 1 and load.generation_tokens == 5
    assert load.launches_by_kind["prefill"] >= 1 and load.graphs
    assert load.completions == ()      # telemetry was off until this query asked for it
    h.call("submit", request("b", prompt_of(20), 3))
    h.pump(lambda: h.finished("b"))
    h.pump(lambda: not h.scheduler.has_work)     # the terminal capture step too
    load = h.call("load", LoadQuery(completions_after=0))
    kinds = [record.kind for record in load.completions]
    assert kinds == ["prefill", "decode", "decode", "snapshot"]
    assert sum(r.output_tokens for r in load.completions) == 3
    assert load.completions[0].prompt_tokens == 20
    sequences = [r.sequence for r in load.completions]
    assert sequences == sorted(sequences)
    later = h.call("load", LoadQuery(completions_after=sequences[-1]))
    assert later.completions == ()


def test_pause_refuses_submissions_until_resumed(harness):
    h = harness()
    assert h.call("pause").paused
    with pytest.raises(UnavailableError, match="paused"):
        h.call("submit", request("a", prompt_of(5), 2))
    assert not h.call("resume").paused
    h.call("submit", request("a", prompt_of(5), 2))
    h.pump(lambda: h.finished("a"))


def test_drain_cancels_waits_for_the_last_step_and_releases_the_cache(harness):
    h = harness()
    h.call("submit", request("done", prompt_of(30), 2))
    h.pump(lambda: h.finished("done"))
    h.runner.gate = threading.Event()              # hold the loop inside slow's first step
    h.call("submit", request("slow", prompt_of(30), 900))
    drain = h.send("drain", 0.0)
    h.runner.gate.set()
    h.pump(lambda: drain in h.replies)
    result = h.replies[drain].value
    assert result.drained and result.cancelled_requests == 1
    assert h.finished("slow")
    res = h.scheduler.state.resources
    assert res.cache.num_checkpoints == 0 and res.pages.num_free == res.pages.capacity
    with pytest.raises(UnavailableError, match="draining"):
        h.call("submit", request("late", prompt_of(5), 2))


def test_a_drain_that_cannot_confirm_keeps_resources(harness):
    h = harness()
    h.call("submit", request("done", prompt_of(30), 2))
    h.pump(lambda: h.finished("done"))
    h.pump(lambda: not h.scheduler.has_work)
    cached = h.scheduler.state.resources.cache.num_checkpoints
    assert cached == 2                           # the prompt and the terminal state
    h.runner.drain_ok = False
    result = h.call("drain", 0.0)
    assert not result.drained and "kept" in result.message
    assert h.scheduler.state.resources.cache.num_checkpoints == cached


def test_a_failing_step_fails_every_request_and_ends_with_exit_1(harness):
    h = harness(max_num_seqs=1)
    h.runner.fail_at = 3
    h.runner.gate = threading.Event()           # the loop waits inside its first step
    h.call("submit", request("active", prompt_of(10), 50))
    queued = h.send("submit", request("queued", prompt_of(10), 50))
    h.runner.gate.set()
    h.pump(lambda: h.failed is not None)
    assert h.replies[queued].error is None       # admitted (then failed with the rest)
    h.thread.join(10)
    assert h.exit_code == 1
    error = h.failed.error.error()
    assert isinstance(error, WorkerFailure) and "injected device fault" in error.cause_text
    counters = h.scheduler.state.counters
    assert counters.requests_failed == 2 and h.scheduler.num_active == 0
