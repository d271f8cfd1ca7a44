"""`helios serve frontend` as a real process: flags, health, Generate, SIGTERM."""

from __future__ import annotations

import asyncio

import grpc
import pytest

from services.common.pb import frontend_pb2, frontend_pb2_grpc
from tests.frontend.conftest import frontend_assets
from tests.frontend.fakes import FakeEngine, Script, ScriptedChoice, UpstreamServer
from tests.support.processes import ServiceProcess

pytestmark = pytest.mark.timeout(180)


async def test_frontend_process_serves_generate_and_stops_cleanly(tmp_path, demo_core):
    engine = FakeEngine()
    tokenizer = frontend_assets("qwen3").tokenizer
    engine.script = Script([ScriptedChoice([tokenizer.encode("Hi"), tokenizer.encode(" there")])])
    address = f"unix://{tmp_path}/frontend.sock"
    async with UpstreamServer(engine) as upstream:
        args = ["serve", "frontend", "--listen", address, "--model", str(demo_core),
                "--engine-address", upstream.address, "--imageprep-address", "",
                "--frontend-workers", "1",
                "--default-chat-template-kwargs", '{"enable_thinking": false}']
        process = ServiceProcess(args, tmp_path / "frontend.log")
        try:
            await asyncio.to_thread(process.wait_grpc_serving, address, 120)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = frontend_pb2_grpc.FrontendStub(channel)
                request = frontend_pb2.GenerateRequest(chat=frontend_pb2.ChatInput(
                    messages=[frontend_pb2.ChatMessage(role="user", text="Hello")]))
                events = [event async for event in stub.Generate(request)]
            assert "".join(e.text.text for e in events) == "Hi there"
            prompt = tokenizer.decode(engine.requests[0].prompt_token_ids)
            assert prompt.endswith("assistant\n<think>\n\n</think>\n\n")  # the configured default
            assert await asyncio.to_thread(process.terminate) == 0
        finally:
            await asyncio.to_thread(process.stop)


async def test_sigterm_waits_for_active_generations_then_cancels_them(tmp_path, demo_core):
    engine = FakeEngine()
    tokenizer = frontend_assets("qwen3").tokenizer
    engine.script = Script([ScriptedChoice([tokenizer.encode("a"), tokenizer.encode("b"),
                                            tokenizer.encode("c")])], hang_after_messages=2)
    address = f"unix://{tmp_path}/frontend.sock"
    async with UpstreamServer(engine) as upstream:
        args = ["serve", "frontend", "--listen", address, "--model", str(demo_core),
                "--engine-address", upstream.address, "--imageprep-address", "",
                "--grace-period-s", "1"]
        process = ServiceProcess(args, tmp_path / "frontend.log")
        try:
            await asyncio.to_thread(process.wait_grpc_serving, address, 120)
            async with grpc.aio.insecure_channel(address) as channel:
                stub = frontend_pb2_grpc.FrontendStub(channel)
                call = stub.Generate(frontend_pb2.GenerateRequest(chat=frontend_pb2.ChatInput(
                    messages=[frontend_pb2.ChatMessage(role="user", text="Hello")])))
                texts = []
                async for event in call:
                    if event.WhichOneof("event") == "text":
                        texts.append(event.text.text)
                        break
                stopping = asyncio.create_task(asyncio.to_thread(process.terminate))
                with pytest.raises(grpc.aio.AioRpcError):
                    async for _event in call:
                        pass
                assert await stopping == 0
            await asyncio.wait_for(engine.cancelled.wait(), 10)
            assert "waiting up to 1.0 s for 1 active generation" in process.output()
        finally:
            await asyncio.to_thread(process.stop)
