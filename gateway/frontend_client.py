"""The gateway's only door to the frontend: domain objects in, domain objects out.

This is the one gateway module that imports `frontend_pb2`. Requests and events are the shared
API-neutral types (`services.common.api`), converted by the same `services.common.api.convert`
functions the frontend's servicer uses; gRPC failures become the typed `HeliosError` they carry
(`services.common.grpc_errors.error_from_rpc`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc

from services.common.api.chat import ChatInput
from services.common.api.convert import (
    chat_input_to_pb,
    event_from_pb,
    generate_request_to_pb,
    model_card_from_pb,
)
from services.common.api.events import GenerationEvent
from services.common.api.generate import GenerateRequest
from services.common.api.model_card import ModelCard
from services.common.grpc_errors import error_from_rpc
from services.common.pb import frontend_pb2, frontend_pb2_grpc

UNARY_TIMEOUT_S = 60.0


class GenerateCall:
    """One running `Frontend.Generate`: iterate for events; `cancel()` cancels the RPC (and so
    the engine request behind it)."""

    def __init__(self, call: grpc.aio.UnaryStreamCall) -> None:
        self._call = call

    async def events(self) -> AsyncIterator[GenerationEvent]:
        try:
            async for pb in self._call:
                yield event_from_pb(pb)
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc

    def cancel(self) -> bool:
        return self._call.cancel()

    def done(self) -> bool:
        return self._call.done()


class FrontendClient:
    """Typed async calls to the frontend over one shared channel."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._stub = frontend_pb2_grpc.FrontendStub(channel)

    @staticmethod
    def _metadata(request_id: str) -> tuple[tuple[str, str], ...]:
        return (("x-request-id", request_id),) if request_id else ()

    def generate(self, request: GenerateRequest, *, trace_id: str = "") -> GenerateCall:
        call = self._stub.Generate(generate_request_to_pb(request),
                                   metadata=self._metadata(trace_id))
        return GenerateCall(call)

    async def _unary(self, method, request, trace_id: str):
        try:
            return await method(request, timeout=UNARY_TIMEOUT_S,
                                metadata=self._metadata(trace_id))
        except grpc.aio.AioRpcError as exc:
            raise error_from_rpc(exc) from exc

    async def list_models(self, *, trace_id: str = "") -> list[ModelCard]:
        response = await self._unary(self._stub.ListModels, frontend_pb2.ListModelsRequest(),
                                     trace_id)
        return [model_card_from_pb(card) for card in response.models]

    async def count_tokens(self, model: str, chat: ChatInput | None = None, text: str = "",
                           *, trace_id: str = "") -> int:
        request = frontend_pb2.CountTokensRequest(model=model)
        if chat is not None:
            chat_input_to_pb(chat, request.chat)
        else:
            request.text = text
        response = await self._unary(self._stub.CountTokens, request, trace_id)
        return response.input_tokens

    async def tokenize(self, model: str, chat: ChatInput | None = None, text: str = "",
                       *, add_special_tokens: bool | None = None,
                       trace_id: str = "") -> list[int]:
        request = frontend_pb2.TokenizeRequest(model=model)
        if chat is not None:
            chat_input_to_pb(chat, request.chat)
        else:
            request.text = text
        if add_special_tokens is not None:
            request.add_special_tokens = add_special_tokens
        response = await self._unary(self._stub.Tokenize, request, trace_id)
        return list(response.token_ids)

    async def detokenize(self, model: str, token_ids: list[int], *,
                         trace_id: str = "") -> str:
        request = frontend_pb2.DetokenizeRequest(model=model, token_ids=token_ids)
        response = await self._unary(self._stub.Detokenize, request, trace_id)
        return response.text
