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

from services.common.api.events import GenerationEvent, Started, Usage, UsageReport
from services.common.api.generate import GenerateRequest
from services.common.errors import InternalError, UnavailableError
from services.frontend.generate.choice import ChoiceProcessor
from services.frontend.generate.prepare import RequestPreparer, resolve_max_tokens
from services.frontend.generate.types import EngineRequest, EngineStep, PreparedRequest
from services.frontend.generate.upstream import EngineClient, ImagePrepClient
from services.frontend.generate.workers import PreparationPool
from services.frontend.model import FrontendModel


class GeneratePipeline:
    def __init__(self, model: FrontendModel, pool: PreparationPool, engine: EngineClient,
                 imageprep: ImagePrepClient | None, *, context_hint: str = "") -> None:
        self.model = model
        self.pool = pool
        self.engine = engine
        self.imageprep = imageprep
        self.context_hint = context_hint
        self.preparer = RequestPreparer(model)

    async def engine_request(self, request: GenerateRequest) -> tuple[PreparedRequest,
                                                                       EngineRequest]:
        """Everything before the engine: preparation, images and the context check."""
        prepared = await self.pool.run(self.preparer.prepare, request)
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
                                        hint=self.context_hint)
        engine_request = EngineRequest(
            request_id=request.request_id or f"gen-{uuid.uuid4().hex}",
            prompt_token_ids=ids,
            sampling=dataclasses.replace(request.sampling, max_tokens=max_tokens),
            checkpoint_token_ends=ends,
            n=request.num_choices,
            priority=request.priority,
            multimodal=multimodal,
            grammar=prepared.grammar)
        return prepared, engine_request

    async def run(self, request: GenerateRequest) -> AsyncIterator[GenerationEvent]:
        prepared, engine_request = await self.engine_request(request)
        choices = [ChoiceProcessor(i, self.model.tokenizer, prepared.output)
                   for i in range(request.num_choices)]
        prompt_tokens = len(engine_request.prompt_token_ids)
        cached_tokens = 0

        def usage() -> Usage:
            return Usage(prompt_tokens, sum(c.num_tokens for c in choices), cached_tokens,
                               sum(c.num_reasoning_tokens for c in choices))

        async with self.engine.generate(engine_request) as stream:
            first = await anext(stream, None)
            if first is None:
                raise InternalError("the engine ended the stream before admitting the request",
                                    service="engine")
            prompt_tokens = first.usage.prompt_tokens or prompt_tokens
            cached_tokens = first.usage.cached_tokens
            yield Started(0, engine_request.request_id, self.model.name, prompt_tokens,
                          cached_tokens, prepared.echo_text)
            step: EngineStep | None = first
            while step is not None:
                cached_tokens = max(cached_tokens, step.usage.cached_tokens)
                for output in step.outputs:
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
        yield UsageReport(usage())
