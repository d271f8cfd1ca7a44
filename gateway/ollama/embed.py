"""Ollama's embedding routes, /api/embed and the legacy /api/embeddings, and /api/pull.

`/api/embed` takes `input` (a string or a list of strings), `truncate` (default true: an
input longer than the context is cut to it) and `dimensions`, and answers `embeddings` (one
normalized vector per input) with `prompt_eval_count`; `/api/embeddings` takes `prompt` and
answers `embedding`. `/api/pull` answers an error in Ollama's shape: Helios serves the
models it was started with, from disk; it downloads nothing.
"""

from __future__ import annotations

import time
from typing import Any

from fastapi import APIRouter, Request
from pydantic import Field

from gateway.embeddings import embed
from gateway.ollama.schema import Options, model_name
from gateway.schema import MAX_NAME_CHARS, ApiModel, RequiredModelName
from services.common.api.chat import CompletionInput
from services.common.errors import UnsupportedError, ValidationError

router = APIRouter()


class EmbedRequest(ApiModel):
    model: RequiredModelName
    input: str | list[str]
    truncate: bool | None = True
    dimensions: int | None = Field(default=None, ge=1)
    options: Options | None = None
    keep_alive: float | str | None = None

    def inputs(self) -> list[CompletionInput]:
        values = [self.input] if isinstance(self.input, str) else list(self.input)
        if not values:
            raise ValidationError("input must not be empty", param="input")
        return [CompletionInput(text=v) for v in values]


class EmbeddingsRequest(ApiModel):
    model: RequiredModelName
    prompt: str
    options: Options | None = None
    keep_alive: float | str | None = None


@router.post("/api/embed", tags=["ollama"])
async def embed_route(request: Request, body: EmbedRequest) -> dict[str, Any]:
    started = time.monotonic_ns()
    result = await embed(request, model=model_name(body.model), inputs=body.inputs(),
                         dimensions=body.dimensions, truncate=body.truncate is not False)
    return {"model": result.model, "embeddings": result.vectors,
            "total_duration": time.monotonic_ns() - started, "load_duration": 0,
            "prompt_eval_count": result.usage.prompt_tokens}


@router.post("/api/embeddings", tags=["ollama"])
async def embeddings_route(request: Request, body: EmbeddingsRequest) -> dict[str, Any]:
    if not body.prompt:
        return {"embedding": []}            # Ollama answers an empty prompt with no vector
    result = await embed(request, model=model_name(body.model),
                         inputs=[CompletionInput(text=body.prompt)], dimensions=None,
                         truncate=True)
    return {"embedding": result.vectors[0]}


@router.post("/api/pull", tags=["ollama"])
async def pull(request: Request) -> dict[str, Any]:
    """Whatever the body names (it is not validated: the answer is the same)."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    name = ""
    if isinstance(body, dict):
        name = str(body.get("model") or body.get("name") or "")[:MAX_NAME_CHARS]
    raise UnsupportedError(
        f"pull {name or 'a model'}: Helios does not download models; it serves the models "
        "it was started with, from disk (`helios run <model dir or file.gguf>`)",
        param="model")
