"""GeneratePipeline: one Generate request from validation to the final usage event.

    prepare (worker pool: validate, render, tokenize)
      -> images (imageprep Prepare: expanded ids, multimodal inputs, moved message endpoints)
      -> context check (max_tokens resolved)
      -> Engine.Generate: admission -> `started`
      -> per engine message and choice: ChoiceProcessor -> text / reasoning / tool-call deltas,
         `finish` per choice
      -> `usage` (index 0)

Cancellation runs both ways: when the caller goes away the `async with` around the engine
stream cancels the engine call; when every choice is finished early (stop strings, a single
tool call) the pipeline leaves the stream, which cancels it too. Engine and imageprep failures
arrive as their typed errors and propagate unchanged.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator

from services.common.api.events import (
    Embedding,
    GenerationEvent,
    PromptLogprobs,
    PromptTokenLogprob,
    Started,
    TopLogprob,
    Usage,
    UsageReport,
)
from services.common.api.generate import GenerateRequest
from services.common.errors import InternalError, UnavailableError
from services.frontend.generate.choice import ChoiceProcessor
from services.frontend.generate.prepare import RequestPreparer, is_large, resolve_max_tokens
from services.frontend.generate.types import EngineRequest, EngineStep, PreparedRequest
from services.frontend.generate.upstream import EngineClient, ImagePrepClient
from services.frontend.generate.workers import PreparationPool
from services.frontend.model import FrontendModel
from services.frontend.tokenizer import Tokenizer


class GeneratePipeline:
    def __init__(self, model: FrontendModel, pool: PreparationPool, engine: EngineClient,
                 imageprep: ImagePrepClient | None, *, context_hint: str = "") -> None:
        self.model = model
        self.pool = pool
        self.engine = engine
        self.imageprep = imageprep
        self.context_hint = context_hint
        self.preparer = RequestPreparer(model, context_hint=context_hint)

    async def engine_request(self, request: GenerateRequest) -> tuple[PreparedRequest,
                                                                       EngineRequest]:
        """Everything before the engine: preparation, images and the context check."""
        prepared = await self.pool.run(self.preparer.prepare, request, large=is_large(request))
        ids, ends, multimodal = prepared.prompt_token_ids, prepared.checkpoint_token_ends, b""
        if prepared.images:
            tokens = self.model.image_tokens
            if self.imageprep is None or tokens is None:
                raise UnavailableError("images need the imageprep service, which this frontend "
                                       "is not configured with", param="messages")
            expanded = await self.imageprep.expand(
                request_id=request.request_id, tokens=tokens, images=prepared.images,
                prompt_token_ids=ids, message_token_ends=ends)
            ids, ends, multimodal = (expanded.token_ids, expanded.message_token_ends,
                                     expanded.multimodal)
        max_tokens = resolve_max_tokens(prompt_tokens=len(ids),
                                        requested=request.sampling.max_tokens,
                                        context=self.model.max_model_len,
                                        hint=self.context_hint,
                                        pool_tokens=self.model.kv_pool_tokens)
        engine_request = EngineRequest(
            request_id=request.request_id or f"gen-{uuid.uuid4().hex}",
            prompt_token_ids=ids,
            sampling=dataclasses.replace(request.sampling, max_tokens=max_tokens),
            checkpoint_token_ends=ends,
            n=request.num_choices,
            priority=request.priority,
            multimodal=multimodal,
            grammar=prepared.grammar,
            prompt_logprobs=request.prompt_logprobs,
            embed=request.embed,
            cache_salt=request.cache_salt)
        return prepared, engine_request

    async def run(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        prepared, engine_request = await self.engine_request(request)
        choices = [ChoiceProcessor(i, self.model.tokenizer, prepared.output)
                   for i in range(request.num_choices)]
        prompt_tokens = len(engine_request.prompt_token_ids)
        cached_tokens = cached_host = 0

        def usage() -> Usage:
            return Usage(prompt_tokens, sum(c.num_tokens for c in choices), cached_tokens,
                         sum(c.num_reasoning_tokens for c in choices), cached_host)

        async with self.engine.generate(engine_request) as stream:
            first = await anext(stream, None)
            if first is None:
                raise InternalError("the engine ended the stream before admitting the request",
                                    service="engine")
            prompt_tokens = first.usage.prompt_tokens or prompt_tokens
            cached_tokens = first.usage.cached_tokens
            yield Started(0, engine_request.request_id, self.model.name, prompt_tokens,
                          cached_tokens, prepared.echo_text)
            scoring = PromptScoring(self.model.tokenizer, engine_request.prompt_token_ids,
                                    prompt_tokens) \
                if request.prompt_logprobs is not None else None
            step: EngineStep | None = first
            while step is not None:
                cached_tokens = max(cached_tokens, step.usage.cached_tokens)
                cached_host = max(cached_host, step.usage.cached_tokens_host)
                if scoring is not None:
                    for scored in scoring.add(step):
                        yield scored
                for output in step.outputs:
                    if output.embedding:
                        yield Embedding(output.index, output.embedding)
                    if not 0 <= output.index < len(choices):
                        raise InternalError(f"the engine sent choice {output.index} of "
                                            f"{len(choices)}", service="engine")
                    choice = choices[output.index]
                    if choice.finished:
                        continue
                    for event in choice.process(output):
                        if request.continuous_usage:
                            event = dataclasses.replace(event, usage_so_far=usage())
                        yield event
                if all(choice.finished for choice in choices):
                    break  # leaving the stream cancels the engine call (stop strings)
                step = await anext(stream, None)
        if not all(choice.finished for choice in choices):
            raise InternalError("the engine stream ended before every choice finished",
                                service="engine")
        if scoring is not None and not scoring.sent:
            raise InternalError(f"the engine scored {len(scoring.entries)} of "
                                f"{prompt_tokens - 1} prompt positions", service="engine")
        yield UsageReport(usage())


class PromptScoring:
    """Collects the engine's prompt logprobs (they arrive with the prompt's chunks) into one
    `PromptLogprobs` event, sent once every position 1..prompt_tokens - 1 arrived."""

    def __init__(self, tokenizer: Tokenizer, prompt_token_ids: list[int],
                 prompt_tokens: int) -> None:
        self.tokenizer = tokenizer
        self.first = prompt_token_ids[0] if prompt_token_ids else 0
        self.prompt_tokens = prompt_tokens
        self.entries: list[PromptTokenLogprob] = []
        self.sent = False

    def add(self, step: EngineStep) -> list[PromptLogprobs]:
        for output in step.outputs:
            for entry in output.prompt_logprobs:
                text, raw = self.tokenizer.token_piece(entry.token_id)
                top = tuple(TopLogprob(t, *self.tokenizer.token_piece(t), lp)
                            for t, lp in entry.top)
                self.entries.append(PromptTokenLogprob(entry.position, entry.token_id, text,
                                                       raw, entry.logprob, entry.rank, top))
        if self.sent or len(self.entries) < self.prompt_tokens - 1:
            return []
        positions = [e.position for e in self.entries]
        if positions != list(range(1, self.prompt_tokens)):
            raise InternalError("the engine's prompt logprobs are not positions 1.."
                                f"{self.prompt_tokens - 1} in order", service="engine")
        self.sent = True
        text, raw = self.tokenizer.token_piece(self.first)
        return [PromptLogprobs(0, tuple(self.entries), self.first, text, raw)]
