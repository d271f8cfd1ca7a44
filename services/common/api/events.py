"""The Generate event stream (proto GenerateEvent), API-neutral.

Per choice `index`: one `Started` (index 0 for the request, after engine admission; a batch
of prompts has one per prompt), then text / reasoning / tool-call deltas, then a `Finish`; last
comes one `UsageReport` with the cumulative usage of the whole request. Deltas and finishes
carry the logprobs of the tokens behind them and, with continuous usage, the usage so far.
The frontend builds these; gateway protocol modules render them into their own shapes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class FinishReason(enum.Enum):
    STOP = "stop"                # EOS or a stop token id (engine)
    LENGTH = "length"            # max_tokens reached or the context is full (engine)
    STOP_STRING = "stop_string"  # a stop string matched (frontend)
    TOOL_CALLS = "tool_calls"    # the output ended in tool calls (frontend)
    CANCELLED = "cancelled"      # aborted by the caller
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    token: str            # text (U+FFFD where the token holds part of a character)
    token_bytes: bytes    # exact bytes
    logprob: float


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """The sampled token's logprob and its best alternatives (highest first)."""

    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    top: tuple[TopLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class Usage:
    """Cumulative token accounting of one request (all choices together)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0       # prompt tokens served from the prefix cache (both tiers)
    reasoning_tokens: int = 0    # completion tokens inside a reasoning block
    cached_tokens_host: int = 0  # of cached_tokens, those the host-memory KV tier brought back

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Started:
    index: int
    request_id: str
    model: str                    # the card id that served it
    prompt_tokens: int
    cached_tokens: int = 0
    prompt_text: str = ""         # completion echo only


@dataclass(frozen=True, slots=True)
class TextDelta:
    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    usage_so_far: Usage | None = None


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    index: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    usage_so_far: Usage | None = None


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """The first delta of a call carries id, type and name; later ones argument fragments,
    whose concatenation is the arguments JSON object."""

    index: int
    tool_index: int               # position of the call within its choice
    id: str = ""
    type: str = ""
    name: str = ""
    arguments: str = ""
    logprobs: tuple[TokenLogprob, ...] = ()
    usage_so_far: Usage | None = None


@dataclass(frozen=True, slots=True)
class Finish:
    index: int
    reason: FinishReason
    stop_sequence: str = ""       # the stop string that matched, if any
    stop_token_id: int | None = None
    logprobs: tuple[TokenLogprob, ...] = ()   # tokens that produced no text (an EOS)
    usage_so_far: Usage | None = None


@dataclass(frozen=True, slots=True)
class PromptTokenLogprob:
    """Prompt token `position`'s logprob given the tokens before it (prompt scoring)."""

    position: int                 # 1..prompt_tokens - 1 (the first token has none)
    token_id: int
    token: str
    token_bytes: bytes
    logprob: float
    rank: int                     # 1 + tokens with a strictly higher logprob
    top: tuple[TopLogprob, ...] = ()   # best alternatives, highest first (ranks 1..k)


@dataclass(frozen=True, slots=True)
class PromptLogprobs:
    """Every prompt token's logprob after the first, once, after `Started` (index: the
    prompt's first choice; its other choices share it)."""

    index: int
    entries: tuple[PromptTokenLogprob, ...]
    first_token_id: int = 0       # the prompt's first token (it has no logprob)
    first_token: str = ""
    first_token_bytes: bytes = b""


@dataclass(frozen=True, slots=True)
class Embedding:
    """An embedding request's pooled, normalized vector (before its `Finish`)."""

    index: int
    values: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Final cumulative usage of the whole request (all choices)."""

    usage: Usage
    index: int = 0


GenerationEvent = (Started | TextDelta | ReasoningDelta | ToolCallDelta | Finish | UsageReport |
                   PromptLogprobs | Embedding)
# The events that carry output of one choice (and may be merged, timed, counted).
OutputDelta = TextDelta | ReasoningDelta | ToolCallDelta
