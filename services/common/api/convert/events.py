"""Generate events <-> `helios.v1.GenerateEvent`; usage, logprobs and finish reasons (which the
frontend also reads from the engine's stream)."""

from __future__ import annotations

from collections.abc import Iterable

from services.common.api.convert.enums import enum_mapping
from services.common.api.events import (
    Embedding,
    Finish,
    FinishReason,
    GenerationEvent,
    PromptLogprobs,
    PromptTokenLogprob,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    TopLogprob,
    Usage,
    UsageReport,
)
from services.common.pb import common_pb2, frontend_pb2

_FINISH = enum_mapping(FinishReason, common_pb2.FinishReason, "FINISH_REASON_")


def finish_reason_to_pb(reason: FinishReason) -> common_pb2.FinishReason:
    return _FINISH.to_pb[reason]


def finish_reason_from_pb(value: common_pb2.FinishReason) -> FinishReason | None:
    """None for UNSPECIFIED (not finished) and for values this build does not know."""
    return _FINISH.from_pb.get(value)


def usage_to_pb(usage: Usage) -> common_pb2.Usage:
    return common_pb2.Usage(prompt_tokens=usage.prompt_tokens,
                            completion_tokens=usage.completion_tokens,
                            cached_tokens=usage.cached_tokens,
                            reasoning_tokens=usage.reasoning_tokens,
                            cached_tokens_host=usage.cached_tokens_host)


def usage_from_pb(pb: common_pb2.Usage) -> Usage:
    return Usage(prompt_tokens=pb.prompt_tokens, completion_tokens=pb.completion_tokens,
                 cached_tokens=pb.cached_tokens, reasoning_tokens=pb.reasoning_tokens,
                 cached_tokens_host=pb.cached_tokens_host)


def _logprobs_to_pb(logprobs: Iterable[TokenLogprob]) -> list[frontend_pb2.TokenLogprobInfo]:
    return [frontend_pb2.TokenLogprobInfo(
        token_id=lp.token_id, token=lp.token, token_bytes=lp.token_bytes, logprob=lp.logprob,
        top=[frontend_pb2.TopLogprobInfo(token_id=t.token_id, token=t.token,
                                         token_bytes=t.token_bytes, logprob=t.logprob)
             for t in lp.top])
        for lp in logprobs]


def _logprobs_from_pb(pb: frontend_pb2.GenerateEvent) -> tuple[TokenLogprob, ...]:
    return tuple(
        TokenLogprob(token_id=lp.token_id, token=lp.token, token_bytes=lp.token_bytes,
                     logprob=lp.logprob,
                     top=tuple(TopLogprob(token_id=t.token_id, token=t.token,
                                          token_bytes=t.token_bytes, logprob=t.logprob)
                               for t in lp.top))
        for lp in pb.logprobs)


def _top_to_pb(top: Iterable[TopLogprob]) -> list[frontend_pb2.TopLogprobInfo]:
    return [frontend_pb2.TopLogprobInfo(token_id=t.token_id, token=t.token,
                                        token_bytes=t.token_bytes, logprob=t.logprob)
            for t in top]


def _top_from_pb(top: Iterable[frontend_pb2.TopLogprobInfo]) -> tuple[TopLogprob, ...]:
    return tuple(TopLogprob(token_id=t.token_id, token=t.token, token_bytes=t.token_bytes,
                            logprob=t.logprob) for t in top)


def event_to_pb(event: GenerationEvent) -> frontend_pb2.GenerateEvent:
    pb = frontend_pb2.GenerateEvent(index=event.index)
    if isinstance(event, PromptLogprobs):
        pb.prompt_logprobs.entries.extend(frontend_pb2.PromptTokenLogprobInfo(
            position=e.position, token_id=e.token_id, token=e.token,
            token_bytes=e.token_bytes, logprob=e.logprob, rank=e.rank,
            top=_top_to_pb(e.top)) for e in event.entries)
        pb.prompt_logprobs.first_token_id = event.first_token_id
        pb.prompt_logprobs.first_token = event.first_token
        pb.prompt_logprobs.first_token_bytes = event.first_token_bytes
        return pb
    if isinstance(event, Embedding):
        pb.embedding.values.extend(event.values)
        return pb
    if isinstance(event, TextDelta):
        pb.text.text = event.text
    elif isinstance(event, ReasoningDelta):
        pb.reasoning.text = event.text
    elif isinstance(event, ToolCallDelta):
        pb.tool_call.CopyFrom(frontend_pb2.ToolCallDelta(
            tool_index=event.tool_index, id=event.id, type=event.type, name=event.name,
            arguments=event.arguments))
    elif isinstance(event, Finish):
        pb.finish.reason = finish_reason_to_pb(event.reason)
        pb.finish.stop_sequence = event.stop_sequence
        if event.stop_token_id is not None:
            pb.finish.stop_token_id = event.stop_token_id
    elif isinstance(event, Started):
        pb.started.CopyFrom(frontend_pb2.Started(
            request_id=event.request_id, model=event.model, prompt_tokens=event.prompt_tokens,
            cached_tokens=event.cached_tokens, prompt_text=event.prompt_text))
    else:
        pb.usage.CopyFrom(usage_to_pb(event.usage))
        return pb
    if not isinstance(event, Started):
        pb.logprobs.extend(_logprobs_to_pb(event.logprobs))
        if event.usage_so_far is not None:
            pb.usage_so_far.CopyFrom(usage_to_pb(event.usage_so_far))
    return pb


def event_from_pb(pb: frontend_pb2.GenerateEvent) -> GenerationEvent:
    kind = pb.WhichOneof("event")
    so_far = usage_from_pb(pb.usage_so_far) if pb.HasField("usage_so_far") else None
    if kind == "text":
        return TextDelta(pb.index, pb.text.text, _logprobs_from_pb(pb), so_far)
    if kind == "reasoning":
        return ReasoningDelta(pb.index, pb.reasoning.text, _logprobs_from_pb(pb), so_far)
    if kind == "tool_call":
        call = pb.tool_call
        return ToolCallDelta(pb.index, call.tool_index, call.id, call.type, call.name,
                             call.arguments, _logprobs_from_pb(pb), so_far)
    if kind == "finish":
        finish = pb.finish
        return Finish(pb.index, finish_reason_from_pb(finish.reason) or FinishReason.STOP,
                      finish.stop_sequence,
                      finish.stop_token_id if finish.HasField("stop_token_id") else None,
                      _logprobs_from_pb(pb), so_far)
    if kind == "started":
        s = pb.started
        return Started(pb.index, s.request_id, s.model, s.prompt_tokens, s.cached_tokens,
                       s.prompt_text)
    if kind == "usage":
        return UsageReport(usage_from_pb(pb.usage), pb.index)
    if kind == "prompt_logprobs":
        scored = pb.prompt_logprobs
        return PromptLogprobs(pb.index, tuple(
            PromptTokenLogprob(e.position, e.token_id, e.token, e.token_bytes, e.logprob,
                               e.rank, _top_from_pb(e.top))
            for e in scored.entries), scored.first_token_id, scored.first_token,
            scored.first_token_bytes)
    if kind == "embedding":
        return Embedding(pb.index, tuple(pb.embedding.values))
    # An empty event (an unknown field from a newer frontend): keep the stream going.
    return TextDelta(pb.index, "", _logprobs_from_pb(pb), so_far)
