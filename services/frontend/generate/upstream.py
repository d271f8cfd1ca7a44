"""The frontend's calls to its upstreams: the engine's Generate stream and imageprep's Prepare.

Failures come back as the upstream's typed error (`error_from_rpc`): an engine CapacityError
reaches the gateway as a CapacityError with its hint. Leaving `EngineStream` (normally, by an
exception, or because the caller was cancelled) cancels the engine call, which is how a stop
string or a client disconnect stops the engine's work on the request.
"""

from __future__ import annotations

from types import TracebackType

import grpc

from services.common.api.chat import ImagePart
from services.common.grpc_errors import error_from_rpc
from services.common.pb import engine_pb2, engine_pb2_grpc, imageprep_pb2_grpc
from services.frontend.convert_upstream import (
    engine_request_to_pb,
    engine_step_from_pb,
    expanded_prompt_from_pb,
    prepare_images_to_pb,
)
from services.frontend.generate.types import EngineRequest, EngineStep, ExpandedPrompt
from services.frontend.model import ImageTokens


class EngineStream:
    """`async with engine.generate(request) as stream: async for step in stream: ...`"""

    def __init__(self, stub: engine_pb2_grpc.EngineStub, request: EngineRequest) -> None:
        self._stub = stub
        self._request = request
        self._call: grpc.aio.UnaryStreamCall | None = None

    async def __aenter__(self) -> EngineStream:
        self._call = self._stub.Generate(engine_request_to_pb(self._request))
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        self.cancel()

    def cancel(self) -> None:
        if self._call is not None and not self._call.done():
            self._call.cancel()

    def __aiter__(self) -> EngineStream:
        return self

    async def __anext__(self) -> EngineStep:
        assert self._call is not None
        try:
            response = await self._call.read()
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        if response is grpc.aio.EOF:
            raise StopAsyncIteration
        return engine_step_from_pb(response)


class EngineClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = engine_pb2_grpc.EngineStub(channel)

    def generate(self, request: EngineRequest) -> EngineStream:
        return EngineStream(self._stub, request)

    async def model_info(self, timeout_s: float = 5.0) -> engine_pb2.ModelInfo | None:
        """The engine's model info (limits), or None if it cannot tell (yet)."""
        try:
            return await self._stub.GetModelInfo(engine_pb2.GetModelInfoRequest(),
                                                 timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return None


class ImagePrepClient:
    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = imageprep_pb2_grpc.ImagePrepStub(channel)

    async def expand(self, *, request_id: str, tokens: ImageTokens, images: tuple[ImagePart, ...],
                     prompt_token_ids: list[int], message_token_ends: tuple[int, ...]
                     ) -> ExpandedPrompt:
        message = prepare_images_to_pb(
            request_id=request_id, profile=tokens.profile, images=images,
            prompt_token_ids=prompt_token_ids, image_token_id=tokens.image_token_id,
            vision_start_token_id=tokens.vision_start_token_id,
            message_token_ends=message_token_ends, limits=tokens.limits)
        try:
            response = await self._stub.Prepare(message)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc
        return expanded_prompt_from_pb(response)
