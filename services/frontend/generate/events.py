"""API-neutral output events of Generate (what the gateway renders per protocol)."""

from __future__ import annotations

from dataclasses import dataclass

from services.frontend.generate.types import FinishReason, UsageCounts


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    token: str            # text (U+FFFD where the token holds part of a character)
    token_bytes: bytes    # exact bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Started:
    request_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int
    prompt_text: str = ""  # completion echo only


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    tool_index: int
    id: str = ""
    type: str = ""
    name: str = ""
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    reason: FinishReason
    stop_sequence: str = ""
    stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class UsageEvent:
    usage: UsageCounts


EventBody = Started | TextDelta | ReasoningDelta | ToolCallEvent | Finish | UsageEvent


@dataclass(frozen=True, slots=True)
class GenerateEvent:
    index: int                                  # choice index
    body: EventBody
    logprobs: tuple[TokenLogprob, ...] = ()     # the tokens behind this delta
    usage_so_far: UsageCounts | None = None     # with continuous_usage
