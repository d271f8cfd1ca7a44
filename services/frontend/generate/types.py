"""The Generate request and its stages as typed objects (no protobuf).

    GenerateRequest --prepare (worker)--> PreparedRequest --images, context--> EngineRequest
                                                                   engine --> EngineStep*
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.frontend.chat.types import ChatInput, ImagePart


class FinishReason(enum.Enum):
    STOP = "stop"                # EOS / stop token id (engine)
    LENGTH = "length"            # max_tokens or the context (engine)
    STOP_STRING = "stop_string"  # a stop string matched (frontend)
    TOOL_CALLS = "tool_calls"    # the output ended in tool calls (frontend)
    CANCELLED = "cancelled"
    ERROR = "error"


class ResponseFormatType(enum.Enum):
    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings, passed to the engine unchanged (None: the engine's default)."""

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
    logit_bias: dict[int, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class CompletionInput:
    text: str | None = None                 # a text prompt, or
    token_ids: tuple[int, ...] | None = None  # a prompt already tokenized
    echo: bool = False


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    model: str = ""
    chat: ChatInput | None = None
    completion: CompletionInput | None = None
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    n: int = 1
    response_format: ResponseFormatType = ResponseFormatType.TEXT
    parse_reasoning: bool | None = None      # None: when the model reasons (chat only)
    parse_tool_calls: bool | None = None     # None: when tools were offered
    continuous_usage: bool = False
    priority: int = 0


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """How each choice's tokens become events (fixed at preparation)."""

    stop: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    reasoning: bool = False                  # parse <think> blocks
    starts_in_reasoning: bool = False        # the prompt opened the block
    tool_parser: str = ""                    # "" = no tool-call parsing
    tool_names: frozenset[str] | None = None
    parallel_tool_calls: bool = True
    logprobs: bool = False


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """A validated, rendered, tokenized request (before images and the context check)."""

    request: GenerateRequest
    prompt_text: str
    prompt_token_ids: list[int]
    checkpoint_token_ends: tuple[int, ...]
    images: tuple[ImagePart, ...]
    output: OutputOptions
    echo_text: str = ""                      # completion echo: the prompt as text


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling                       # with max_tokens resolved
    checkpoint_token_ends: tuple[int, ...]
    n: int = 1
    priority: int = 0
    multimodal: bytes = b""                  # serialized helios.v1.MultimodalInputs, opaque here


@dataclass(frozen=True, slots=True)
class SampledLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


@dataclass(frozen=True, slots=True)
class ChoiceStep:
    """One choice's progress in one engine message."""

    index: int
    token_ids: tuple[int, ...]
    logprobs: tuple[SampledLogprob, ...] = ()
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None


@dataclass(frozen=True, slots=True)
class UsageCounts:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(frozen=True, slots=True)
class EngineStep:
    outputs: tuple[ChoiceStep, ...]
    usage: UsageCounts


@dataclass(frozen=True, slots=True)
class ExpandedPrompt:
    """A prompt after imageprep replaced each image placeholder by the image's span."""

    token_ids: list[int]
    message_token_ends: tuple[int, ...]
    multimodal: bytes            # serialized helios.v1.MultimodalInputs for the engine
