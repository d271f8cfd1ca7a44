"""CoreClient against a scripted core on a real pipe: the typed helpers put one message type
per verb on the wire, replies resolve with their declared types, and a reply of another type
fails that call (only that call) with a WorkerFailure naming the verb and both types."""

from __future__ import annotations

import asyncio
import multiprocessing
import pickle
import threading
from collections.abc import Callable

import pytest

from services.common.errors import UnavailableError, WorkerFailure
from services.engine.config import EngineConfig
from services.engine.core.build import CoreInfo
from services.engine.core.client import CoreClient
from services.engine.core.messages import (
    Abort,
    AdmissionState,
    Call,
    CallMessage,
    Drain,
    DrainResult,
    ErrorInfo,
    Outgoing,
    PauseAdmission,
    QueryLoad,
    Ready,
    ReplayPrefixBlocks,
    Reply,
    Submit,
)
from services.engine.core.telemetry import LoadQuery
from services.engine.prefix.records import BlockEvent
from services.engine.scheduler.requests import Admitted, Usage
from tests.engine.scheduler.conftest import request

INFO = CoreInfo("cpu", "float32", 4, 256, 32, 4096, 4, 64, 0, 1000)
EVENT = BlockEvent(True, (b"k" * 16,), b"")


class ScriptedCore:
    """The core's end of the pipe: Ready, then each Call answered by `answer(message)`
    (a Reply value, or an ErrorInfo)."""

    def __init__(self, answer: Callable[[CallMessage], object]) -> None:
        self.client_end, self.end = multiprocessing.Pipe(duplex=True)
        self.answer = answer
        self.received: list[Call] = []
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.end.send_bytes(pickle.dumps(Ready(INFO, "scripted")))
        self.thread.start()

    def _run(self) -> None:
        while True:
            try:
                call = pickle.loads(self.end.recv_bytes())
            except (EOFError, OSError):
                return
            self.received.append(call)
            value = self.answer(call.message)
            reply = (Reply(call.call_id, error=value) if isinstance(value, ErrorInfo)
                     else Reply(call.call_id, value))
            self.end.send_bytes(pickle.dumps(Outgoing(replies=[reply])))


def run_against(answer: Callable[[CallMessage], object], scenario) -> ScriptedCore:
    core = ScriptedCore(answer)

    async def main():
        client = CoreClient(EngineConfig(model="scripted"))
        core.start()
        ready = await client.attach(core.client_end)
        assert ready.session_id == "scripted" and ready.info == INFO
        try:
            await scenario(client)
        finally:
            core.end.close()

    asyncio.run(asyncio.wait_for(main(), 30))
    return core


def correct(message: CallMessage) -> object:
    match message:
        case Submit(request=r):
            return Admitted(r.request_id, Usage(len(r.prompt_token_ids), 0, 0))
        case Abort(request_ids=ids):
            return len(ids)
        case PauseAdmission():
            return AdmissionState(True, False, 0)
        case Drain():
            return DrainResult(True, 0, "drained")
        case ReplayPrefixBlocks():
            return (EVENT,)
    return ErrorInfo.of(UnavailableError(f"scripted core: no {type(message).__name__}"))


def test_typed_helpers_send_one_message_type_per_verb():
    async def scenario(client: CoreClient):
        admitted = await client.submit(request("a", [1, 2, 3], 4))
        assert admitted == Admitted("a", Usage(3, 0, 0))
        assert await client.abort(["a", "b"]) == 2            # any iterable -> a tuple
        assert (await client.pause()).paused
        assert (await client.drain(2)).drained
        assert await client.replay_prefix_blocks() == (EVENT,)
        with pytest.raises(UnavailableError, match="no QueryLoad"):   # errors stay typed
            await client.load(LoadQuery(include_graphs=True))

    core = run_against(correct, scenario)
    messages = [call.message for call in core.received]
    assert [type(m) for m in messages] == [Submit, Abort, PauseAdmission, Drain,
                                           ReplayPrefixBlocks, QueryLoad]
    assert messages[1] == Abort(("a", "b")) and messages[3] == Drain(2.0)
    assert isinstance(messages[3].timeout_s, float)
    assert messages[5] == QueryLoad(LoadQuery(include_graphs=True))
    ids = [call.call_id for call in core.received]
    assert len(set(ids)) == len(ids)


def test_a_mistyped_reply_fails_that_call_with_a_worker_failure_naming_both():
    def wrong(message: CallMessage) -> object:
        match message:
            case Submit():
                return 7
            case Abort():
                return True                                   # a bool is not a count
            case ReplayPrefixBlocks():
                return [EVENT]                                # a list is not a tuple
            case Drain():
                return (EVENT, "not an event")
        return correct(message)

    async def scenario(client: CoreClient):
        with pytest.raises(WorkerFailure, match="answered Submit with int, expected Admitted"):
            await client.submit(request("a", [1, 2], 2))
        with pytest.raises(WorkerFailure, match="answered Abort with bool, expected int"):
            await client.abort(["a"])
        with pytest.raises(WorkerFailure, match=r"answered ReplayPrefixBlocks with list, "
                                                r"expected tuple\[BlockEvent, \.\.\.\]"):
            await client.replay_prefix_blocks()
        with pytest.raises(WorkerFailure, match="answered Drain with tuple, expected "
                                                "DrainResult"):
            await client.drain(0.0)
        # one bad answer fails one call: the client is not poisoned
        assert client.failure is None
        assert (await client.pause()) == AdmissionState(True, False, 0)

    run_against(wrong, scenario)
