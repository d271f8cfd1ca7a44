"""Sampler: logits [N, V] + a SamplingBatch -> sampled ids, their logprobs, top alternatives.

Ids past the tokenizer's vocabulary (embedding padding rows) are masked first, so no draw
and no top alternative is one of them (`vocab.py`). Order of the transforms (as vLLM's): the
grammar's token bitmask, logit_bias, min_tokens suppression, penalties -> greedy rows take the
argmax here -> temperature -> min_p -> top_k -> top_p -> a Gumbel-max draw with
counter-based noise (random_stream). Returned logprobs are those of the model's own
distribution (log_softmax of the raw logits, before any of the above), like vLLM's default.

No host synchronisation: every branch is on host flags of the batch, so a runner can capture
a sampler call in a CUDA graph (building its batches with `enable_all=True`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.sampling import filters
from services.engine.sampling.batch import SamplingBatch
from services.engine.sampling.random_stream import gumbel_noise, row_keys
from services.engine.sampling.vocab import mask_beyond_vocab_


@dataclass(frozen=True, slots=True)
class SamplerOutput:
    token_ids: torch.Tensor       # int64 [N]: the chosen token of each row
    logprobs: torch.Tensor        # float32 [N]: its log-probability under the model
    top_token_ids: torch.Tensor   # int64 [N, K]: K = the batch's max top_logprobs, best first
    top_logprobs: torch.Tensor    # float32 [N, K]

    def to_lists(self, num_top_logprobs: tuple[int, ...]) -> list[tuple[int, float,
                                                                      list[tuple[int, float]]]]:
        """Per row (token id, logprob, [(alternative id, logprob)] cut to what it asked for)."""
        ids, logprobs = self.token_ids.tolist(), self.logprobs.tolist()
        top_ids, top_values = self.top_token_ids.tolist(), self.top_logprobs.tolist()
        return [(ids[i], logprobs[i], list(zip(top_ids[i][:k], top_values[i][:k], strict=True)))
                for i, k in enumerate(num_top_logprobs)]


class Sampler:
    """Stateless; one instance serves every step (state lives in the batch).

    `token_vocab`: the tokenizer's vocabulary size; ids at or past it are never drawn nor
    listed as alternatives (None: every logit column is a token). The logprobs stay the
    model's own (log_softmax over every column, as transformers computes them)."""

    def __init__(self, token_vocab: int | None = None) -> None:
        self.token_vocab = token_vocab

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        logits = logits.float()                                         # [N, V]
        model_logprobs = torch.log_softmax(logits, dim=-1)              # [N, V]
        token_ids = self.choose(logits, batch)                          # [N]
        chosen = model_logprobs.gather(1, token_ids[:, None])[:, 0]
        k = batch.max_top_logprobs
        if k:
            tokens = model_logprobs[:, :self.token_vocab] if self.token_vocab else \
                model_logprobs
            top = torch.topk(tokens, min(k, tokens.shape[-1]), dim=-1)
            top_values, top_ids = top.values, top.indices
        else:
            top_values = model_logprobs.new_empty(logits.shape[0], 0)
            top_ids = token_ids.new_empty(logits.shape[0], 0)
        return SamplerOutput(token_ids, chosen, top_ids, top_values)

    def choose(self, logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
        """The token id of each row (int64 [N]) from float32 logits [N, V]."""
        logits = logits.clone()
        if self.token_vocab is not None:
            mask_beyond_vocab_(logits, self.token_vocab)
        if batch.token_bitmask is not None:
            logits = filters.apply_token_bitmask(logits, batch.token_bitmask)
        if batch.bias_rows is not None:
            assert batch.bias_cols is not None and batch.bias_values is not None
            filters.add_logit_bias_(logits, batch.bias_rows, batch.bias_cols, batch.bias_values)
        if batch.suppress_rows is not None:
            assert batch.suppress_cols is not None
            filters.suppress_tokens_(logits, batch.suppress_rows, batch.suppress_cols)
        if batch.output_counts is not None:
            assert batch.prompt_mask is not None and batch.presence is not None
            assert batch.frequency is not None and batch.repetition is not None
            logits = filters.apply_penalties(logits, batch.output_counts, batch.prompt_mask,
                                             batch.presence, batch.frequency, batch.repetition)
        greedy_ids = logits.argmax(dim=-1)
        if batch.all_greedy:
            return greedy_ids
        logits = filters.apply_temperature(logits, batch.temperature)
        if batch.min_p is not None:
            logits = filters.apply_min_p(logits, batch.min_p)
        if batch.top_k is not None or batch.top_p is not None:
            logits = filters.apply_top_k_top_p(logits, batch.top_k, batch.top_p,
                                               batch.num_top_candidates)
        keys = row_keys(batch.seed_lo, batch.seed_hi, batch.positions)
        sampled_ids = (logits + gumbel_noise(keys, logits.shape[-1])).argmax(dim=-1)
        return torch.where(batch.is_greedy, greedy_ids, sampled_ids)
