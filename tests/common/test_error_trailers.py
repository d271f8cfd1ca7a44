"""Typed errors stay within gRPC's header limits (issue 20 item 9: a 1 MB model name quoted in
a not-found message made the trailer exceed 16 KiB, and the call failed RESOURCE_EXHAUSTED)."""

from __future__ import annotations

import grpc
import pytest

from services.common.errors import NotFoundError
from services.common.grpc_errors import ErrorInterceptor, clip, error_from_rpc
from services.common.grpc_server import server_options
from services.common.pb import frontend_pb2, frontend_pb2_grpc


class Refusing(frontend_pb2_grpc.FrontendServicer):
    async def ListModels(self, request, context):
        name = "m" * 1_000_000
        raise NotFoundError(f"The model '{name}' does not exist", param="model",
                            hint="é" * 100_000)


@pytest.mark.timeout(60)
async def test_a_huge_error_message_arrives_clipped_and_typed():
    server = grpc.aio.server(interceptors=[ErrorInterceptor("test")], options=server_options())
    frontend_pb2_grpc.add_FrontendServicer_to_server(Refusing(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await frontend_pb2_grpc.FrontendStub(channel).ListModels(
                    frontend_pb2.ListModelsRequest(), timeout=30)
    finally:
        await server.stop(None)
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    error = error_from_rpc(info.value)
    assert isinstance(error, NotFoundError) and error.param == "model"
    assert error.message.startswith("The model 'mmm") and error.message.endswith("...")
    assert len(error.message.encode()) <= 768 and len(error.hint.encode()) <= 384


def test_clip_keeps_whole_characters():
    assert clip("short", 10) == "short"
    cut = clip("é" * 10, 9)
    assert cut == "é" * 3 + "..." and len(cut.encode()) <= 9
