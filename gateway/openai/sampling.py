"""Sampling fields shared by /v1/chat/completions and /v1/completions (OpenAI + vLLM extras)."""

from __future__ import annotations

from pydantic import Field

from gateway.schema import ApiModel, Identifier, Int32, Seed, TokenId, UInt32, UserString
from services.common.api.generate import Sampling
from services.common.errors import ValidationError

MAX_CHOICES = 128


class StreamOptions(ApiModel):
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None


class SamplingFields(ApiModel):
    """OpenAI sampling fields plus vLLM's extensions, all at the top level of the body."""

    temperature: float | None = Field(default=None, ge=0, le=100)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: Int32 | None = Field(default=None, ge=-1)
    min_p: float | None = Field(default=None, ge=0, le=1)
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0, le=100)
    seed: Seed | None = None
    min_tokens: UInt32 = 0
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stop_token_ids: list[TokenId] | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool | None = None
    spaces_between_special_tokens: bool | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = Field(default=None, ge=1, le=MAX_CHOICES)
    # vLLM: the prompt tokens' logprobs with this many alternatives (`prompt_logprobs`)
    prompt_logprobs: int | None = Field(default=None, ge=0, le=20)
    user: UserString | None = None
    cache_salt: Identifier | None = None     # vLLM: prefix-cache tenant (salts share no KV)
    priority: Int32 = 0
    request_id: str | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)

    def stop_strings(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return tuple(s for s in stops if s)

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        pairs = []
        for key, bias in (self.logit_bias or {}).items():
            try:
                token_id = int(key)
            except ValueError:
                raise ValidationError(f"logit_bias keys must be token ids, not {key!r}",
                                      param="logit_bias") from None
            if not 0 <= token_id < 2**32:
                raise ValidationError(f"logit_bias token id {token_id} is out of range",
                                      param="logit_bias")
            if not -100 <= bias <= 100:
                raise ValidationError("logit_bias values must be within -100..100",
                                      param=f"logit_bias.{key}")
            pairs.append((token_id, float(bias)))
        return tuple(pairs)

    def sampling(self, *, max_tokens: int | None, logprobs: bool,
                 top_logprobs: int) -> Sampling:
        return Sampling(
            temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
            min_p=self.min_p, presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=self.repetition_penalty, seed=self.seed,
            max_tokens=max_tokens, min_tokens=self.min_tokens, ignore_eos=self.ignore_eos,
            stop_token_ids=tuple(self.stop_token_ids or ()), logprobs=logprobs,
            top_logprobs=top_logprobs, logit_bias=self.logit_bias_pairs())
