"""Sampling from per-slot device state, inside a CUDA graph or eagerly: the same transforms,
order and counter-based noise as `services.engine.sampling.Sampler`, with every per-row input
gathered from `SlotState` by slot row instead of built from Python lists each step.

    sample_rows(logits [S, V] float32, slots int64 [S], state, mode, logprobs, out, grammar)

writes the chosen ids (and, with `logprobs`, their log-probabilities and the top
`MAX_TOP_LOGPROBS` alternatives) into `out`, then advances the rows' state on the device: last
token, tokens-generated counter and (FULL mode) penalty counts. Nothing reads a value back to
the host; the mode is a host choice (one graph per mode). A row left at its "off" values (top_k
= vocab, top_p = 1, min_p = 0, no penalties, no bias) is unchanged by a FULL step's
transforms, so rows of different needs share a step; likewise a row whose bitmask is all
ones in a grammar step (`grammar`: the step samples a constrained choice; masks applied first).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from services.engine.runner.slot_state import SamplingMode, SlotState
from services.engine.sampling import filters
from services.engine.sampling.params import MAX_TOP_LOGPROBS
from services.engine.sampling.random_stream import gumbel_noise, row_keys
from services.engine.sampling.vocab import mask_beyond_vocab_


@dataclass(frozen=True, slots=True)
class SampleOutputs:
    """Persistent output rows: ids [1 + K, S_max] int64 (row 0: the chosen ids, then the top
    alternatives), logprobs [1 + K, S_max] float32 (row 0: the chosen ids' logprobs)."""

    ids: torch.Tensor
    logprobs: torch.Tensor

    @classmethod
    def allocate(cls, max_rows: int, device: torch.device) -> SampleOutputs:
        rows = 1 + MAX_TOP_LOGPROBS
        return cls(torch.zeros((rows, max_rows), dtype=torch.int64, device=device),
                   torch.zeros((rows, max_rows), dtype=torch.float32, device=device))


def sample_rows(logits: torch.Tensor, slots: torch.Tensor, state: SlotState,
                mode: SamplingMode, logprobs: bool, out: SampleOutputs,
                grammar: bool = False) -> None:
    num_rows, vocab = logits.shape
    ints, floats = state.ints, state.floats
    x = logits
    if state.token_vocab < vocab:   # the embedding's padding rows: never drawn (a static slice)
        x = mask_beyond_vocab_(logits.clone(), state.token_vocab)
    if grammar:     # structured outputs: each row's bitmask (all ones for free rows)
        x = filters.apply_token_bitmask(x, state.token_bitmask.index_select(0, slots))
    if mode is SamplingMode.FULL:
        x = x + state.bias.index_select(0, slots)
        below = ints["output_pos"].index_select(0, slots) < \
            ints["min_tokens"].index_select(0, slots)                       # [S]
        x = x.masked_fill(state.stop_mask.index_select(0, slots) & below[:, None],
                          float("-inf"))
        x = filters.apply_penalties(
            x, state.counts.index_select(0, slots), state.prompt_mask.index_select(0, slots),
            floats["presence"].index_select(0, slots), floats["frequency"].index_select(0, slots),
            floats["repetition"].index_select(0, slots))
    ids = x.argmax(dim=-1)                                                   # [S] greedy
    if mode is not SamplingMode.GREEDY:
        temperature = floats["temperature"].index_select(0, slots)
        y = filters.apply_temperature(x, temperature)
        if mode is SamplingMode.FULL:
            y = filters.apply_min_p(y, floats["min_p"].index_select(0, slots))
            y = filters.apply_top_k_top_p(y, ints["top_k"].index_select(0, slots),
                                          floats["top_p"].index_select(0, slots), vocab)
        keys = row_keys(ints["seed_lo"].index_select(0, slots),
                        ints["seed_hi"].index_select(0, slots),
                        ints["output_pos"].index_select(0, slots))
        drawn = (y + gumbel_noise(keys, vocab)).argmax(dim=-1)
        ids = torch.where(temperature > 0, drawn, ids)
    out.ids[0, :num_rows].copy_(ids)
    if logprobs:
        model_logprobs = torch.log_softmax(logits, dim=-1)                   # [S, V]
        out.logprobs[0, :num_rows].copy_(model_logprobs.gather(1, ids[:, None])[:, 0])
        k = min(MAX_TOP_LOGPROBS, state.token_vocab)
        top = torch.topk(model_logprobs[:, :state.token_vocab], k, dim=-1)
        out.ids[1:1 + k, :num_rows].copy_(top.indices.t())
        out.logprobs[1:1 + k, :num_rows].copy_(top.values.t())
    # the rows' state moves on (duplicate padding rows all land in the padding row)
    ints["last_token"].index_copy_(0, slots, ids)
    ints["output_pos"].index_add_(0, slots, torch.ones_like(slots))
    if mode is SamplingMode.FULL:
        state.counts.view(-1).scatter_add_(0, slots * vocab + ids,
                                           torch.ones_like(ids, dtype=torch.int32))
