"""API-neutral generation events (proto GenerateEvent) and the collector for whole responses.

The frontend streams, per choice `index`: one `Started` (index 0, after engine admission), then
text / reasoning / tool-call deltas, then a `Finish`; last comes one `UsageReport` with the
cumulative usage of the whole request. Protocol modules render these into their own shapes;
`Collector` folds them into `ChoiceResult`s for non-streaming responses.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field


class FinishReason(enum.Enum):
    STOP = "stop"                # EOS or a stop token id
    LENGTH = "length"            # max_tokens reached or the context is full
    STOP_STRING = "stop_string"  # a stop string matched
    TOOL_CALLS = "tool_calls"    # the output ended in tool calls
    CANCELLED = "cancelled"
    ERROR = "error"


@dataclass(frozen=True, slots=True)
class TopLogprob:
    token_id: int
    token: str
    token_bytes: bytes
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
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True, slots=True)
class Started:
    index: int
    request_id: str
    model: str
    prompt_tokens: int
    cached_tokens: int = 0
    prompt_text: str = ""         # only for completion echo


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
    """The first delta of a call carries id, type and name; later ones argument fragments."""

    index: int
    tool_index: int
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
    stop_sequence: str = ""
    stop_token_id: int | None = None
    usage_so_far: Usage | None = None


@dataclass(frozen=True, slots=True)
class UsageReport:
    """Final cumulative usage of the whole request (all choices)."""

    usage: Usage
    index: int = 0


GenerationEvent = Started | TextDelta | ReasoningDelta | ToolCallDelta | Finish | UsageReport


@dataclass(slots=True)
class ToolCallResult:
    id: str
    name: str
    arguments: str = ""
    type: str = "function"

    def arguments_object(self) -> dict:
        """The arguments parsed as a JSON object ({} when empty; raw text kept under
        "_raw" when the model produced something that is not an object)."""
        if not self.arguments.strip():
            return {}
        try:
            value = json.loads(self.arguments)
        except ValueError:
            return {"_raw": self.arguments}
        return value if isinstance(value, dict) else {"_raw": self.arguments}


@dataclass(slots=True)
class ChoiceResult:
    """Everything one choice produced."""

    index: int
    text: str = ""
    reasoning: str = ""
    tool_calls: list[ToolCallResult] = field(default_factory=list)
    finish: Finish | None = None
    logprobs: list[TokenLogprob] = field(default_factory=list)

    @property
    def finish_reason(self) -> FinishReason:
        return self.finish.reason if self.finish else FinishReason.STOP


class Collector:
    """Folds a request's events into per-choice results, usage and the started event."""

    def __init__(self) -> None:
        self.started: Started | None = None
        self.starts: dict[int, Started] = {}     # choice index -> started (one per prompt)
        self.usage: Usage | None = None
        self._choices: dict[int, ChoiceResult] = {}

    def choice(self, index: int) -> ChoiceResult:
        result = self._choices.get(index)
        if result is None:
            result = self._choices[index] = ChoiceResult(index)
        return result

    @property
    def choices(self) -> list[ChoiceResult]:
        return [self._choices[i] for i in sorted(self._choices)]

    def add(self, event: GenerationEvent) -> None:
        if isinstance(event, Started):
            self.started = self.started or event
            self.starts[event.index] = event
        elif isinstance(event, UsageReport):
            self.usage = event.usage
        elif isinstance(event, TextDelta):
            choice = self.choice(event.index)
            choice.text += event.text
            choice.logprobs.extend(event.logprobs)
        elif isinstance(event, ReasoningDelta):
            choice = self.choice(event.index)
            choice.reasoning += event.text
            choice.logprobs.extend(event.logprobs)
        elif isinstance(event, ToolCallDelta):
            choice = self.choice(event.index)
            while len(choice.tool_calls) <= event.tool_index:
                choice.tool_calls.append(ToolCallResult(id="", name=""))
            call = choice.tool_calls[event.tool_index]
            call.id = call.id or event.id
            call.name = call.name or event.name
            call.type = event.type or call.type
            call.arguments += event.arguments
            choice.logprobs.extend(event.logprobs)
        elif isinstance(event, Finish):
            self.choice(event.index).finish = event

    def final_usage(self) -> Usage:
        """The reported usage, or one derived from `started` when none arrived."""
        if self.usage is not None:
            return self.usage
        prompt = self.started.prompt_tokens if self.started else 0
        cached = self.started.cached_tokens if self.started else 0
        return Usage(prompt_tokens=prompt, cached_tokens=cached)
