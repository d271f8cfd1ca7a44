"""SamplingBatch: the per-row sampling inputs of one step as device tensors, built on the host.

The runner describes each row that samples this step with a `SamplingRow` (its params, the
tokens it generated so far and its prompt) and builds one `SamplingBatch`. Host-side flags
(`all_greedy`, `has_top_k` ...) let the sampler skip work no row needs; a runner that captures
the sampler in a CUDA graph builds batches with `enable_all=True` so every path is present.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch

from services.common.errors import ValidationError
from services.engine.sampling.params import SamplingParams
from services.engine.sampling.random_stream import split_seed


@dataclass(frozen=True, slots=True)
class SamplingRow:
    params: SamplingParams              # seed must be resolved (SamplingParams.with_seed)
    output_token_ids: Sequence[int]     # generated so far; its length is the random position
    prompt_token_ids: Sequence[int] = ()   # only read for repetition_penalty
    allowed_tokens: Any = None          # int32 [ceil(V / 32)] grammar bitmask (None: all)


@dataclass(frozen=True, slots=True)
class SamplingBatch:
    temperature: torch.Tensor           # float32 [N]; 0 = greedy
    is_greedy: torch.Tensor             # bool [N]
    top_k: torch.Tensor | None          # int64 [N]; vocab_size = off (None: no row uses it)
    top_p: torch.Tensor | None          # float32 [N]; 1 = off
    min_p: torch.Tensor | None          # float32 [N]; 0 = off
    presence: torch.Tensor | None       # float32 [N]  (penalties: None when no row has any)
    frequency: torch.Tensor | None      # float32 [N]
    repetition: torch.Tensor | None     # float32 [N]
    output_counts: torch.Tensor | None  # int32 [N, V]: occurrences of each token in the output
    prompt_mask: torch.Tensor | None    # bool [N, V]: token occurs in the prompt
    bias_rows: torch.Tensor | None      # int64 [M], bias_cols int64 [M], bias_values f32 [M]
    bias_cols: torch.Tensor | None
    bias_values: torch.Tensor | None
    suppress_rows: torch.Tensor | None  # int64 [S], suppress_cols int64 [S]: -inf (min_tokens)
    suppress_cols: torch.Tensor | None
    seed_lo: torch.Tensor               # int64 [N]: low/high 32 bits of each row's seed
    seed_hi: torch.Tensor               # int64 [N]
    positions: torch.Tensor             # int64 [N]: tokens generated so far (random position)
    token_bitmask: torch.Tensor | None  # int32 [N, ceil(V / 32)]: grammar masks (None: none)
    num_top_candidates: int             # host: logits sorted per row for top_k/top_p
    num_top_logprobs: tuple[int, ...]   # host: alternatives each row asked for
    all_greedy: bool                    # host: no row samples randomly

    @property
    def num_rows(self) -> int:
        return len(self.num_top_logprobs)

    @property
    def max_top_logprobs(self) -> int:
        return max(self.num_top_logprobs, default=0)

    @classmethod
    def build(cls, rows: Sequence[SamplingRow], vocab_size: int,
              eos_token_ids: Sequence[int] = (), device: torch.device | str = "cpu", *,
              enable_all: bool = False) -> SamplingBatch:
        """Tensors for `rows`; `eos_token_ids` are suppressed (with stop ids) below min_tokens."""
        if not rows:
            raise ValidationError("a sampling batch needs at least one row")
        params = [row.params for row in rows]
        if any(p.seed is None for p in params):
            raise ValidationError("sampling rows need a resolved seed (SamplingParams.with_seed "
                                  "at admission)")

        def floats(values: list[float]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.float32, device=device)

        def longs(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        num_rows = len(rows)
        temperature = floats([0.0 if p.is_greedy else p.temperature for p in params])
        sampling_rows = [not p.is_greedy for p in params]
        sampled = [p for p in params if not p.is_greedy]   # filters never change an argmax
        has_top_k = enable_all or any(p.top_k_enabled for p in sampled)
        has_top_p = enable_all or any(p.top_p < 1 for p in sampled)
        has_min_p = enable_all or any(p.min_p > 0 for p in sampled)
        has_penalties = enable_all or any(p.has_penalties for p in params)
        # top_k/top_p sort only the largest logits, unless a row asks top_p without top_k
        if enable_all or any(p.top_p < 1 and not p.top_k_enabled for p in sampled):
            num_top_candidates = vocab_size
        else:
            num_top_candidates = min(vocab_size, max(
                (p.top_k for p in sampled if p.top_k_enabled), default=vocab_size))

        output_counts = prompt_mask = None
        if has_penalties:
            output_counts = torch.zeros(num_rows, vocab_size, dtype=torch.int32, device=device)
            prompt_mask = torch.zeros(num_rows, vocab_size, dtype=torch.bool, device=device)
            for i, row in enumerate(rows):
                if not row.params.has_penalties:
                    continue
                if row.output_token_ids:
                    ids = longs(list(row.output_token_ids))
                    output_counts[i].index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
                if row.params.repetition_penalty != 1 and row.prompt_token_ids:
                    prompt_mask[i, longs(list(row.prompt_token_ids))] = True

        bias = [(i, token, value) for i, p in enumerate(params) for token, value in p.logit_bias]
        suppress = [(i, token) for i, (row, p) in enumerate(zip(rows, params, strict=True))
                    if len(row.output_token_ids) < p.min_tokens
                    for token in sorted({*eos_token_ids, *p.stop_token_ids})]
        seeds = [split_seed(p.seed or 0) for p in params]
        token_bitmask = None
        if any(row.allowed_tokens is not None for row in rows):
            words = (vocab_size + 31) // 32
            masks = numpy.full((num_rows, words), -1, dtype=numpy.int32)
            for i, row in enumerate(rows):
                if row.allowed_tokens is not None:
                    masks[i] = row.allowed_tokens
            token_bitmask = torch.from_numpy(masks).to(device)
        return cls(
            temperature=temperature,
            is_greedy=temperature == 0,
            top_k=longs([p.top_k if p.top_k_enabled else vocab_size for p in params])
            if has_top_k else None,
            top_p=floats([p.top_p for p in params]) if has_top_p else None,
            min_p=floats([p.min_p for p in params]) if has_min_p else None,
            presence=floats([p.presence_penalty for p in params]) if has_penalties else None,
            frequency=floats([p.frequency_penalty for p in params]) if has_penalties else None,
            repetition=floats([p.repetition_penalty for p in params]) if has_penalties else None,
            output_counts=output_counts,
            prompt_mask=prompt_mask,
            bias_rows=longs([b[0] for b in bias]) if bias or enable_all else None,
            bias_cols=longs([b[1] for b in bias]) if bias or enable_all else None,
            bias_values=floats([b[2] for b in bias]) if bias or enable_all else None,
            suppress_rows=longs([s[0] for s in suppress]) if suppress or enable_all else None,
            suppress_cols=longs([s[1] for s in suppress]) if suppress or enable_all else None,
            seed_lo=longs([lo for lo, _ in seeds]),
            seed_hi=longs([hi for _, hi in seeds]),
            positions=longs([len(row.output_token_ids) for row in rows]),
            token_bitmask=token_bitmask,
            num_top_candidates=num_top_candidates,
            num_top_logprobs=tuple(p.num_top_logprobs for p in params),
            all_greedy=not enable_all and not any(sampling_rows),
        )
