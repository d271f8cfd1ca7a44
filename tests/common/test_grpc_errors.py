"""Typed errors cross a real gRPC server and come back as the same typed error."""

from __future__ import annotations

import grpc
import pytest

from services.common import errors
from services.common.grpc_client import open_channel
from services.common.grpc_errors import ErrorInterceptor, error_from_rpc
from services.common.pb import engine_pb2, engine_pb2_grpc

RAISED: dict[str, Exception] = {}


class FailingEngine(engine_pb2_grpc.EngineServicer):
    async def GetModelInfo(self, request, context):
        raise RAISED["error"]

    async def Generate(self, request, context):
        yield engine_pb2.EngineGenerateResponse(request_id=request.request_id)
        raise RAISED["error"]


@pytest.fixture
async def engine_stub(tmp_path):
    server = grpc.aio.server(interceptors=[ErrorInterceptor("engine")])
    engine_pb2_grpc.add_EngineServicer_to_server(FailingEngine(), server)
    address = f"unix://{tmp_path}/e.sock"
    server.add_insecure_port(address)
    await server.start()
    channel = open_channel(address)
    yield engine_pb2_grpc.EngineStub(channel)
    await channel.close()
    await server.stop(None)


CASES = [
    (errors.ValidationError("bad temperature", param="temperature"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.CapacityError("no free slot", hint="raise --max-num-seqs"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.ContextOverflowError(prompt_tokens=4000, max_tokens=200, context_length=4096, hint="raise it"),
     grpc.StatusCode.OUT_OF_RANGE),
    (errors.UnsupportedError("no vision"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.WorkerFailure("core died"), grpc.StatusCode.INTERNAL),
    (errors.PoisonedError("poisoned"), grpc.StatusCode.INTERNAL),
    (errors.DrainFailure("drain unconfirmed"), grpc.StatusCode.INTERNAL),
    (errors.UnavailableError("paused", retry_after_s=2.0), grpc.StatusCode.UNAVAILABLE),
    (errors.ManifestError("tokenizer.json mismatch", param="tokenizer.json"), grpc.StatusCode.FAILED_PRECONDITION),
    (errors.ImageDecodeError("bomb"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.GrammarError("bad schema"), grpc.StatusCode.INVALID_ARGUMENT),
    (errors.NotFoundError("no such model"), grpc.StatusCode.NOT_FOUND),
]


@pytest.mark.parametrize("error, code", CASES, ids=lambda c: getattr(c, "name", type(c).__name__))
async def test_unary_error_round_trip(engine_stub, error, code):
    RAISED["error"] = error
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine_stub.GetModelInfo(engine_pb2.GetModelInfoRequest())
    assert info.value.code() == code
    decoded = error_from_rpc(info.value)
    assert type(decoded) is type(error)
    assert decoded.message == error.message
    assert decoded.hint == error.hint
    assert decoded.param == error.param
    assert decoded.stage == error.stage
    assert decoded.service == "engine"
    assert decoded.retry_after_s == error.retry_after_s
    if isinstance(error, errors.ContextOverflowError):
        assert (decoded.prompt_tokens, decoded.max_tokens, decoded.context_length) == (4000, 200, 4096)
        assert "raise it" in decoded.display_message


async def test_stream_error_after_first_message(engine_stub):
    RAISED["error"] = errors.WorkerFailure("step failed")
    call = engine_stub.Generate(engine_pb2.EngineGenerateRequest(request_id="r1"))
    first = await call.read()
    assert first.request_id == "r1"
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call.read()
    assert isinstance(error_from_rpc(info.value), errors.WorkerFailure)


async def test_unexpected_exception_is_internal_with_cause(engine_stub):
    try:
        raise KeyError("slot 3")
    except KeyError as exc:
        RAISED["error"] = exc
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine_stub.GetModelInfo(engine_pb2.GetModelInfoRequest())
    decoded = error_from_rpc(info.value)
    assert isinstance(decoded, errors.InternalError)
    assert "KeyError" in decoded.message


async def test_unimplemented_rpc_is_unimplemented(engine_stub):
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await engine_stub.Abort(engine_pb2.AbortRequest(request_ids=["x"]))
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_cause_chain_is_kept():
    try:
        try:
            raise OSError("CUDA error 700 in cuStreamSynchronize")
        except OSError as inner:
            raise errors.WorkerFailure("decode step failed") from inner
    except errors.WorkerFailure as exc:
        assert "cuStreamSynchronize" in exc.cause_text
