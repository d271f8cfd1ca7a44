"""POST /v1/responses request body and its input items -> chat messages.

Input items: messages (content a string or `input_text` / `input_image` / `output_text` parts),
`function_call`, `function_call_output` (output a string or an array of parts, as Codex
sends), and `reasoning` items (their text goes back to the template as reasoning_content).
Tools use the flat shape `{type: "function", name, description, parameters, strict}`.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Discriminator, Field, Tag

from gateway.images import image_from_url
from gateway.openai.shared_schema import (
    ImageDetail,
    RefusalPart,
    ToolChoiceName,
    openai_tool_choice,
)
from gateway.request_parts import (
    JSON_OBJECT_FORMAT,
    collapse_text,
    convert_parts,
    json_schema_format,
)
from gateway.schema import (
    ApiModel,
    Identifier,
    PositiveUInt32,
    RequiredModelName,
    UserString,
    json_object_text,
)
from services.common.api.chat import (
    ChatMessage,
    Content,
    ContentPart,
    TextPart,
    ToolCall,
    ToolChoice,
    ToolDefinition,
)
from services.common.api.generate import ResponseFormat
from services.common.errors import UnsupportedError, ValidationError


class InputText(ApiModel):
    type: Literal["input_text", "output_text", "text", "summary_text", "reasoning_text"]
    text: str

    def to_part(self, param: str) -> ContentPart:
        return TextPart(self.text)


class InputImage(ApiModel):
    type: Literal["input_image"]
    image_url: str | None = None
    file_id: str | None = None
    detail: ImageDetail = None

    def to_part(self, param: str) -> ContentPart:
        if self.image_url is None:
            raise UnsupportedError("input_image needs image_url (file ids are not supported)",
                                   param=f"{param}.image_url")
        return image_from_url(self.image_url, detail=self.detail or "",
                              param=f"{param}.image_url")


Part = Annotated[InputText | InputImage | RefusalPart, Field(discriminator="type")]


class MessageItem(ApiModel):
    type: Literal["message"] = "message"
    role: Literal["user", "assistant", "system", "developer"]
    content: str | list[Part]
    id: str | None = None


class FunctionCallItem(ApiModel):
    type: Literal["function_call"]
    call_id: str = Field(min_length=1)
    name: str = ""                 # may be empty only on an incomplete (cut-off) call
    arguments: str = "{}"
    id: str | None = None
    status: str | None = None      # "incomplete": cut off by max_output_tokens, not replayed


class FunctionCallOutputItem(ApiModel):
    type: Literal["function_call_output"]
    call_id: str = Field(min_length=1)
    output: str | list[Part]


class ReasoningItem(ApiModel):
    type: Literal["reasoning"]
    id: str | None = None
    summary: list[InputText] = Field(default_factory=list)
    content: list[InputText] | None = None
    encrypted_content: str | None = None


def _item_kind(value: Any) -> str:
    if isinstance(value, dict):
        return value.get("type") or "message"
    return getattr(value, "type", "message")


InputItem = Annotated[
    Annotated[MessageItem, Tag("message")]
    | Annotated[FunctionCallItem, Tag("function_call")]
    | Annotated[FunctionCallOutputItem, Tag("function_call_output")]
    | Annotated[ReasoningItem, Tag("reasoning")],
    Discriminator(_item_kind),
]


class FunctionTool(ApiModel):
    type: Literal["function"]
    name: str = Field(min_length=1, max_length=256)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None

    def definition(self) -> ToolDefinition:
        return ToolDefinition(name=self.name, description=self.description or "",
                              parameters=self.parameters, strict=self.strict)


class NamedFunctionChoice(ApiModel):
    type: Literal["function"]
    name: str = Field(min_length=1)

    @property
    def function_name(self) -> str:
        return self.name


class TextFormat(ApiModel):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None
    description: str | None = None


class TextOptions(ApiModel):
    format: TextFormat | None = None
    verbosity: str | None = None


class ReasoningOptions(ApiModel):
    effort: str | None = None      # Codex sends "max", which the SDK's own types reject
    summary: str | None = None


class ResponsesRequest(ApiModel):
    model: RequiredModelName      # required, as OpenAI's
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: ToolChoiceName | NamedFunctionChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: PositiveUInt32 | None = None
    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    text: TextOptions | None = None
    reasoning: ReasoningOptions | None = None
    stream: bool | None = False
    store: bool | None = True
    previous_response_id: Identifier | None = None
    include: list[str] | None = None
    metadata: dict[str, str] | None = None
    background: bool | None = False
    conversation: Any = None
    user: UserString | None = None
    truncation: str | None = None
    cache_salt: Identifier | None = None     # vLLM: prefix-cache tenant (salts share no KV)

    @property
    def logprobs_top(self) -> int | None:
        """Alternatives per output token when logprobs are asked for (`top_logprobs`, or
        `include: ["message.output_text.logprobs"]`), else None."""
        if self.top_logprobs is not None:
            return self.top_logprobs
        if "message.output_text.logprobs" in (self.include or ()):
            return 0
        return None

    def check_supported(self) -> None:
        if self.background:
            raise UnsupportedError("background responses are not supported", param="background")
        if self.conversation is not None:
            raise UnsupportedError("conversations are not supported; use "
                                   "previous_response_id", param="conversation")

    def response_format(self) -> ResponseFormat:
        fmt = self.text.format if self.text else None
        if fmt is None or fmt.type == "text":
            return ResponseFormat()
        if fmt.type == "json_object":
            return JSON_OBJECT_FORMAT
        if fmt.schema_ is None:
            raise ValidationError("text.format json_schema needs a schema",
                                  param="text.format.schema")
        return json_schema_format(fmt.schema_, name=fmt.name or "response",
                                  strict=bool(fmt.strict))

    def tool_definitions(self) -> tuple[ToolDefinition, ...]:
        return tuple(tool.definition() for tool in self.tools or ())

    def tool_choice_domain(self, tools: tuple[ToolDefinition, ...]) -> ToolChoice:
        return openai_tool_choice(self.tool_choice, tools, self.parallel_tool_calls)

    def input_items(self) -> list[dict[str, Any]]:
        """The input as JSON items (stored for GET .../input_items)."""
        if isinstance(self.input, str):
            return [{"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": self.input}]}]
        return [item.model_dump(mode="json", by_alias=True, exclude_none=True)
                for item in self.input]


def _content(content: str | list[Part], param: str) -> Content:
    """A function call's output as text ([] is an empty output)."""
    if isinstance(content, str):
        return content
    if not content:
        return ""
    return collapse_text(convert_parts(content, param))


def input_messages(request: ResponsesRequest) -> list[ChatMessage]:
    """The request's input items as chat messages (instructions not included)."""
    if isinstance(request.input, str):
        return [ChatMessage(role="user", content=request.input)]
    messages: list[ChatMessage] = []
    reasoning: str | None = None
    for i, item in enumerate(request.input):
        param = f"input[{i}]"
        if isinstance(item, ReasoningItem):
            texts = [c.text for c in item.content or ()] or [s.text for s in item.summary]
            reasoning = (reasoning or "") + "".join(texts)
        elif isinstance(item, MessageItem):
            # Message text stays parts: the frontend renders them as the template reads them.
            content = item.content if isinstance(item.content, str) else convert_parts(
                item.content, f"{param}.content")
            if item.role == "assistant":
                messages.append(ChatMessage(role="assistant", content=content,
                                            reasoning_content=reasoning))
                reasoning = None
            else:
                messages.append(ChatMessage(role=item.role, content=content))
        elif isinstance(item, FunctionCallItem) and item.status == "incomplete":
            continue   # a call cut off at the output limit: its arguments are unfinished
        elif isinstance(item, FunctionCallItem):
            if not item.name:
                raise ValidationError("a function call needs a name", param=f"{param}.name")
            call = ToolCall(id=item.call_id, name=item.name, arguments_json=json_object_text(
                item.arguments, param=f"{param}.arguments"))
            last = messages[-1] if messages else None
            if last is not None and last.role == "assistant" and reasoning is None:
                messages[-1] = ChatMessage(role="assistant", content=last.content,
                                           tool_calls=(*last.tool_calls, call),
                                           reasoning_content=last.reasoning_content)
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=(call,),
                                            reasoning_content=reasoning))
                reasoning = None
        elif isinstance(item, FunctionCallOutputItem):
            output = _content(item.output, f"{param}.output")
            messages.append(ChatMessage(role="tool", content=output,
                                        tool_call_id=item.call_id))
    return messages
