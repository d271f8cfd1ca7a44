"""Requests that can never be admitted get a 400 naming the limit, not a 503 that says retry.

A /v1/completions batch of P prompts runs as P engine requests at once; the engine holds at
most `max_num_seqs` running plus `max_waiting` queued requests (its model card reports both).
A batch larger than that sum would have its surplus refused with `capacity` every time, however
long the client waits, so it is refused whole, before anything starts.
"""

from __future__ import annotations

from services.common.api.model_card import ModelCard
from services.common.errors import ValidationError


def card_for(cards: list[ModelCard], name: str) -> ModelCard | None:
    """The card `name` answers to ("" is the only served model, as the frontend resolves it)."""
    if not name:
        return cards[0] if len(cards) == 1 else None
    return next((c for c in cards if c.answers_to(name)), None)


def check_batch(card: ModelCard | None, requests: int, *, param: str = "prompt") -> None:
    """Refuse a batch of `requests` engine requests the engine can never hold at once."""
    if card is None or card.max_num_seqs <= 0:
        return      # bounds unknown (engine not asked yet): the engine's own answer stands
    most = card.max_num_seqs + card.max_waiting
    if requests > most:
        raise ValidationError(
            f"{requests} prompts need {requests} engine requests at once, but the engine holds "
            f"at most {most} ({card.max_num_seqs} running, engine setting `max_num_seqs`, + "
            f"{card.max_waiting} waiting, engine setting `max_waiting`): send at most {most} "
            "prompts per request or raise those settings", param=param)
