"""Stored-response conversations keep their images (gateway/history.py): decoded image bytes
and, from rows written before the gateway decoded base64, data URLs."""

from __future__ import annotations

import json

from gateway.history import message_from_dict, message_to_dict
from services.common.api.chat import ChatMessage, ImagePart, TextPart

PNG = b"\x89PNG\r\n\x1a\n" + bytes(range(256))


def test_image_bytes_round_trip_through_json():
    message = ChatMessage(role="user", content=(
        TextPart("what is this"), ImagePart(data=PNG, media_type="image/png", detail="low")))
    stored = json.loads(json.dumps(message_to_dict(message)))        # the table's JSON
    assert message_from_dict(stored) == message


def test_rows_with_data_urls_still_load():
    url = "data:image/png;base64,iVBORw0KGgo="
    stored = {"role": "user", "parts": [{"image_url": url, "detail": ""}, {"text": "hi"}]}
    message = message_from_dict(stored)
    assert message.content == (ImagePart(url=url), TextPart("hi"))
    assert message_to_dict(message) == stored
