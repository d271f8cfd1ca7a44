"""GET /v1/models and /v1/models/{model}: the frontend's model cards in OpenAI's list shape.

A model answers to its card id, its checkpoint id (`root`) and every alias, including
repository ids with slashes; unknown names get a JSON 404.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request

from gateway.schema import check_path_value
from gateway.state import gateway_state, request_id
from services.common.api.model_card import ModelCard
from services.common.errors import NotFoundError

router = APIRouter()


def model_object(card: ModelCard) -> dict[str, Any]:
    model = {"id": card.id, "object": "model", "created": card.created,
             "owned_by": card.owned_by, "root": card.root, "parent": None,
             "max_model_len": card.max_model_len, "aliases": list(card.aliases),
             "capabilities": {"tools": card.tools, "vision": card.vision,
                              "reasoning": card.reasoning}}
    if card.vision:       # the core manifest's per-request image limits (0: none of its own)
        model["image_limits"] = {"max_images": card.max_images,
                                 "max_image_bytes": card.max_image_bytes,
                                 "max_image_pixels": card.max_image_pixels}
    return model


async def find_card(request: Request, name: str) -> ModelCard:
    cards = await gateway_state(request).frontend.list_models(trace_id=request_id(request))
    for card in cards:
        if card.answers_to(name):
            return card
    raise NotFoundError(f"The model '{name}' does not exist", param="model")


@router.get("/v1/models", tags=["openai"])
async def list_models(request: Request) -> dict[str, Any]:
    cards = await gateway_state(request).frontend.list_models(trace_id=request_id(request))
    return {"object": "list", "data": [model_object(card) for card in cards]}


@router.get("/v1/models/{model:path}", tags=["openai"])
async def retrieve_model(request: Request, model: str) -> dict[str, Any]:
    return model_object(await find_card(request, check_path_value(model, param="model")))
