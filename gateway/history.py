"""Chat messages <-> plain JSON dicts, for conversations kept in the stored-responses table."""

from __future__ import annotations

import base64
from typing import Any

from services.common.api.chat import ChatMessage, Content, ImagePart, TextPart, ToolCall


def message_to_dict(message: ChatMessage) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, tuple):
        data["parts"] = [_part_to_dict(p) for p in message.content]
    else:
        data["content"] = message.content
    if message.name:
        data["name"] = message.name
    if message.tool_calls:
        data["tool_calls"] = [{"id": c.id, "name": c.name, "arguments": c.arguments_json}
                              for c in message.tool_calls]
    if message.tool_call_id:
        data["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        data["reasoning_content"] = message.reasoning_content
    return data


def _part_to_dict(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"text": part.text}
    if part.url:
        return {"image_url": part.url, "detail": part.detail}
    return {"image_data": base64.b64encode(part.data).decode(), "media_type": part.media_type,
            "detail": part.detail}


def _part_from_dict(part: dict[str, Any]) -> TextPart | ImagePart:
    if "text" in part:
        return TextPart(part["text"])
    if "image_data" in part:
        return ImagePart(data=base64.b64decode(part["image_data"]),
                         media_type=part["media_type"], detail=part.get("detail", ""))
    return ImagePart(url=part["image_url"], detail=part.get("detail", ""))   # before bytes


def message_from_dict(data: dict[str, Any]) -> ChatMessage:
    content: Content
    if "parts" in data:
        content = tuple(_part_from_dict(p) for p in data["parts"])
    else:
        content = data.get("content")
    return ChatMessage(
        role=data["role"], content=content, name=data.get("name", ""),
        tool_calls=tuple(ToolCall(id=c["id"], name=c["name"], arguments_json=c["arguments"])
                         for c in data.get("tool_calls", ())),
        tool_call_id=data.get("tool_call_id", ""),
        reasoning_content=data.get("reasoning_content"))
