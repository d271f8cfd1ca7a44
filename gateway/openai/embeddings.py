"""POST /v1/embeddings: the served model's embeddings (gateway/embeddings.py).

Input: a string, a list of strings, a list of token ids or a list of token-id lists;
`dimensions` truncates and renormalizes; `encoding_format` "float" (lists of numbers) or
"base64" (little-endian float32, the official SDK's default). Usage counts prompt tokens.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Request
from pydantic import Field

from gateway.embeddings import base64_floats, embed
from gateway.schema import ApiModel, ModelName, TokenId, UserString
from services.common.api.chat import CompletionInput
from services.common.errors import ValidationError

router = APIRouter()


class EmbeddingRequest(ApiModel):
    model: ModelName = ""
    input: str | list[str] | list[TokenId] | list[list[TokenId]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, ge=1)
    user: UserString | None = None

    def inputs(self) -> list[CompletionInput]:
        value = self.input
        if isinstance(value, str):
            return [CompletionInput(text=value)]
        if not value:
            raise ValidationError("input must not be an empty list", param="input")
        if all(isinstance(v, int) for v in value):
            return [CompletionInput(token_ids=tuple(value))]  # type: ignore[arg-type]
        out = []
        for i, item in enumerate(value):
            if isinstance(item, str):
                out.append(CompletionInput(text=item))
            elif isinstance(item, list) and item:
                out.append(CompletionInput(token_ids=tuple(item)))
            else:
                raise ValidationError(f"input[{i}] must be a non-empty string or token list",
                                      param=f"input[{i}]")
        return out


@router.post("/v1/embeddings", tags=["openai"])
async def embeddings(request: Request, body: EmbeddingRequest) -> dict[str, Any]:
    result = await embed(request, model=body.model, inputs=body.inputs(),
                         dimensions=body.dimensions, truncate=False)
    encode = base64_floats if body.encoding_format == "base64" else list
    return {"object": "list", "model": result.model,
            "data": [{"object": "embedding", "index": i, "embedding": encode(vector)}
                     for i, vector in enumerate(result.vectors)],
            "usage": {"prompt_tokens": result.usage.prompt_tokens,
                      "total_tokens": result.usage.prompt_tokens}}
