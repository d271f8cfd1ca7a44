"""One Generate request: its input, sampling settings and output options.

Mirrors `GenerateRequest` / `SamplingParams` in the proto. Unset optionals stay `None` here and
unset on the wire; the frontend resolves them (`num_choices`, `skips_special_tokens`, ...).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from services.common.api.chat import ChatInput, CompletionInput


@dataclass(frozen=True, slots=True)
class Sampling:
    """Sampling settings, passed on to the engine (None: the default the proto names)."""

    temperature: float | None = None       # default 1.0; 0 is greedy
    top_p: float | None = None             # default 1.0 (off)
    top_k: int | None = None               # default 0 (off); -1 also off
    min_p: float | None = None             # default 0.0 (off)
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    seed: int | None = None                # any int64 (sent modulo 2**64); None: unseeded
    max_tokens: int | None = None          # None: whatever the context leaves
    min_tokens: int = 0                    # EOS / stop ids suppressed until this many tokens
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()   # extra ids that end the sequence
    logprobs: bool = False                 # return the sampled token's logprob
    top_logprobs: int = 0                  # and this many alternatives
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias added to its logit)


class ResponseFormatType(enum.Enum):
    TEXT = "text"
    JSON_OBJECT = "json_object"
    JSON_SCHEMA = "json_schema"
    REGEX = "regex"              # vLLM's structured_outputs.regex
    CHOICE = "choice"            # structured_outputs.choice
    GRAMMAR = "grammar"          # structured_outputs.grammar: Lark or GBNF


@dataclass(frozen=True, slots=True)
class ResponseFormat:
    """Structured output: every type but TEXT constrains decoding to its grammar."""

    type: ResponseFormatType = ResponseFormatType.TEXT
    schema_json: str = ""        # JSON Schema text as given (json_schema only)
    name: str = ""
    strict: bool = False         # unsupported JSON Schema keywords are errors, not ignored
    pattern: str = ""            # regex
    choices: tuple[str, ...] = ()   # choice
    grammar: str = ""            # grammar


@dataclass(frozen=True, slots=True)
class GenerateRequest:
    request_id: str
    model: str = ""                                  # a served name; "" = the default
    input: ChatInput | CompletionInput | None = None  # None: neither (rejected by the frontend)
    sampling: Sampling = field(default_factory=Sampling)
    stop: tuple[str, ...] = ()                       # stop strings
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None          # None: true
    spaces_between_special_tokens: bool | None = None  # None: true
    n: int | None = None                             # choices; None: 1
    response_format: ResponseFormat = field(default_factory=ResponseFormat)
    parse_reasoning: bool | None = None              # None: when the model reasons (chat)
    continuous_usage: bool = False                   # cumulative usage on every event
    priority: int = 0
    parse_tool_calls: bool | None = None             # None: when tools were offered
    prompt_logprobs: int | None = None               # prompt tokens' logprobs (k alternatives)
    embed: bool = False                              # the pooled embedding of the prompt
    cache_salt: str = ""                             # prefix-cache tenant ("" = unsalted)

    @property
    def chat(self) -> ChatInput | None:
        return self.input if isinstance(self.input, ChatInput) else None

    @property
    def completion(self) -> CompletionInput | None:
        return self.input if isinstance(self.input, CompletionInput) else None

    @property
    def num_choices(self) -> int:
        return 1 if self.n is None else self.n

    @property
    def skips_special_tokens(self) -> bool:
        return self.skip_special_tokens is not False
