"""POST /v1/completions: raw prompts (text, token ids, or batches of either).

A batch of P prompts with n choices each runs as P frontend calls; choice p * n + j is choice
j of prompt p (OpenAI's numbering). Text is the model's raw output: no reasoning or tool-call
parsing. `echo` prepends the prompt text the frontend reports in `started`.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from gateway.collector import Collector
from gateway.openai.format import (
    completion_logprobs,
    finish_reason,
    new_id,
    stop_reason,
    usage_object,
)
from gateway.openai.sampling import SamplingFields
from gateway.openai.stream import ChunkStream, respond
from gateway.schema import PositiveUInt32, TokenId
from gateway.state import GatewayState, gateway_state
from services.common.api.chat import CompletionInput
from services.common.api.events import (
    Finish,
    GenerationEvent,
    ReasoningDelta,
    Started,
    TextDelta,
    UsageReport,
)
from services.common.api.generate import GenerateRequest
from services.common.errors import UnsupportedError, ValidationError

router = APIRouter()

MAX_BATCH_CHOICES = 1024


class CompletionRequest(SamplingFields):
    model: str = ""
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: PositiveUInt32 | None = 16
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=20)
    best_of: int | None = Field(default=None, ge=1, le=128)
    suffix: str | None = None

    def prompts(self) -> list[CompletionInput]:
        prompt = self.prompt
        if isinstance(prompt, str):
            return [CompletionInput(text=prompt, echo=self.echo)]
        if not prompt:
            raise ValidationError("prompt must not be an empty list", param="prompt")
        if all(isinstance(p, int) for p in prompt):
            return [CompletionInput(token_ids=tuple(prompt), echo=self.echo)]  # type: ignore[arg-type]
        inputs = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                inputs.append(CompletionInput(text=p, echo=self.echo))
            elif isinstance(p, list):
                if not p:
                    raise ValidationError("a token-id prompt must not be empty",
                                          param=f"prompt[{i}]")
                inputs.append(CompletionInput(token_ids=tuple(p), echo=self.echo))
        return inputs

    def to_generations(self, completion_id: str) -> list[GenerateRequest]:
        if self.suffix:
            raise UnsupportedError("suffix is not supported", param="suffix")
        n = self.n or 1
        if self.best_of is not None and self.best_of != n:
            raise UnsupportedError("best_of other than n is not supported", param="best_of")
        prompts = self.prompts()
        if len(prompts) * n > MAX_BATCH_CHOICES:
            raise ValidationError(f"a batch may produce at most {MAX_BATCH_CHOICES} choices "
                                  "(prompts x n)", param="prompt")
        sampling = self.sampling(max_tokens=self.max_tokens, logprobs=self.logprobs is not None,
                                 top_logprobs=self.logprobs or 0)
        return [GenerateRequest(
            request_id=completion_id if len(prompts) == 1 else f"{completion_id}-{p}",
            model=self.model, input=prompt, sampling=sampling, stop=self.stop_strings(),
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            spaces_between_special_tokens=self.spaces_between_special_tokens, n=self.n,
            parse_reasoning=False, parse_tool_calls=False,
            continuous_usage=self.continuous_usage, priority=self.priority)
            for p, prompt in enumerate(prompts)]


@router.post("/v1/completions", tags=["openai"])
async def completions(request: Request, body: CompletionRequest):
    completion_id = new_id("cmpl-")
    generations = body.to_generations(completion_id)
    return await respond(request, generations, streaming=body.streaming,
                         renderer=functools.partial(CompletionRender, gateway_state(request),
                                                    body, completion_id))


class CompletionRender(ChunkStream):
    """text_completion objects and chunks; echo prepends each prompt's text."""

    object_type = "text_completion"
    body: CompletionRequest

    def __init__(self, state: GatewayState, body: CompletionRequest, completion_id: str):
        super().__init__(state, body, completion_id)
        self.n = body.n or 1
        self.prompt_text: dict[int, str] = {}   # first choice index of a prompt -> its text
        self.offsets: dict[int, int] = {}       # choice -> characters sent (logprob offsets)

    def echo_text(self, index: int) -> str:
        return self.prompt_text.get(index - index % self.n, "") if self.body.echo else ""

    def whole(self, collector: Collector) -> dict[str, Any]:
        for started in collector.starts.values():
            self.observe_started(started)
        choices = []
        for choice in collector.choices:
            echo = self.echo_text(choice.index)
            choices.append({
                "index": choice.index, "text": echo + choice.text + choice.reasoning,
                "logprobs": completion_logprobs(choice.logprobs, len(echo))
                if self.body.logprobs is not None else None,
                "finish_reason": finish_reason(choice.finish_reason, False),
                "stop_reason": stop_reason(choice.finish, self.body.stop_token_ids)})
        return {"id": self.id, "object": "text_completion", "created": self.created,
                "model": self.model, "choices": choices, "system_fingerprint": None,
                "usage": usage_object(collector.final_usage())}

    def observe_started(self, event: Started) -> None:
        self.prompt_text[event.index] = event.prompt_text
        self.model = event.model or self.model

    def text_choice(self, index: int, text: str, logprobs: Any = (),
                    finish: Finish | None = None) -> dict[str, Any]:
        offset = self.offsets.get(index, 0)
        self.offsets[index] = offset + len(text)
        return {"index": index, "text": text,
                "logprobs": completion_logprobs(list(logprobs), offset)
                if self.body.logprobs is not None and logprobs else None,
                "finish_reason": finish_reason(finish.reason, False) if finish else None,
                "stop_reason": stop_reason(finish, self.body.stop_token_ids)}

    def frames(self, event: GenerationEvent) -> list[bytes]:
        if isinstance(event, Started):
            self.observe_started(event)
            if self.body.echo:
                return [self.chunk([self.text_choice(i, event.prompt_text)])
                        for i in range(event.index, event.index + self.n)]
            return []
        if isinstance(event, UsageReport):
            return [self.chunk([], usage_object(event.usage))] if self.body.include_usage \
                else []
        so_far = getattr(event, "usage_so_far", None)
        usage = usage_object(so_far) if self.body.continuous_usage and so_far else None
        if isinstance(event, TextDelta | ReasoningDelta) and (event.text or event.logprobs):
            return [self.chunk([self.text_choice(event.index, event.text, event.logprobs)],
                               usage)]
        if isinstance(event, Finish):
            return [self.chunk([self.text_choice(event.index, "", event.logprobs, finish=event)],
                               usage)]
        return []
