"""Chat input <-> `helios.v1.ChatInput`.

`*_to_pb` writes what the gateway built. `*_from_pb` reads what the frontend received and
validates it while converting: every rejected field raises a ValidationError naming it
(`messages[2].tool_calls[0].arguments`); JSON text is parsed strictly with key order kept.
"""

from __future__ import annotations

from services.common.api.chat import (
    ChatInput,
    ChatMessage,
    Content,
    ContentPart,
    ImagePart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolChoiceMode,
    ToolDefinition,
)
from services.common.api.convert.enums import enum_mapping
from services.common.api.json_values import json_text, parse_json, parse_json_object
from services.common.errors import ValidationError
from services.common.pb import frontend_pb2

_TOOL_CHOICE = enum_mapping(ToolChoiceMode, frontend_pb2.ToolChoiceMode, "TOOL_CHOICE_MODE_")


# ---------------------------------------------------------------------------------------------
# domain -> protobuf

def _add_part(parts: frontend_pb2.ContentParts, part: ContentPart) -> None:
    """One part added in place: a data URL of megabytes is copied once (building the part
    and then appending it copied it twice more)."""
    if isinstance(part, ImagePart):
        image = parts.parts.add().image
        image.SetInParent()                 # an image part even with every field empty
        image.url, image.data = part.url, part.data
        image.media_type, image.detail = part.media_type, part.detail
    else:
        parts.parts.add(text=part.text)


def message_to_pb(message: ChatMessage, pb: frontend_pb2.ChatMessage | None = None
                  ) -> frontend_pb2.ChatMessage:
    """The message as protobuf, written into `pb` when given (a message of a ChatInput: a
    constructor or CopyFrom would copy its images' data URLs once more)."""
    pb = frontend_pb2.ChatMessage() if pb is None else pb
    pb.role, pb.name, pb.tool_call_id = message.role, message.name, message.tool_call_id
    if isinstance(message.content, str):
        pb.text = message.content
    elif message.content is not None:
        pb.parts.SetInParent()    # an empty list stays a list (and is refused as one)
        for part in message.content:
            _add_part(pb.parts, part)
    elif message.role == "assistant":
        # A tool-call-only turn (OpenAI content null, Anthropic tool_use blocks only): templates
        # such as Qwen3's read message.content as a string and fail on a missing one, in
        # transformers too; "" renders the same where null works (vLLM sends "" as well).
        pb.text = ""
    for call in message.tool_calls:
        pb.tool_calls.append(frontend_pb2.ToolCall(id=call.id, type=call.type, name=call.name,
                                                   arguments_json=call.arguments_json))
    if message.reasoning_content is not None:
        pb.reasoning_content = message.reasoning_content
    return pb


def _tool_to_pb(tool: ToolDefinition) -> frontend_pb2.ToolDefinition:
    pb = frontend_pb2.ToolDefinition(
        type=tool.type, name=tool.name, description=tool.description,
        parameters_json=json_text(tool.parameters) if tool.parameters is not None else "")
    if tool.strict is not None:
        pb.strict = tool.strict
    return pb


def chat_input_to_pb(chat: ChatInput, pb: frontend_pb2.ChatInput | None = None
                     ) -> frontend_pb2.ChatInput:
    """The chat as protobuf, written into `pb` when given (a request's `chat` field: every
    message is built in place, so an image's data URL is copied once)."""
    pb = frontend_pb2.ChatInput() if pb is None else pb
    for message in chat.messages:
        message_to_pb(message, pb.messages.add())
    pb.tools.extend(_tool_to_pb(t) for t in chat.tools)
    pb.tool_choice.SetInParent()
    pb.tool_choice.mode = _TOOL_CHOICE.to_pb[chat.tool_choice.mode]
    pb.tool_choice.function_name = chat.tool_choice.function_name
    pb.continue_final_message = chat.continue_final_message
    pb.chat_template_kwargs_json = json_text(chat.template_kwargs) if chat.template_kwargs \
        else ""
    pb.documents_json = json_text(chat.documents) if chat.documents is not None else ""
    if chat.tool_choice.parallel_tool_calls is not None:
        pb.tool_choice.parallel_tool_calls = chat.tool_choice.parallel_tool_calls
    if chat.add_generation_prompt is not None:
        pb.add_generation_prompt = chat.add_generation_prompt
    return pb


# ---------------------------------------------------------------------------------------------
# protobuf -> domain (validating)

def _content_from_pb(message: frontend_pb2.ChatMessage, where: str) -> Content:
    kind = message.WhichOneof("content")
    if kind == "text":
        return message.text
    if kind is None:
        return None
    if not message.parts.parts:
        raise ValidationError(f"{where}.content: must not be an empty list (send a string, or "
                              "at least one content part)", param=f"{where}.content")
    parts: list[ContentPart] = []
    for index, part in enumerate(message.parts.parts):
        which = part.WhichOneof("part")
        if which == "text":
            parts.append(TextPart(part.text))
        elif which == "image":
            image = part.image
            # each read of a string field builds a new str (a 2.2 MB data URL: 0.23 ms): read once
            url, data = image.url, image.data
            if not url and not data:
                raise ValidationError(f"{where}.content[{index}]: an image needs a url or data",
                                      param=f"{where}.content[{index}]")
            parts.append(ImagePart(url, data, image.media_type, image.detail))
        else:
            raise ValidationError(f"{where}.content[{index}] is empty",
                                  param=f"{where}.content[{index}]")
    return tuple(parts)


def _tool_call_from_pb(call: frontend_pb2.ToolCall, where: str) -> ToolCall:
    if not call.name:
        raise ValidationError(f"{where}.name is required", param=f"{where}.name")
    if call.arguments_json.strip():
        parse_json_object(call.arguments_json.strip(), param=f"{where}.arguments",
                          what=f"the arguments of tool call {where}")
    return ToolCall(call.id, call.name, call.arguments_json, call.type or "function")


def message_from_pb(message: frontend_pb2.ChatMessage, index: int) -> ChatMessage:
    where = f"messages[{index}]"
    if not message.role:
        raise ValidationError(f"{where}.role is required", param=f"{where}.role")
    calls = tuple(_tool_call_from_pb(call, f"{where}.tool_calls[{j}]")
                  for j, call in enumerate(message.tool_calls))
    return ChatMessage(
        role=message.role,
        content=_content_from_pb(message, where),
        name=message.name,
        tool_calls=calls,
        tool_call_id=message.tool_call_id,
        reasoning_content=(message.reasoning_content
                           if message.HasField("reasoning_content") else None),
    )


def _tool_from_pb(tool: frontend_pb2.ToolDefinition, index: int) -> ToolDefinition:
    where = f"tools[{index}]"
    if not tool.name:
        raise ValidationError(f"{where}.name is required", param=f"{where}.name")
    parameters = (parse_json_object(tool.parameters_json, param=f"{where}.parameters")
                  if tool.parameters_json.strip() else None)
    return ToolDefinition(name=tool.name, type=tool.type or "function",
                          description=tool.description, parameters=parameters,
                          strict=tool.strict if tool.HasField("strict") else None)


def _tool_choice_from_pb(choice: frontend_pb2.ToolChoice, tools: tuple[ToolDefinition, ...]
                         ) -> ToolChoice:
    mode = _TOOL_CHOICE.from_pb.get(choice.mode)
    if mode is None:
        raise ValidationError(f"unknown tool_choice mode {choice.mode}", param="tool_choice")
    if mode is ToolChoiceMode.FUNCTION:
        if not choice.function_name:
            raise ValidationError("tool_choice names no function", param="tool_choice")
        if choice.function_name not in {tool.name for tool in tools}:
            raise ValidationError(f"tool_choice names {choice.function_name!r}, which is not "
                                  "among the tools", param="tool_choice")
    parallel = choice.parallel_tool_calls if choice.HasField("parallel_tool_calls") else None
    return ToolChoice(mode, choice.function_name, parallel)


def chat_input_from_pb(chat: frontend_pb2.ChatInput) -> ChatInput:
    if not chat.messages:
        raise ValidationError("messages must not be empty", param="messages")
    messages = tuple(message_from_pb(m, i) for i, m in enumerate(chat.messages))
    tools = tuple(_tool_from_pb(t, i) for i, t in enumerate(chat.tools))
    kwargs = (parse_json_object(chat.chat_template_kwargs_json, param="chat_template_kwargs")
              if chat.chat_template_kwargs_json.strip() else {})
    documents = None
    if chat.documents_json.strip():
        documents = parse_json(chat.documents_json, param="documents")
        if not isinstance(documents, list):
            raise ValidationError("documents must be a JSON array", param="documents")
    return ChatInput(
        messages=messages,
        tools=tools,
        tool_choice=_tool_choice_from_pb(chat.tool_choice, tools),
        add_generation_prompt=(chat.add_generation_prompt
                               if chat.HasField("add_generation_prompt") else None),
        continue_final_message=chat.continue_final_message,
        template_kwargs=kwargs,
        documents=documents,
    )
