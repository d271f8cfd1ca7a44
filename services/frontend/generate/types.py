"""The stages of one Generate request inside the frontend, as typed objects (no protobuf).

    GenerateRequest --prepare (worker)--> PreparedRequest --images, context--> EngineRequest
                                                                   engine --> EngineStep*

`GenerateRequest` itself (with its chat input and sampling) is the shared API-neutral type
from `services.common.api`.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.api.chat import ImagePart
from services.common.api.events import FinishReason, Usage
from services.common.api.generate import GenerateRequest, Sampling
from services.frontend.structured.grammar import EngineGrammar


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
    harmony: bool = False                    # gpt-oss: channels and calls (parsers/harmony.py)
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
    grammar: EngineGrammar | None = None     # structured output the engine enforces


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: list[int]
    sampling: Sampling                       # with max_tokens resolved
    checkpoint_token_ends: tuple[int, ...]
    n: int = 1
    priority: int = 0
    multimodal: bytes = b""                  # serialized helios.v1.MultimodalInputs, opaque here
    grammar: EngineGrammar | None = None
    prompt_logprobs: int | None = None       # prompt scoring with k alternatives
    embed: bool = False                      # the pooled embedding of the prompt
    cache_salt: str = ""                     # prefix-cache tenant


@dataclass(frozen=True, slots=True)
class PromptLogprobEntry:
    """The engine's logprob of prompt token `position` (ids only)."""

    position: int
    token_id: int
    logprob: float
    rank: int
    top: tuple[tuple[int, float], ...] = ()  # (token id, logprob), best first


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
    prompt_logprobs: tuple[PromptLogprobEntry, ...] = ()
    embedding: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class EngineStep:
    outputs: tuple[ChoiceStep, ...]
    usage: Usage                             # cumulative, as the engine counts it


@dataclass(frozen=True, slots=True)
class ExpandedPrompt:
    """A prompt after imageprep replaced each image placeholder by the image's span."""

    token_ids: list[int]
    message_token_ends: tuple[int, ...]
    multimodal: bytes            # serialized helios.v1.MultimodalInputs for the engine
