"""Drain (health, cancellation, resource release), prefix-cache events, core failure."""

from __future__ import annotations

import os
import re
import signal
import threading
import time

import grpc
from grpc_health.v1 import health_pb2

from services.common.errors import WorkerFailure
from services.common.grpc_errors import error_from_rpc
from services.common.pb import common_pb2, engine_pb2
from tests.engine.service.conftest import generate_request, start_engine
from tests.support.processes import grpc_status

PROMPT = list(range(2000, 2130))


def test_drain_and_prefix_events(tmp_path, demo_core):
    """Health SERVING only after the core loaded; a subscriber replays cached blocks and sees
    new ones stored; Drain cancels stragglers, confirms the last step, releases the cache
    (the emptied cache is one all-cleared event), turns health NOT_SERVING and refuses new
    work until resumed."""
    with start_engine(tmp_path) as engine:
        output = engine.process.output()
        assert output.index("engine core ready") < output.index("health SERVING")
        list(engine.stub.Generate(generate_request("warm", PROMPT, 3), timeout=60))
        assert engine.load().pages_cached > 0
        events: list[engine_pb2.PrefixEvent] = []
        subscription = engine.stub.SubscribePrefixEvents(
            engine_pb2.SubscribePrefixEventsRequest(replay_existing=True), timeout=120)

        def read():
            try:
                for event in subscription:
                    events.append(event)
            except grpc.RpcError:
                pass

        reader = threading.Thread(target=read)
        reader.start()
        other = list(range(5000, 5000 + 200))
        list(engine.stub.Generate(generate_request("second", other, 2), timeout=60))
        long = engine.stub.Generate(generate_request("straggler", PROMPT[:30], 2500),
                                    timeout=300)
        next(long)
        result = engine.stub.Drain(engine_pb2.DrainRequest(timeout_s=0.5), timeout=60)
        assert result.drained and result.cancelled_requests == 1
        messages = list(long)
        assert messages[-1].outputs[-1].finish_reason == common_pb2.FINISH_REASON_CANCELLED
        assert grpc_status(engine.address) == health_pb2.HealthCheckResponse.NOT_SERVING
        load = engine.load()
        assert load.draining and load.pages_cached == 0 and load.checkpoints_cached == 0
        assert load.pages_free == load.pages_total and load.slots_free == load.slots_total
        late = engine.stub.Generate(generate_request("late", [1, 2], 2), timeout=30)
        try:
            list(late)
            raise AssertionError("admitted while draining")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.UNAVAILABLE
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(e.HasField("cleared") for e in events):
            time.sleep(0.05)
        subscription.cancel()
        reader.join(10)
        stored = [e.stored for e in events if e.HasField("stored")]
        assert stored[0].block_tokens == 64 and len(stored[0].block_hashes) == 2  # replay
        assert stored[0].parent_hash == b""
        assert len(stored[1].block_hashes) == 3                                 # 200 tokens
        assert all(len(h) == 16 for s in stored for h in s.block_hashes)
        assert events[-1].HasField("cleared") and not any(e.HasField("removed") for e in events)
        sequences = [e.sequence for e in events]
        assert sequences == sorted(sequences) and len(set(sequences)) == len(sequences)
        assert len({e.session_id for e in events}) == 1
        # resume reopens the engine after a drain
        engine.stub.ResumeAdmission(engine_pb2.ResumeAdmissionRequest())
        assert grpc_status(engine.address) == health_pb2.HealthCheckResponse.SERVING
        list(engine.stub.Generate(generate_request("after", [1, 2], 2), timeout=60))
        assert engine.process.terminate() == 0


def test_core_death_fails_streams_and_exits_1(tmp_path, demo_core):
    with start_engine(tmp_path) as engine:
        call = engine.stub.Generate(generate_request("doomed", PROMPT, 100_000 // 40),
                                    timeout=300)
        next(call)
        found = re.search(r"engine core ready\s+pid=(\d+)", engine.process.output())
        assert found is not None
        os.kill(int(found.group(1)), signal.SIGKILL)
        try:
            list(call)
            raise AssertionError("the stream survived its engine core")
        except grpc.RpcError as exc:
            assert exc.code() == grpc.StatusCode.INTERNAL
            assert isinstance(error_from_rpc(exc), WorkerFailure)
        assert engine.process.proc.wait(timeout=60) == 1
        assert "exited unexpectedly" in engine.process.output()
