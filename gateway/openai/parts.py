"""Content-part models shared by the chat and Responses request bodies."""

from __future__ import annotations

from typing import Literal

from gateway.schema import ApiModel
from services.common.api.chat import ContentPart, TextPart

ImageDetail = Literal["auto", "low", "high"] | None


class RefusalPart(ApiModel):
    """An assistant's earlier refusal: it goes back to the template as text."""

    type: Literal["refusal"]
    refusal: str

    def to_part(self, param: str) -> ContentPart:
        return TextPart(self.refusal)
