"""`Collector`: a request's generation events folded into whole per-choice results.

Non-streaming responses (and Ollama's final line) are built from `ChoiceResult`s: the text,
reasoning, tool calls, logprobs and finish of each choice, plus the request's usage. The
events themselves are the shared API-neutral ones (`services.common.api.events`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from services.common.api.events import (
    Embedding,
    Finish,
    FinishReason,
    GenerationEvent,
    PromptLogprobs,
    ReasoningDelta,
    Started,
    TextDelta,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    UsageReport,
)


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
        self.prompt_logprobs: dict[int, PromptLogprobs] = {}   # a prompt's first choice ->
        self.embeddings: dict[int, tuple[float, ...]] = {}     # choice -> embedding

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
        elif isinstance(event, PromptLogprobs):
            self.prompt_logprobs[event.index] = event
        elif isinstance(event, Embedding):
            self.embeddings[event.index] = event.values
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
            choice = self.choice(event.index)
            choice.finish = event
            choice.logprobs.extend(event.logprobs)   # tokens that produced no text (an EOS)

    def final_usage(self) -> Usage:
        """The reported usage, or one derived from `started` when none arrived."""
        if self.usage is not None:
            return self.usage
        prompt = self.started.prompt_tokens if self.started else 0
        cached = self.started.cached_tokens if self.started else 0
        return Usage(prompt_tokens=prompt, cached_tokens=cached)
