"""Admission checks: a request is validated completely before it touches scheduler state.

Everything here raises a typed admission error (services.common.errors) with the configured
hint where one applies; nothing is queued or reserved by a rejected request.
"""

from __future__ import annotations

from dataclasses import dataclass

from services.common.errors import (
    ContextOverflowError,
    UnsupportedError,
    ValidationError,
)
from services.engine.scheduler.requests import EngineRequest, StopRules

MAX_CHOICES = 128
MAX_PROMPT_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    vocab_size: int
    max_model_len: int            # effective context limit (tokens)
    page_size: int
    num_pages: int
    max_waiting: int              # bounded waiting queue (requests)
    context_hint: str = ""
    capacity_hint: str = ""
    supports_images: bool = False
    pooling: str = "last"         # embeddings ("": refused with pooling_hint)
    pooling_hint: str = ""


def validate_request(request: EngineRequest, limits: AdmissionLimits) -> StopRules:
    """Check a request; returns its stop rules with max_tokens resolved."""
    prompt = request.prompt_token_ids
    if not prompt:
        raise ValidationError("the prompt is empty: at least one token is required",
                              param="prompt_token_ids")
    bad = next((t for t in prompt if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise ValidationError(f"prompt token id {bad} is outside the vocabulary "
                              f"(0..{limits.vocab_size - 1})", param="prompt_token_ids")
    if not 1 <= request.n <= MAX_CHOICES:
        raise ValidationError(f"n must be between 1 and {MAX_CHOICES}, got {request.n}",
                              param="n")
    stop = request.stop
    bad = next((t for t in stop.stop_token_ids if not 0 <= t < limits.vocab_size), None)
    if bad is not None:
        raise ValidationError(f"stop token id {bad} is outside the vocabulary "
                              f"(0..{limits.vocab_size - 1})", param="sampling.stop_token_ids")
    if request.prompt_logprobs is not None and not 0 <= request.prompt_logprobs <= \
            MAX_PROMPT_LOGPROBS:
        raise ValidationError(f"prompt_logprobs must be between 0 and {MAX_PROMPT_LOGPROBS}",
                              param="prompt_logprobs")
    if request.embed and (stop.max_tokens != 0 or request.n != 1 or request.grammar or
                          request.prompt_logprobs is not None):
        raise ValidationError("an embedding request scores the prompt alone: max_tokens 0, "
                              "n 1, no grammar and no prompt_logprobs", param="embed")
    if request.embed and not limits.pooling:
        raise UnsupportedError(f"this model does not serve embeddings: {limits.pooling_hint}",
                               param="embed")
    if stop.max_tokens == 0 and not request.scores_prompt:
        raise ValidationError("max_tokens 0 needs prompt_logprobs or an embedding (nothing "
                              "would be computed)", param="sampling.max_tokens")
    if stop.max_tokens is not None and stop.max_tokens < 0:
        raise ValidationError("max_tokens must not be negative", param="sampling.max_tokens")
    if stop.min_tokens < 0 or (stop.max_tokens is not None and
                               stop.min_tokens > stop.max_tokens):
        raise ValidationError(f"min_tokens ({stop.min_tokens}) must be between 0 and "
                              f"max_tokens ({stop.max_tokens})", param="sampling.min_tokens")
    context = limits.max_model_len
    wanted = stop.max_tokens if stop.max_tokens is not None else 1
    if len(prompt) + wanted > context:
        raise ContextOverflowError(prompt_tokens=len(prompt), max_tokens=wanted,
                                   context_length=context, hint=limits.context_hint,
                                   param="sampling.max_tokens" if stop.max_tokens else
                                   "prompt_token_ids")
    ends = request.checkpoint_token_ends
    if any(not 0 < e < len(prompt) for e in ends) or list(ends) != sorted(set(ends)):
        raise ValidationError("checkpoint_token_ends must be sorted, unique and strictly "
                              "inside the prompt", param="checkpoint_token_ends")
    if request.conditioning and not limits.supports_images:
        raise UnsupportedError("this model does not accept images", param="multimodal")
    if request.conditioning and request.multimodal is None:
        raise ValidationError("images need the prompt's mRoPE positions "
                              "(multimodal.mrope_positions, from imageprep's expansion)",
                              param="multimodal.mrope_positions")
    if any(e.position >= len(prompt) for e in request.conditioning):
        raise ValidationError("an image lies outside the prompt", param="multimodal.images")
    # A choice alone must fit the page pool (plus one page restored from a snapshot). An
    # explicit max_tokens that cannot is refused; without one, output stops (length) where
    # the pool ends, as it would at the context. Such a request can never run, however long
    # it waits: a validation error (400), not capacity (503 + retry).
    pool_tokens = (limits.num_pages - 1) * limits.page_size
    if stop.max_tokens is None:
        max_tokens = min(context, pool_tokens) - len(prompt)
    else:
        max_tokens = stop.max_tokens
    needed = -(-(len(prompt) + max(1, max_tokens)) // limits.page_size) + 1
    if (max_tokens < 1 and stop.max_tokens != 0) or needed > limits.num_pages:
        raise ValidationError(
            f"the request needs {needed} KV pages ({len(prompt)} prompt + "
            f"{max(1, max_tokens)} output tokens) but the engine's whole KV cache holds "
            f"{limits.num_pages} pages ({pool_tokens} tokens), so it can never run: shorten "
            "the prompt or the output limit, or raise the engine's KV budget (engine settings "
            "`kv_cache_bytes` / `kv_cache_memory_fraction`)", hint=limits.capacity_hint,
            param="sampling.max_tokens" if stop.max_tokens else "prompt_token_ids")
    return StopRules(max_tokens=max_tokens, min_tokens=stop.min_tokens,
                     ignore_eos=stop.ignore_eos, stop_token_ids=stop.stop_token_ids)
