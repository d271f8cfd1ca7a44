"""POST /v1/completions: raw prompts (text, token ids, or batches of either).

A batch of P prompts with n choices each runs as P frontend calls; choice p * n + j is choice
j of prompt p (OpenAI's numbering). Text is the model's raw output: no reasoning or tool-call
parsing. `echo` prepends the prompt text the frontend reports in `started`.

Prompt scoring (as vLLM serves it): `echo` with `logprobs` returns the prompt tokens' logprobs
(null for the first token) before the output's; `max_tokens: 0` with `echo` scores the prompt
alone (finish_reason length); vLLM's `prompt_logprobs: k` adds `prompt_logprobs` to each
choice (None first, then token id -> {logprob, rank, decoded_token}).
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from gateway.capacity import card_for, check_batch
from gateway.collector import Collector
from gateway.openai.format import (
    completion_logprobs,
    echo_logprobs,
    finish_reason,
    join_logprobs,
    new_id,
    prompt_logprobs_object,
    stop_reason,
    usage_object,
)
from gateway.openai.sampling import SamplingFields
from gateway.openai.stream import ChunkStream, respond
from gateway.schema import ModelName, TokenId, UInt32
from gateway.state import GatewayState, gateway_state, request_id
from services.common.api.chat import CompletionInput
from services.common.api.events import (
    Finish,
    GenerationEvent,
    PromptLogprobs,
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
    model: ModelName = ""
    prompt: str | list[str] | list[TokenId] | list[list[TokenId]]
    max_tokens: UInt32 | None = 16        # 0: score the prompt alone (with echo)
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

    def scored_prompt(self) -> int | None:
        """How many alternatives the prompt's logprobs need (None: not scored)."""
        wanted = self.prompt_logprobs
        if self.echo and self.logprobs is not None:
            wanted = max(wanted or 0, self.logprobs)
        if self.max_tokens == 0:
            if wanted is None and not self.echo:
                raise ValidationError("max_tokens 0 generates nothing: use it with echo "
                                      "(or prompt_logprobs) to score the prompt",
                                      param="max_tokens")
            wanted = wanted or 0
        return wanted

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
            continuous_usage=self.continuous_usage, priority=self.priority,
            prompt_logprobs=self.scored_prompt(), cache_salt=self.cache_salt or "")
            for p, prompt in enumerate(prompts)]


@router.post("/v1/completions", tags=["openai"])
async def completions(request: Request, body: CompletionRequest):
    completion_id = new_id("cmpl-")
    generations = body.to_generations(completion_id)
    if len(generations) > 1:
        state = gateway_state(request)
        cards = await state.frontend.list_models(trace_id=request_id(request))
        check_batch(card_for(cards, body.model), len(generations))
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
        # echo with logprobs streams the prompt with its logprobs, once they arrived
        self.echo_scored = body.echo and body.logprobs is not None

    def echo_text(self, index: int) -> str:
        return self.prompt_text.get(index - index % self.n, "") if self.body.echo else ""

    def whole(self, collector: Collector) -> dict[str, Any]:
        for started in collector.starts.values():
            self.observe_started(started)
        choices = []
        body = self.body
        for choice in collector.choices:
            echo = self.echo_text(choice.index)
            scored = collector.prompt_logprobs.get(choice.index - choice.index % self.n)
            logprobs = None
            if body.logprobs is not None:
                logprobs = completion_logprobs(choice.logprobs, len(echo))
                if self.echo_scored and scored is not None:
                    logprobs = join_logprobs(echo_logprobs(scored, body.logprobs), logprobs)
            result = {
                "index": choice.index, "text": echo + choice.text + choice.reasoning,
                "logprobs": logprobs,
                "finish_reason": finish_reason(choice.finish_reason, False),
                "stop_reason": stop_reason(choice.finish, self.body.stop_token_ids)}
            if body.prompt_logprobs is not None:
                result["prompt_logprobs"] = prompt_logprobs_object(scored, body.prompt_logprobs)
            choices.append(result)
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

    def prompt_choice(self, index: int, event: PromptLogprobs) -> dict[str, Any]:
        """The chunk that streams a scored prompt: its text and logprobs when echoed, and
        vLLM's prompt_logprobs when asked."""
        body = self.body
        text = self.echo_text(index) if self.echo_scored else ""
        self.offsets[index] = self.offsets.get(index, 0) + len(text)
        choice: dict[str, Any] = {
            "index": index, "text": text,
            "logprobs": echo_logprobs(event, body.logprobs or 0) if self.echo_scored else None,
            "finish_reason": None, "stop_reason": None}
        if body.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs_object(event, body.prompt_logprobs)
        return choice

    def frames(self, event: GenerationEvent) -> list[bytes]:
        if isinstance(event, Started):
            self.observe_started(event)
            if self.body.echo and not self.echo_scored:
                return [self.chunk([self.text_choice(i, event.prompt_text)])
                        for i in range(event.index, event.index + self.n)]
            return []
        if isinstance(event, PromptLogprobs):
            return [self.chunk([self.prompt_choice(i, event)])
                    for i in range(event.index, event.index + self.n)]
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
