"""The engine's domain request and what it streams back (no protobuf: see services/engine/wire.py).

An `EngineRequest` is one Generate call after validation at the edge: prompt token ids, the
sampler's parameters (opaque here), the stop rules the scheduler enforces, checkpoint
endpoints, conditioning events (images), `n` choices and an optional structured-output
grammar. Each choice becomes one sequence.

Prompt scoring: `prompt_logprobs` (k alternatives) asks for the logprob of every prompt token
after the first given the tokens before it; `embed` asks for the model's pooled final hidden
state. Either makes choice 0 a scoring sequence: it prefills from position 0 (never from the
prefix cache: a cached prefix has no logits) and its steps compute logits for every fed row.
With `max_tokens` 0 the request scores the prompt alone (finish reason length, no tokens).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from services.engine.grammar.spec import GrammarSpec
from services.engine.prefix.history import ConditioningEvent
from services.engine.vision.prompt import MultimodalPrompt


class FinishReason(enum.Enum):
    STOP = "stop"            # EOS or a stop token id
    LENGTH = "length"        # max_tokens, or the context is full
    CANCELLED = "cancelled"  # aborted by the caller (or drained)
    ERROR = "error"          # the engine failed


@dataclass(frozen=True, slots=True)
class StopRules:
    """When a choice ends; enforced by the scheduler on committed tokens."""

    max_tokens: int | None = None          # None: whatever the context leaves
    min_tokens: int = 0                    # EOS/stop ids are suppressed until this many tokens
    ignore_eos: bool = False
    stop_token_ids: frozenset[int] = frozenset()


@dataclass(frozen=True, slots=True)
class EngineRequest:
    request_id: str
    prompt_token_ids: tuple[int, ...]
    sampling: Any                          # the sampler's validated SamplingParams (opaque here)
    stop: StopRules = field(default_factory=StopRules)
    seed: int | None = None                # None: fresh entropy per request
    logprobs: bool = False
    top_logprobs: int = 0
    checkpoint_token_ends: tuple[int, ...] = ()   # message endpoints, sorted, inside the prompt
    conditioning: tuple[ConditioningEvent, ...] = ()
    n: int = 1
    priority: int = 0                      # larger runs earlier among equals
    grammar: GrammarSpec | None = None     # structured output: every choice matches it
    prompt_logprobs: int | None = None     # prompt tokens' logprobs with k alternatives
    embed: bool = False                    # return the pooled final hidden state (embedding)
    cache_salt: str = ""                   # prefix-cache tenant: salts never share KV
    speculative: bool = True               # may verify drafts (engine speculative_method on)
    # images: their spans, identities and the prompt's mRoPE rows (vision/prompt.py)
    multimodal: MultimodalPrompt | None = None

    @property
    def scores_prompt(self) -> bool:
        """Choice 0 computes logits (or pooled states) for every prompt row."""
        return self.prompt_logprobs is not None or self.embed


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float


@dataclass(frozen=True, slots=True)
class SampledLogprobs:
    token_id: int
    logprob: float
    top: tuple[TokenLogprob, ...] = ()     # best alternatives, highest first


@dataclass(frozen=True, slots=True)
class PromptLogprob:
    """The logprob of prompt token `position` given the tokens before it."""

    position: int                          # 1..prompt_len - 1
    token_id: int
    logprob: float
    rank: int                              # 1 + tokens with a strictly higher logprob
    top: tuple[TokenLogprob, ...] = ()     # best alternatives, highest first (ranks 1..k)


class Pooling(enum.Enum):
    """How an embedding pools the final (normed) hidden states of the prompt."""

    LAST = "last"                          # the last prompt token's state
    MEAN = "mean"                          # the mean over every prompt token


@dataclass(frozen=True, slots=True)
class ChoiceDelta:
    """One choice's progress in one engine step."""

    request_id: str
    index: int                              # choice index
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[SampledLogprobs, ...] = ()
    finish_reason: FinishReason | None = None
    stop_token_id: int | None = None
    error: str = ""                         # why an ERROR finish happened (grammar failures)
    prompt_logprobs: tuple[PromptLogprob, ...] = ()   # scored prompt positions, in order
    embedding: tuple[float, ...] = ()       # the pooled, normalized embedding (on finish)
    error_kind: str = ""                    # "" (a grammar failure) or "unavailable" (an image)


@dataclass(frozen=True, slots=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int             # prompt tokens served from cache (both tiers)
    cached_tokens_host: int = 0    # of them, brought back from the host tier


@dataclass(frozen=True, slots=True)
class Admitted:
    """Admission succeeded: the request is queued (its first stream message)."""

    request_id: str
    usage: Usage


@dataclass(frozen=True, slots=True)
class RequestUpdate:
    """Everything one request gained in one engine step (one IPC item per request)."""

    request_id: str
    deltas: tuple[ChoiceDelta, ...]
    usage: Usage
    finished: bool                          # every choice has finished
