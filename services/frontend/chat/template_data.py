"""What a chat template sees: typed chat input -> the plain dicts and lists HF templates read.

The shapes follow transformers' `apply_chat_template` (and vLLM's request conversion):

- a message is `{"role", "content"?, "name"?, "tool_calls"?, "tool_call_id"?}`; keys whose value
  is None are left out, exactly as transformers drops them before rendering;
- content is a string or a list of parts, `{"type": "text", "text": ...}` and `{"type": "image"}`;
  templates that read content as a string (content_format.py) get text-only parts joined with
  newlines, as vLLM renders them; parts with images stay parts;
- a tool call is `{"id", "type": "function", "function": {"name", "arguments": <object>}}` with
  the arguments parsed (key order kept; the servicer checked them), so `tojson` reproduces the
  caller's order;
- reasoning is given as `reasoning_content` and aliased as `thinking` (transformers does this
  for templates that read the other name);
- tools are `{"type": "function", "function": {"name", "description"?, "parameters"?, "strict"?}}`.
"""

from __future__ import annotations

import json
from typing import Any

from services.common.api.chat import ChatInput, ChatMessage, ImagePart, ToolCall, ToolDefinition
from services.common.errors import ValidationError
from services.frontend.chat.content_format import ContentFormat

# Names the renderer passes itself; chat_template_kwargs may not override them.
RESERVED_KWARGS = frozenset({"messages", "tools", "documents", "add_generation_prompt",
                             "continue_final_message"})


def content_value(content: Any, fmt: ContentFormat = ContentFormat.OPENAI) -> Any:
    if isinstance(content, tuple):
        if fmt is ContentFormat.STRING and not any(isinstance(p, ImagePart) for p in content):
            return "\n".join(part.text for part in content)
        return [{"type": "image"} if isinstance(part, ImagePart)
                else {"type": "text", "text": part.text} for part in content]
    return content


def arguments_value(call: ToolCall) -> dict[str, Any]:
    """A tool call's arguments object ({} for blank text), checked by the conversion."""
    return json.loads(call.arguments_json) if call.arguments_json.strip() else {}


def message_dict(message: ChatMessage, fmt: ContentFormat = ContentFormat.OPENAI
                 ) -> dict[str, Any]:
    data: dict[str, Any] = {"role": message.role}
    if message.content is not None:
        data["content"] = content_value(message.content, fmt)
    if message.name:
        data["name"] = message.name
    if message.tool_calls:
        calls = []
        for call in message.tool_calls:
            entry: dict[str, Any] = {}
            if call.id:
                entry["id"] = call.id
            entry["type"] = call.type or "function"
            entry["function"] = {"name": call.name, "arguments": arguments_value(call)}
            calls.append(entry)
        data["tool_calls"] = calls
    if message.tool_call_id:
        data["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        reasoning = message.reasoning_content
        data = {"thinking": reasoning, **data, "reasoning_content": reasoning}
    return data


def tool_dict(tool: ToolDefinition) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    if tool.parameters is not None:
        function["parameters"] = tool.parameters
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": tool.type or "function", "function": function}


def template_kwargs(chat: ChatInput, special_tokens: dict[str, str],
                    defaults: dict[str, Any]) -> dict[str, Any]:
    """Special tokens < configured defaults < the request's chat_template_kwargs."""
    for source, values in (("chat_template_kwargs", chat.template_kwargs),
                           ("default_chat_template_kwargs", defaults)):
        reserved = sorted(RESERVED_KWARGS & set(values))
        if reserved:
            raise ValidationError(
                f"{source} may not set {', '.join(reserved)}: use the request's own fields",
                param=source)
    return {**special_tokens, **defaults, **chat.template_kwargs}


def messages_data(chat: ChatInput, fmt: ContentFormat = ContentFormat.OPENAI
                  ) -> list[dict[str, Any]]:
    """The messages as the template reads them (`fmt`: the template's content format)."""
    return [message_dict(message, fmt) for message in chat.messages]


def tools_data(chat: ChatInput) -> list[dict[str, Any]] | None:
    if not chat.offers_tools:
        return None
    return [tool_dict(tool) for tool in chat.tools]
