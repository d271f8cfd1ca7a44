"""API-neutral generation requests: what every protocol module builds and the frontend client sends.

Protocol modules (openai/, anthropic/, ollama/) turn their JSON into these objects; only
`gateway.frontend_client` turns them into protobuf. Field meanings mirror
`proto/helios/v1/frontend.proto`; `None` means "unset: the frontend's default".
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class ImageInput:
    """One image: a data URL, or raw encoded bytes with their media type."""

    url: str = ""
    data: bytes = b""
    media_type: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class ContentPart:
    """Exactly one of `text` / `image` is set."""

    text: str | None = None
    image: ImageInput | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    id: str
    name: str
    arguments_json: str           # JSON object text, in the caller's key order
    type: str = "function"


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One chat turn. `content` is a string, a tuple of parts, or None (no content)."""

    role: str                     # system, developer, user, assistant, tool
    content: str | tuple[ContentPart, ...] | None = None
    name: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str = ""
    reasoning_content: str | None = None


@dataclass(frozen=True, slots=True)
class ToolDefinition:
    name: str
    description: str = ""
    parameters_json: str = ""     # JSON Schema object text ('' = no parameters)
    strict: bool | None = None
    type: str = "function"


class ToolChoiceMode(enum.Enum):
    AUTO = "auto"
    NONE = "none"
    REQUIRED = "required"
    FUNCTION = "function"


@dataclass(frozen=True, slots=True)
class ToolChoice:
    mode: ToolChoiceMode = ToolChoiceMode.AUTO
    function_name: str = ""
    parallel_tool_calls: bool | None = None


@dataclass(frozen=True, slots=True)
class ChatInput:
    messages: tuple[ChatMessage, ...]
    tools: tuple[ToolDefinition, ...] = ()
    tool_choice: ToolChoice = field(default_factory=ToolChoice)
    add_generation_prompt: bool | None = None
    continue_final_message: bool = False
    chat_template_kwargs_json: str = ""  # JSON object text ('' = none)
    documents_json: str = ""             # JSON array text ('' = none)


@dataclass(frozen=True, slots=True)
class CompletionInput:
    """A raw prompt: text or token ids (exactly one)."""

    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    echo: bool = False


class ResponseFormatType(enum.Enum):
    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    type: ResponseFormatType = ResponseFormatType.TEXT
    schema_json: str = ""
    name: str = ""
    strict: bool = False


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings (proto SamplingParams); None = the default written in the proto."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    logit_bias: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """One generation, API-neutral (proto GenerateRequest)."""

    request_id: str
    model: str
    input: ChatInput | CompletionInput
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    n: int | None = None
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    parse_reasoning: bool | None = None
    continuous_usage: bool = False
    priority: int = 0
    parse_tool_calls: bool | None = None

    @property
    def num_choices(self) -> int:
        return self.n or 1


@dataclass(frozen=True, slots=True)
class ModelCard:
    """One served model as the frontend describes it (proto ModelCard)."""

    id: str                                   # first served name, else the checkpoint id
    aliases: tuple[str, ...] = ()             # every name it answers to (id included)
    root: str = ""                            # checkpoint identifier
    max_model_len: int = 0
    tools: bool = False
    vision: bool = False
    reasoning: bool = False
    created: int = 0
    owned_by: str = "helios"
    architecture: str = ""
    family: str = ""
    num_parameters: int = 0
    dtype: str = ""
    size_bytes: int = 0
    digest: str = ""
    chat_template: str = ""

    def answers_to(self, name: str) -> bool:
        return name == self.id or name == self.root or name in self.aliases
