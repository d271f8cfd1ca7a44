"""Embeddings for every protocol: inputs -> one prompt-only frontend call each -> vectors.

    result = await embed(request, model="m", inputs=[CompletionInput(text="hi")],
                         dimensions=None, truncate=False)
    result.vectors, result.usage.prompt_tokens, result.model

Each input is a Generate request with `embed` (max_tokens 0, n 1): the engine prefills it
from position 0 and returns the model's pooled, normalized final hidden state. `dimensions`
keeps the first d components and renormalizes them (Matryoshka truncation). `truncate`
(Ollama's default) cuts an input that would not fit the context to its first tokens.
"""

from __future__ import annotations

import base64
import math
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from fastapi import Request

from gateway.sse import start_generation
from gateway.state import gateway_state, request_id
from services.common.api.chat import CompletionInput
from services.common.api.events import Usage
from services.common.api.generate import GenerateRequest, Sampling
from services.common.errors import InternalError, ValidationError

MAX_INPUTS = 2048


@dataclass(frozen=True, slots=True)
class EmbeddingResult:
    vectors: list[list[float]]
    usage: Usage
    model: str


def truncate_dimensions(vector: Sequence[float], dimensions: int | None) -> list[float]:
    """The first `dimensions` components, renormalized (all of them when None)."""
    if dimensions is None:
        return list(vector)
    if not 1 <= dimensions <= len(vector):
        raise ValidationError(f"dimensions must be between 1 and the model's embedding size "
                              f"({len(vector)}), got {dimensions}", param="dimensions")
    head = list(vector[:dimensions])
    norm = math.sqrt(sum(v * v for v in head))
    return [v / norm for v in head] if norm > 0 else head


def base64_floats(vector: Sequence[float]) -> str:
    """Little-endian float32, base64 (OpenAI's encoding_format "base64")."""
    return base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode("ascii")


async def _truncated(request: Request, model: str, inputs: list[CompletionInput]
                     ) -> list[CompletionInput]:
    """Inputs longer than the model's context cut to it (as token ids)."""
    state = gateway_state(request)
    trace = request_id(request)
    cards = await state.frontend.list_models(trace_id=trace)
    card = next((c for c in cards if not model or c.answers_to(model)), None)
    if card is None or not card.max_model_len:
        return inputs
    limit = card.max_model_len
    out = []
    for item in inputs:
        ids = list(item.token_ids) if item.token_ids else \
            await state.frontend.tokenize(model, text=item.text or "", trace_id=trace)
        out.append(CompletionInput(token_ids=tuple(ids[:limit])) if len(ids) > limit else item)
    return out


async def embed(request: Request, *, model: str, inputs: list[CompletionInput],
                dimensions: int | None, truncate: bool) -> EmbeddingResult:
    if not inputs:
        raise ValidationError("input must not be empty", param="input")
    if len(inputs) > MAX_INPUTS:
        raise ValidationError(f"at most {MAX_INPUTS} inputs per request", param="input")
    for index, item in enumerate(inputs):
        if not item.text and not item.token_ids:
            raise ValidationError(f"input {index} is empty", param=f"input[{index}]")
    if dimensions is not None and dimensions < 1:
        raise ValidationError("dimensions must be at least 1", param="dimensions")
    if truncate:
        inputs = await _truncated(request, model, inputs)
    base = f"emb-{uuid.uuid4().hex}"
    generations = [GenerateRequest(
        request_id=base if len(inputs) == 1 else f"{base}-{i}", model=model, input=item,
        sampling=Sampling(max_tokens=0), n=1, embed=True, parse_reasoning=False,
        parse_tool_calls=False) for i, item in enumerate(inputs)]
    stream = await start_generation(request, generations, wait_first=False)
    collector = await stream.collect()
    vectors = []
    for index in range(len(inputs)):
        vector = collector.embeddings.get(index)
        if not vector:
            raise InternalError(f"the engine returned no embedding for input {index}",
                                service="frontend")
        vectors.append(truncate_dimensions(vector, dimensions))
    started = collector.started
    return EmbeddingResult(vectors, collector.final_usage(),
                           started.model if started and started.model else model)
