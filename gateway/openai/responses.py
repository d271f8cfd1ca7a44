"""/v1/responses: create (streamed or not), retrieve, delete, cancel, list input items.

`store` (the default) keeps the response in the stored-responses table (Redis or memory);
`previous_response_id` continues a stored conversation: its history (earlier inputs and
outputs, without their instructions) comes before this input. An unknown id is a 404, never
silently ignored. The stream is named events with increasing `sequence_number`, no [DONE].
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any, Literal

from fastapi import APIRouter, Query, Request

from gateway.generation import KEEPALIVE, EventStream
from gateway.history import message_from_dict, message_to_dict
from gateway.openai.chat_schema import template_kwargs
from gateway.openai.format import new_id
from gateway.openai.responses_output import ResponseBuilder
from gateway.openai.responses_schema import ResponsesRequest, input_messages
from gateway.request_parts import tool_call_parsing
from gateway.responses_store import StoredResponse
from gateway.schema import check_path_value
from gateway.sse import (
    SSE_KEEPALIVE,
    event_stream,
    sse_event,
    start_generation,
    stream_failure,
)
from gateway.state import GatewayState, gateway_state
from services.common.api.chat import ChatInput, ChatMessage, ToolCall
from services.common.api.events import UsageReport
from services.common.api.generate import GenerateRequest, Sampling
from services.common.errors import HeliosError, NotFoundError, ValidationError

log = logging.getLogger(__name__)
router = APIRouter()

_ITEM_PREFIX = {"function_call": "fc_", "function_call_output": "fco_", "reasoning": "rs_"}


async def _history(state: GatewayState, previous_id: str | None) -> list[ChatMessage]:
    if not previous_id:
        return []
    previous = await state.store.get(previous_id)
    if previous is None:
        raise NotFoundError(f"Previous response with id '{previous_id}' not found.",
                            param="previous_response_id")
    return [message_from_dict(m) for m in previous.history]


def _generation(body: ResponsesRequest, response_id: str,
                conversation: list[ChatMessage]) -> GenerateRequest:
    messages = ([ChatMessage(role="system", content=body.instructions)]
                if body.instructions else []) + conversation
    tools = body.tool_definitions()
    choice = body.tool_choice_domain(tools)
    effort = body.reasoning.effort if body.reasoning else None
    chat = ChatInput(messages=tuple(messages), tools=tools, tool_choice=choice,
                     template_kwargs=template_kwargs(None, effort))
    sampling = Sampling(temperature=body.temperature, top_p=body.top_p,
                        max_tokens=body.max_output_tokens,
                        logprobs=body.logprobs_top is not None,
                        top_logprobs=body.logprobs_top or 0)
    # A stream keeps the usage so far (on every event), so a stream ended early (shutdown,
    # a failure) still reports the tokens it generated.
    return GenerateRequest(request_id=response_id, model=body.model, input=chat,
                             sampling=sampling, response_format=body.response_format(),
                             parse_tool_calls=tool_call_parsing(chat),
                             continuous_usage=bool(body.stream),
                             cache_salt=body.cache_salt or "")


def _output_message(builder: ResponseBuilder) -> ChatMessage:
    """This response's output as one assistant turn, for the stored conversation.

    Only complete calls are replayed: a call cut off by `max_output_tokens` (status
    `incomplete`) or one whose arguments are not a JSON object is left out, so the next turn's
    template never sees invalid arguments (the stored response still shows it as generated).
    """
    calls = tuple(ToolCall(id=item["call_id"], name=item["name"],
                           arguments_json=item["arguments"] or "{}")
                  for item in builder.items if item["type"] == "function_call"
                  and item["status"] == "completed" and item["name"]
                  and _is_object(item["arguments"] or "{}"))
    reasoning = "".join(item["content"][0]["text"] for item in builder.items
                        if item["type"] == "reasoning")
    text = builder.output_text()
    return ChatMessage(role="assistant", content=text if text or not calls else None,
                       tool_calls=calls, reasoning_content=reasoning or None)


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


async def _store(state: GatewayState, body: ResponsesRequest, builder: ResponseBuilder,
                 conversation: list[ChatMessage]) -> None:
    if body.store is False:
        return
    items = [dict(item, id=item.get("id") or new_id(_ITEM_PREFIX.get(str(item.get("type")), "msg_")))
             for item in body.input_items()]
    history = [*conversation, _output_message(builder)] if builder.status != "failed" \
        else conversation
    try:
        await state.store.put(StoredResponse(id=builder.id, response=builder.response(),
                                             input_items=items,
                                             history=[message_to_dict(m) for m in history]))
    except HeliosError as exc:
        # The client still gets the response it paid for; only its later retrieval fails.
        log.error("could not store response %s: %s", builder.id, exc.display_message)


@router.post("/v1/responses", tags=["openai"])
async def create_response(request: Request, body: ResponsesRequest):
    body.check_supported()
    state = gateway_state(request)
    response_id = new_id("resp_")
    conversation = await _history(state, body.previous_response_id) + input_messages(body)
    generation = _generation(body, response_id, conversation)
    builder = ResponseBuilder(body, response_id)
    stream = await start_generation(request, [generation], wait_first=bool(body.stream))
    if body.stream:
        return event_stream(_render(state, body, builder, stream, conversation))
    async for event in stream.events():
        if isinstance(event, UsageReport):
            builder.complete(event)
        elif event is not KEEPALIVE:
            builder.add(event)  # type: ignore[arg-type]
    await _store(state, body, builder, conversation)
    return builder.response()


async def _render(state: GatewayState, body: ResponsesRequest, builder: ResponseBuilder,
                  stream: EventStream, conversation: list[ChatMessage]) -> AsyncIterator[bytes]:
    try:
        for event in builder.start_events():
            yield sse_event(event["type"], event)
        async for item in stream.events(state.config.sse_keepalive_s):
            if item is KEEPALIVE:
                yield SSE_KEEPALIVE
                continue
            events = builder.complete(item) if isinstance(item, UsageReport) \
                else builder.add(item)  # type: ignore[arg-type]
            for event in events:
                yield sse_event(event["type"], event)
    except HeliosError as exc:
        for event in builder.fail(stream_failure(state, exc)):
            yield sse_event(event["type"], event)
    finally:
        await stream.close()
    await _store(state, body, builder, conversation)


async def _stored(request: Request, response_id: str) -> StoredResponse:
    check_path_value(response_id, param="response_id")
    stored = await gateway_state(request).store.get(response_id)
    if stored is None:
        raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
    return stored


@router.get("/v1/responses/{response_id}", tags=["openai"])
async def retrieve_response(request: Request, response_id: str) -> dict[str, Any]:
    return (await _stored(request, response_id)).response


@router.delete("/v1/responses/{response_id}", tags=["openai"])
async def delete_response(request: Request, response_id: str) -> dict[str, Any]:
    check_path_value(response_id, param="response_id")
    if not await gateway_state(request).store.delete(response_id):
        raise NotFoundError(f"Response with id '{response_id}' not found.", param="response_id")
    return {"id": response_id, "object": "response", "deleted": True}


@router.post("/v1/responses/{response_id}/cancel", tags=["openai"])
async def cancel_response(request: Request, response_id: str) -> dict[str, Any]:
    await _stored(request, response_id)
    raise ValidationError("only background responses can be cancelled; this one has already "
                          "finished", param="response_id")


@router.get("/v1/responses/{response_id}/input_items", tags=["openai"])
async def list_input_items(request: Request, response_id: str,
                           order: Literal["asc", "desc"] = "desc",
                           limit: int = Query(20, ge=1, le=100),
                           after: str | None = None) -> dict[str, Any]:
    items = list((await _stored(request, response_id)).input_items)
    if order == "desc":
        items.reverse()
    if after is not None:
        ids = [item["id"] for item in items]
        if after not in ids:
            raise NotFoundError(f"input item '{after}' not found", param="after")
        items = items[ids.index(after) + 1:]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit}
