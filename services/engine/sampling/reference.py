"""Plain one-row-at-a-time versions of every sampling step, for tests of the batched sampler.

Written for clarity, not speed: Python lists of floats, float64 math, one loop per rule. The
semantics are stated in services/engine/sampling/filters.py.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from services.engine.sampling.params import SamplingParams

NEG_INF = float("-inf")


def softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    weights = [math.exp(x - top) if x != NEG_INF else 0.0 for x in logits]
    total = sum(weights)
    return [w / total for w in weights]


def log_softmax(logits: Sequence[float]) -> list[float]:
    top = max(logits)
    log_total = top + math.log(sum(math.exp(x - top) for x in logits if x != NEG_INF))
    return [x - log_total for x in logits]


def apply_penalties(logits: Sequence[float], prompt_ids: Sequence[int],
                    output_ids: Sequence[int], presence: float, frequency: float,
                    repetition: float) -> list[float]:
    counts = Counter(output_ids)
    seen = set(prompt_ids) | set(output_ids)
    out = []
    for token, logit in enumerate(logits):
        if token in seen:
            logit = logit / repetition if logit > 0 else logit * repetition
        logit -= frequency * counts[token]
        if counts[token]:
            logit -= presence
        out.append(logit)
    return out


def apply_min_p(logits: Sequence[float], min_p: float) -> list[float]:
    probs = softmax(logits)
    threshold = max(probs) * min_p
    return [x if p >= threshold else NEG_INF for x, p in zip(logits, probs, strict=True)]


def apply_top_k(logits: Sequence[float], top_k: int) -> list[float]:
    if top_k <= 0 or top_k >= len(logits):
        return list(logits)
    kth = sorted(logits, reverse=True)[top_k - 1]
    return [x if x >= kth else NEG_INF for x in logits]


def apply_top_p(logits: Sequence[float], top_p: float) -> list[float]:
    probs = softmax(logits)
    order = sorted(range(len(logits)), key=lambda t: logits[t], reverse=True)
    mass, last_kept = 0.0, order[0]
    for token in order:
        if mass >= top_p:
            break
        last_kept = token
        mass += probs[token]
    threshold = logits[last_kept]
    return [x if x >= threshold else NEG_INF for x in logits]


def process(logits: Sequence[float], params: SamplingParams, output_ids: Sequence[int],
            prompt_ids: Sequence[int], eos_token_ids: Sequence[int]) -> list[float]:
    """Every transform up to (and including) top_p; greedy rows stop after the penalties."""
    out = list(logits)
    for token, bias in params.logit_bias:
        out[token] += bias
    if len(output_ids) < params.min_tokens:
        for token in {*eos_token_ids, *params.stop_token_ids}:
            out[token] = NEG_INF
    out = apply_penalties(out, prompt_ids if params.repetition_penalty != 1 else (),
                          output_ids, params.presence_penalty, params.frequency_penalty,
                          params.repetition_penalty)
    if params.is_greedy:
        return out
    out = [x / params.temperature for x in out]
    if params.min_p > 0:
        out = apply_min_p(out, params.min_p)
    out = apply_top_k(out, params.top_k)
    if params.top_p < 1:
        out = apply_top_p(out, params.top_p)
    return out


def choose(logits: Sequence[float], params: SamplingParams, output_ids: Sequence[int],
           prompt_ids: Sequence[int], eos_token_ids: Sequence[int],
           uniforms: Sequence[float]) -> int:
    """The token one row samples, given its uniforms (one per token) as an exponential race."""
    out = process(logits, params, output_ids, prompt_ids, eos_token_ids)
    if params.is_greedy:
        return max(range(len(out)), key=lambda t: (out[t], -t))   # first maximum
    probs = softmax(out)
    return max(range(len(out)), key=lambda t: probs[t] / -math.log(uniforms[t]))
