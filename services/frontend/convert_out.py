"""Frontend domain objects -> outgoing protobuf (events and responses to the gateway)."""

from __future__ import annotations

from services.common.pb import common_pb2, frontend_pb2
from services.frontend.convert_upstream import FINISH_TO_PB
from services.frontend.generate.events import (
    Finish,
    GenerateEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallEvent,
    UsageEvent,
)
from services.frontend.generate.types import UsageCounts


def usage_to_pb(usage: UsageCounts) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=usage.prompt_tokens,
                            completion_tokens=usage.completion_tokens,
                            cached_tokens=usage.cached_tokens,
                            reasoning_tokens=usage.reasoning_tokens)


def _logprob_to_pb(logprob: TokenLogprob) -> frontend_pb2.TokenLogprobInfo:
    return frontend_pb2.TokenLogprobInfo(
        token_id=logprob.token_id, token=logprob.token, token_bytes=logprob.token_bytes,
        logprob=logprob.logprob,
        top=[frontend_pb2.TopLogprobInfo(token_id=t.token_id, token=t.token,
                                         token_bytes=t.token_bytes, logprob=t.logprob)
             for t in logprob.top])


def event_to_pb(event: GenerateEvent) -> frontend_pb2.GenerateEvent:
    message = frontend_pb2.GenerateEvent(index=event.index,
                                         logprobs=[_logprob_to_pb(lp) for lp in event.logprobs])
    body = event.body
    if isinstance(body, TextDelta):
        message.text.text = body.text
    elif isinstance(body, ReasoningDelta):
        message.reasoning.text = body.text
    elif isinstance(body, ToolCallEvent):
        message.tool_call.CopyFrom(frontend_pb2.ToolCallDelta(
            tool_index=body.tool_index, id=body.id, type=body.type, name=body.name,
            arguments=body.arguments))
    elif isinstance(body, Finish):
        message.finish.reason = FINISH_TO_PB[body.reason]
        message.finish.stop_sequence = body.stop_sequence
        if body.stop_token_id is not None:
            message.finish.stop_token_id = body.stop_token_id
    elif isinstance(body, Started):
        message.started.CopyFrom(frontend_pb2.Started(
            request_id=body.request_id, model=body.model, prompt_tokens=body.prompt_tokens,
            cached_tokens=body.cached_tokens, prompt_text=body.prompt_text))
    elif isinstance(body, UsageEvent):
        message.usage.CopyFrom(usage_to_pb(body.usage))
    if event.usage_so_far is not None:
        message.usage_so_far.CopyFrom(usage_to_pb(event.usage_so_far))
    return message
