"""`helios run --demo` generates through the engine: an HTTP chat completion is served by the
engine core (its counters move), and a stream straight from the engine socket is aborted
mid-way with its slot and pages coming back."""

from __future__ import annotations

import grpc
import httpx

from services.common.pb import common_pb2, engine_pb2, engine_pb2_grpc
from tests.engine.service.conftest import generate_request
from tests.support.processes import HeliosRun


def test_run_demo_generates_through_the_engine(tmp_path, demo_core):
    with HeliosRun.start_demo(tmp_path) as run:
        channel = grpc.insecure_channel(run.addresses["engine"])
        stub = engine_pb2_grpc.EngineStub(channel)
        before = stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=10)
        response = httpx.post(run.url + "/v1/chat/completions", timeout=120, json={
            "model": "helios-demo", "max_tokens": 7, "temperature": 0,
            "messages": [{"role": "user", "content": "Hello"}]})
        assert response.status_code == 200, response.text
        body = response.json()
        assert body["usage"]["completion_tokens"] >= 1
        after = stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=10)
        assert after.requests_admitted == before.requests_admitted + 1
        assert after.generation_tokens - before.generation_tokens == \
            body["usage"]["completion_tokens"]
        # straight from the engine socket: stream, abort mid-way, everything comes back
        call = stub.Generate(generate_request("direct", list(range(300, 400)), 3000),
                             timeout=300)
        messages = [next(call) for _ in range(4)]
        assert messages[0].usage.prompt_tokens == 100
        reply = stub.Abort(engine_pb2.AbortRequest(request_ids=["direct"]), timeout=10)
        assert reply.num_aborted == 1
        rest = list(call)
        assert rest[-1].outputs[-1].finish_reason == common_pb2.FINISH_REASON_CANCELLED
        load = stub.GetLoad(engine_pb2.GetLoadRequest(), timeout=10)
        assert load.slots_free == load.slots_total and load.num_running == 0
        assert load.pages_free + load.pages_cached == load.pages_total
        channel.close()
        assert run.terminate() == 0
