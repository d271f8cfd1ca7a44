"""Shapes shared by OpenAI chat and completions responses: finish reasons, usage, logprobs."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

from services.common.api.events import Finish, FinishReason, PromptLogprobs, TokenLogprob, Usage

# JSON has no -Infinity: clamp like other OpenAI-compatible servers do.
MIN_LOGPROB = -9999.0


def new_id(prefix: str) -> str:
    return f"{prefix}{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def finish_reason(reason: FinishReason, has_tool_calls: bool) -> str:
    """OpenAI's finish_reason: stop, length or tool_calls (never 'abort' or 'error')."""
    if reason is FinishReason.TOOL_CALLS or (has_tool_calls and reason is FinishReason.STOP):
        return "tool_calls"
    if reason is FinishReason.LENGTH:
        return "length"
    return "stop"


def stop_reason(finish: Finish | None,
                stop_token_ids: Sequence[int] | None) -> str | int | None:
    """vLLM's `stop_reason`: the matched stop string, or the token id when it is one the
    request listed in `stop_token_ids`; null for the model's own end (EOS) and the limit."""
    if finish is None:
        return None
    if finish.stop_sequence:
        return finish.stop_sequence
    if finish.stop_token_id is not None and finish.stop_token_id in (stop_token_ids or ()):
        return finish.stop_token_id
    return None


def cached_details(usage: Usage) -> dict[str, int]:
    """`cached_tokens` counts both KV tiers; with the engine's host-memory tier, the
    `cached_tokens_host` extension says how many of them it brought back (absent when 0)."""
    details = {"cached_tokens": usage.cached_tokens}
    if usage.cached_tokens_host:
        details["cached_tokens_host"] = usage.cached_tokens_host
    return details


def usage_object(usage: Usage) -> dict[str, Any]:
    return {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.total_tokens,
            "prompt_tokens_details": cached_details(usage),
            "completion_tokens_details": {"reasoning_tokens": usage.reasoning_tokens}}


def logprob_value(value: float) -> float:
    return max(float(value), MIN_LOGPROB)


def chat_logprobs(logprobs: list[TokenLogprob] | tuple[TokenLogprob, ...],
                  top_n: int) -> dict[str, Any]:
    return {"content": [
        {"token": lp.token, "logprob": logprob_value(lp.logprob), "bytes": list(lp.token_bytes),
         "top_logprobs": [{"token": t.token, "logprob": logprob_value(t.logprob),
                           "bytes": list(t.token_bytes)} for t in lp.top[:top_n]]}
        for lp in logprobs]}


def completion_logprobs(logprobs: list[TokenLogprob] | tuple[TokenLogprob, ...],
                        text_offset: int) -> dict[str, Any]:
    """Legacy completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
    offsets, position = [], text_offset
    for lp in logprobs:
        offsets.append(position)
        position += len(lp.token)
    return {"tokens": [lp.token for lp in logprobs],
            "token_logprobs": [logprob_value(lp.logprob) for lp in logprobs],
            "top_logprobs": [{t.token: logprob_value(t.logprob) for t in lp.top}
                             for lp in logprobs],
            "text_offset": offsets}


def prompt_logprobs_object(event: PromptLogprobs | None, top_n: int
                           ) -> list[dict[str, Any] | None] | None:
    """vLLM's `prompt_logprobs`: None for the first token, then per prompt token a dict
    token id -> {logprob, rank, decoded_token}: the prompt's token first, then the best
    alternatives (ranks 1..k)."""
    if event is None:
        return None
    out: list[dict[str, Any] | None] = [None]
    for entry in event.entries:
        scored = {str(entry.token_id): {"logprob": logprob_value(entry.logprob),
                                        "rank": entry.rank, "decoded_token": entry.token}}
        for rank, top in enumerate(entry.top[:top_n], 1):
            scored.setdefault(str(top.token_id), {"logprob": logprob_value(top.logprob),
                                                  "rank": rank, "decoded_token": top.token})
        out.append(scored)
    return out


def echo_logprobs(event: PromptLogprobs, top_n: int) -> dict[str, Any]:
    """Legacy completions logprobs of an echoed prompt: the first token's logprob and
    top_logprobs are null; each later token's top_logprobs holds its alternatives and
    itself (as vLLM returns them)."""
    tokens = [event.first_token] + [e.token for e in event.entries]
    offsets, position = [], 0
    for token in tokens:
        offsets.append(position)
        position += len(token)
    top: list[dict[str, float] | None] = [None]
    for entry in event.entries:
        alternatives = {t.token: logprob_value(t.logprob) for t in entry.top[:top_n]}
        alternatives.setdefault(entry.token, logprob_value(entry.logprob))
        top.append(alternatives)
    return {"tokens": tokens,
            "token_logprobs": [None] + [logprob_value(e.logprob) for e in event.entries],
            "top_logprobs": top, "text_offset": offsets}


def join_logprobs(first: dict[str, Any], second: dict[str, Any]) -> dict[str, Any]:
    """Two legacy logprobs objects one after the other (the echoed prompt, the output)."""
    return {key: list(first[key]) + list(second[key]) for key in first}
