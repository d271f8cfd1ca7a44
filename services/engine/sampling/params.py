"""SamplingParams: one request's sampling settings, validated, with the contract's defaults.

Defaults are those written in proto `helios.v1.SamplingParams` (unset optionals = defaults).
Out-of-range values raise `ValidationError` naming the field (`param="sampling.<field>"`);
checks that need the model (token ids within the vocabulary) are in `check_vocab`.
`from_pb` reads the protobuf message by duck typing, so this module never imports `*_pb2`.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass, replace
from typing import Any

import numpy

from services.common.errors import ValidationError

MAX_TOP_LOGPROBS = 20
MAX_LOGIT_BIAS = 100.0
MAX_SEED = (1 << 64) - 1
PENALTY_RANGE = (-2.0, 2.0)          # presence/frequency, as the OpenAI API
REPETITION_RANGE = (0.0, 2.0)        # exclusive lower bound
GREEDY_TEMPERATURE = 1e-5            # below this, temperature means greedy (as vLLM)


def _fail(field: str, message: str) -> ValidationError:
    return ValidationError(f"sampling.{field} {message}", param=f"sampling.{field}")


@dataclass(frozen=True, slots=True)
class SamplingParams:
    temperature: float = 1.0          # 0 (or below GREEDY_TEMPERATURE) = greedy
    top_p: float = 1.0                # (0, 1]; 1 = off
    top_k: int = 0                    # 0 or -1 = off
    min_p: float = 0.0                # [0, 1]; 0 = off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0   # 1 = off; over prompt and output tokens
    seed: int | None = None           # None: unseeded (admission draws one: `with_seed`)
    max_tokens: int | None = None     # None: whatever the context leaves
    min_tokens: int = 0               # EOS/stop ids are suppressed until this many tokens
    ignore_eos: bool = False
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0             # 0..20 alternatives per token
    logit_bias: tuple[tuple[int, float], ...] = ()   # (token id, bias), sorted by id

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if not math.isfinite(getattr(self, name)):
                raise _fail(name, "must be a finite number")
        if self.temperature < 0:
            raise _fail("temperature", f"must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise _fail("top_p", f"must be in (0, 1], got {self.top_p}")
        if self.top_k < -1:
            raise _fail("top_k", f"must be -1, 0 (off) or a positive count, got {self.top_k}")
        if not 0 <= self.min_p <= 1:
            raise _fail("min_p", f"must be in [0, 1], got {self.min_p}")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not PENALTY_RANGE[0] <= value <= PENALTY_RANGE[1]:
                raise _fail(name, f"must be in [-2, 2], got {value}")
        if not REPETITION_RANGE[0] < self.repetition_penalty <= REPETITION_RANGE[1]:
            raise _fail("repetition_penalty", f"must be in (0, 2], got {self.repetition_penalty}")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise _fail("seed", "must be an unsigned 64-bit integer")
        if self.max_tokens is not None and self.max_tokens < 0:
            # 0 scores the prompt alone: admission allows it only with prompt scoring
            raise _fail("max_tokens", f"must be >= 0, got {self.max_tokens}")
        if self.min_tokens < 0:
            raise _fail("min_tokens", f"must be >= 0, got {self.min_tokens}")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            raise _fail("min_tokens", f"({self.min_tokens}) must not exceed max_tokens "
                                      f"({self.max_tokens})")
        if any(t < 0 for t in self.stop_token_ids):
            raise _fail("stop_token_ids", "must be non-negative token ids")
        if not 0 <= self.top_logprobs <= MAX_TOP_LOGPROBS:
            raise _fail("top_logprobs", f"must be in [0, {MAX_TOP_LOGPROBS}], got "
                                        f"{self.top_logprobs}")
        seen: set[int] = set()
        for token_id, bias in self.logit_bias:
            if token_id < 0 or token_id in seen:
                raise _fail("logit_bias", f"has a negative or repeated token id {token_id}")
            seen.add(token_id)
            if not math.isfinite(bias) or abs(bias) > MAX_LOGIT_BIAS:
                raise _fail("logit_bias", f"[{token_id}] must be in [-100, 100], got {bias}")

    # -- derived --------------------------------------------------------------------------

    @property
    def is_greedy(self) -> bool:
        return self.temperature < GREEDY_TEMPERATURE

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k > 0

    @property
    def has_penalties(self) -> bool:
        return (self.presence_penalty != 0 or self.frequency_penalty != 0
                or self.repetition_penalty != 1)

    @property
    def num_top_logprobs(self) -> int:
        """Alternatives to return per token (0 when logprobs are off)."""
        return self.top_logprobs if self.logprobs else 0

    # -- admission ------------------------------------------------------------------------

    def check_vocab(self, vocab_size: int) -> None:
        """Token ids the request names must be the tokenizer's (`vocab_size`: its size, the
        one every vocabulary message names, sampling/vocab.py)."""
        for token_id, _ in self.logit_bias:
            if token_id >= vocab_size:
                raise _fail("logit_bias", f"names token id {token_id}, outside the vocabulary "
                                          f"(0..{vocab_size - 1})")
        for token_id in self.stop_token_ids:
            if token_id >= vocab_size:
                raise _fail("stop_token_ids", f"names token id {token_id}, outside the "
                                              f"vocabulary (0..{vocab_size - 1})")

    def with_seed(self) -> SamplingParams:
        """These params with a seed: the given one, or fresh entropy (done at admission)."""
        return self if self.seed is not None else replace(self, seed=secrets.randbits(64))

    @classmethod
    def create(cls, *, logit_bias: dict[int, float] | None = None,
               stop_token_ids: list[int] | tuple[int, ...] = (), **fields: Any
               ) -> SamplingParams:
        """Keyword construction with a dict logit_bias and a list of stop ids."""
        bias = tuple(sorted((int(k), float(v)) for k, v in (logit_bias or {}).items()))
        return cls(logit_bias=bias, stop_token_ids=tuple(int(t) for t in stop_token_ids),
                   **fields)

    @classmethod
    def from_pb(cls, message: Any) -> SamplingParams:
        """From a `helios.v1.SamplingParams` message (unset optionals keep the defaults)."""
        optional = {name: getattr(message, name) for name in (
            "temperature", "top_p", "top_k", "min_p", "presence_penalty", "frequency_penalty",
            "repetition_penalty", "seed", "max_tokens") if message.HasField(name)}
        for name in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty",
                     "repetition_penalty"):
            if name in optional:   # proto floats are float32: 0.95 arrives as 0.949999988...
                optional[name] = float(str(numpy.float32(optional[name])))  # shortest repr
        return cls.create(
            min_tokens=message.min_tokens, ignore_eos=message.ignore_eos,
            stop_token_ids=list(message.stop_token_ids), logprobs=message.logprobs,
            top_logprobs=message.top_logprobs, logit_bias=dict(message.logit_bias), **optional)


def choice_seed(seed: int, index: int) -> int:
    """The seed of choice `index` of an n>1 request: choice 0 keeps the request's seed."""
    if index == 0:
        return seed
    mixed = (seed ^ (0x9E3779B97F4A7C15 * index)) & MAX_SEED
    mixed = ((mixed ^ (mixed >> 30)) * 0xBF58476D1CE4E5B9) & MAX_SEED
    return (mixed ^ (mixed >> 27)) & MAX_SEED
