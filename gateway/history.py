"""Chat messages <-> plain JSON dicts, for conversations kept in the stored-responses table."""

from __future__ import annotations

from typing import Any

from services.common.api.chat import ChatMessage, Content, ImagePart, TextPart, ToolCall


def message_to_dict(message: ChatMessage) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role}
    if isinstance(message.content, tuple):
        data["parts"] = [{"text": p.text} if isinstance(p, TextPart) else
                         {"image_url": p.url, "detail": p.detail}
                         for p in message.content]
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


def message_from_dict(data: dict[str, Any]) -> ChatMessage:
    content: Content
    if "parts" in data:
        content = tuple(TextPart(p["text"]) if "text" in p else
                        ImagePart(url=p["image_url"], detail=p.get("detail", ""))
                        for p in data["parts"])
    else:
        content = data.get("content")
    return ChatMessage(
        role=data["role"], content=content, name=data.get("name", ""),
        tool_calls=tuple(ToolCall(id=c["id"], name=c["name"], arguments_json=c["arguments"])
                         for c in data.get("tool_calls", ())),
        tool_call_id=data.get("tool_call_id", ""),
        reasoning_content=data.get("reasoning_content"))
