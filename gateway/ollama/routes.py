"""Ollama discovery routes: `GET`/`HEAD /`, /api/version, /api/tags, /api/ps, /api/show.

IDE clients that speak only Ollama use these to list models, read the context length from
`model_info` and decide from `capabilities` whether tools, vision and thinking are allowed.
A vision model's per-request image limits (from its core manifest) sit in `model_info` under
`<arch>.vision.request_max_*` keys: Ollama's own `<arch>.vision.*` keys describe the tower
(Qwen-VL's `vision.max_pixels` is a resize bound, not a refusal), so these names stay apart.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fastapi import APIRouter, Request, Response
from fastapi.responses import PlainTextResponse

from gateway.ollama.chat import router as chat_router
from gateway.ollama.schema import ShowRequest
from gateway.state import gateway_state, request_id
from services.common.api.model_card import ModelCard
from services.common.errors import NotFoundError

router = APIRouter()
router.include_router(chat_router)


_DTYPES = {"bfloat16": "BF16", "float16": "F16", "float32": "F32", "float8_e4m3fn": "F8_E4M3"}


def _modified_at(card: ModelCard) -> str:
    return datetime.fromtimestamp(card.created or 0, UTC).isoformat().replace("+00:00", "Z")


def _parameter_size(count: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}".replace(".0" + unit, unit)
    return str(count)


def _details(card: ModelCard) -> dict[str, Any]:
    return {"parent_model": "", "format": "safetensors", "family": card.family,
            "families": [card.family] if card.family else [],
            "parameter_size": _parameter_size(card.num_parameters),
            "quantization_level": _DTYPES.get(card.dtype, card.dtype.upper())}


def _tag(card: ModelCard) -> dict[str, Any]:
    return {"name": card.id, "model": card.id, "modified_at": _modified_at(card),
            "size": card.size_bytes, "digest": card.digest, "details": _details(card)}


def vision_model_info(card: ModelCard, arch: str) -> dict[str, int]:
    """The manifest's image limits of a vision model; a limit of 0 (none of the core's own,
    imageprep's settings apply) is left out rather than shown as 'zero allowed'."""
    if not card.vision:
        return {}
    limits = (("request_max_images", card.max_images),
              ("request_max_image_bytes", card.max_image_bytes),
              ("request_max_image_pixels", card.max_image_pixels))
    return {f"{arch}.vision.{name}": value for name, value in limits if value}


@router.get("/", tags=["ollama"])
async def root() -> Response:
    return PlainTextResponse("Ollama is running")


@router.head("/", tags=["ollama"])
async def root_head() -> Response:
    return Response(status_code=200)


@router.get("/api/version", tags=["ollama"])
async def version(request: Request) -> dict[str, str]:
    return {"version": gateway_state(request).config.ollama_version}


@router.get("/api/tags", tags=["ollama"])
async def tags(request: Request) -> dict[str, Any]:
    cards = await gateway_state(request).frontend.list_models(trace_id=request_id(request))
    return {"models": [_tag(card) for card in cards]}


@router.get("/api/ps", tags=["ollama"])
async def running(request: Request) -> dict[str, Any]:
    cards = await gateway_state(request).frontend.list_models(trace_id=request_id(request))
    return {"models": [{**_tag(card), "expires_at": "9999-12-31T23:59:59Z",
                        "size_vram": card.size_bytes, "context_length": card.max_model_len}
                       for card in cards]}


@router.post("/api/show", tags=["ollama"])
async def show(request: Request, body: ShowRequest) -> dict[str, Any]:
    name = body.model_name()
    cards = await gateway_state(request).frontend.list_models(trace_id=request_id(request))
    card = next((c for c in cards if c.answers_to(name)), None)
    if card is None:
        raise NotFoundError(f"model '{name}' not found", param="model")
    arch = card.family or card.architecture.lower() or "unknown"
    capabilities = ["completion"]
    capabilities += [name for name, enabled in (("tools", card.tools), ("vision", card.vision),
                                                ("thinking", card.reasoning)) if enabled]
    return {
        "modelfile": f"# Served by Helios\nFROM {card.root or card.id}\n",
        "parameters": "", "template": card.chat_template, "details": _details(card),
        "model_info": {"general.architecture": arch, "general.basename": card.id,
                       "general.parameter_count": card.num_parameters,
                       f"{arch}.context_length": card.max_model_len,
                       **vision_model_info(card, arch)},
        "capabilities": capabilities, "modified_at": _modified_at(card),
    }
