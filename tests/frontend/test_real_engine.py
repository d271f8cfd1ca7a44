"""Generate through the real engine process with the demo core (CPU): the whole frontend path
against real token streams, greedy determinism and prefix reuse at message endpoints."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.common.pb import common_pb2, frontend_pb2, frontend_pb2_grpc
from tests.support.processes import ServiceProcess

pytestmark = pytest.mark.timeout(300)

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer briefly." for i in range(40))


def request(*turns: str, max_tokens: int = 12, **fields) -> frontend_pb2.GenerateRequest:
    messages = [frontend_pb2.ChatMessage(role="system", text=SYSTEM)]
    for index, text in enumerate(turns):
        messages.append(frontend_pb2.ChatMessage(role="user" if index % 2 == 0 else "assistant",
                                                 text=text))
    return frontend_pb2.GenerateRequest(
        chat=frontend_pb2.ChatInput(messages=messages),
        sampling=common_pb2.SamplingParams(temperature=0.0, max_tokens=max_tokens), **fields)


async def run(stub, message) -> list[frontend_pb2.GenerateEvent]:
    return [event async for event in stub.Generate(message)]


async def test_generate_through_the_real_engine(tmp_path, demo_core):
    engine_address = f"unix://{tmp_path}/engine.sock"
    frontend_address = f"unix://{tmp_path}/frontend.sock"
    engine = ServiceProcess(["serve", "engine", "--listen", engine_address, "--model",
                             str(demo_core), "--device", "cpu", "--max-num-seqs", "4"],
                            tmp_path / "engine.log")
    frontend = ServiceProcess(["serve", "frontend", "--listen", frontend_address, "--model",
                               str(demo_core), "--engine-address", engine_address,
                               "--imageprep-address", ""], tmp_path / "frontend.log")
    try:
        await asyncio.to_thread(engine.wait_grpc_serving, engine_address, 240)
        await asyncio.to_thread(frontend.wait_grpc_serving, frontend_address, 120)
        async with grpc.aio.insecure_channel(frontend_address) as channel:
            stub = frontend_pb2_grpc.FrontendStub(channel)
            first = await run(stub, request("Hello!", parse_reasoning=False))
            again = await run(stub, request("Hello!", parse_reasoning=False))
            kinds = [e.WhichOneof("event") for e in first]
            assert kinds[0] == "started" and kinds[-2:] == ["finish", "usage"]
            finish, usage = first[-2].finish, first[-1].usage
            assert finish.reason in (common_pb2.FINISH_REASON_LENGTH,
                                     common_pb2.FINISH_REASON_STOP)
            assert 0 < usage.completion_tokens <= 12
            assert usage.prompt_tokens == first[0].started.prompt_tokens > 300
            text = "".join(e.text.text for e in first if e.WhichOneof("event") == "text")
            assert text == "".join(e.text.text for e in again if e.WhichOneof("event") == "text")
            # The second identical prompt reuses the first one's cached prefix.
            assert again[0].started.cached_tokens > 0
            # A stop string cut at the first character of the greedy output ends it there.
            if text.strip():
                stop = text.strip()[0]
                cut = await run(stub, request("Hello!", parse_reasoning=False, stop=[stop]))
                assert cut[-2].finish.reason == common_pb2.FINISH_REASON_STOP_STRING
                assert stop not in "".join(e.text.text for e in cut
                                           if e.WhichOneof("event") == "text")
            # n = 2 choices, each finished, usage over both.
            two = await run(stub, request("Hi", n=2, parse_reasoning=False, max_tokens=5))
            assert sorted(e.index for e in two if e.WhichOneof("event") == "finish") == [0, 1]
            assert two[-1].usage.completion_tokens <= 10
        assert await asyncio.to_thread(frontend.terminate) == 0
        assert await asyncio.to_thread(engine.terminate) == 0
    finally:
        await asyncio.to_thread(frontend.stop)
        await asyncio.to_thread(engine.stop)
