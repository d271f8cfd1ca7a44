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

Verification (`verify`: per-row `VerifyRows`): a slot samples several rows, row o as if the o
drafts before it were accepted: the random stream's position, min_tokens and the penalty
counts include them, and its grammar bitmask is row o's. The rows' emitted prefix (each row's
token up to and including the first that differs from the row's draft) then advances the
slot's state by exactly the emitted tokens; the returned mask marks each sequence's last
emitted row (its token is the slot's last token).
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


@dataclass(frozen=True, slots=True)
class VerifyRows:
    """Per sampled row of a verification step (device int64 [S] each)."""

    offsets: torch.Tensor     # the row's offset among its sequence's rows
    drafts: torch.Tensor      # the draft the row's token is checked against (-1: none)
    first: torch.Tensor       # index of its sequence's first sampled row


def draft_counts(verify: VerifyRows, vocab: int) -> torch.Tensor:
    """int32 [S, V]: how often each token occurs among the drafts before each row."""
    drafts = verify.drafts
    num_rows = drafts.shape[0]
    onehot = torch.zeros((num_rows, vocab), dtype=torch.int32, device=drafts.device)
    onehot.scatter_(1, drafts.clamp(min=0)[:, None], (drafts >= 0).to(torch.int32)[:, None])
    before = onehot.cumsum(0, dtype=torch.int32) - onehot        # rows before, all sequences
    return before - before.index_select(0, verify.first)


def sample_rows(logits: torch.Tensor, slots: torch.Tensor, state: SlotState,
                mode: SamplingMode, logprobs: bool, out: SampleOutputs,
                grammar: bool = False, verify: VerifyRows | None = None
                ) -> torch.Tensor | None:
    num_rows, vocab = logits.shape
    ints, floats = state.ints, state.floats
    position = ints["output_pos"].index_select(0, slots)                    # [S]
    if verify is not None:
        position = position + verify.offsets
    x = logits
    if state.token_vocab < vocab:   # the embedding's padding rows: never drawn (a static slice)
        x = mask_beyond_vocab_(logits.clone(), state.token_vocab)
    if grammar:     # structured outputs: each row's bitmask (all ones for free rows)
        mask_rows = slots if verify is None else slots + verify.offsets * state.num_rows
        x = filters.apply_token_bitmask(x, state.token_bitmask.index_select(0, mask_rows))
    if mode is SamplingMode.FULL:
        x = x + state.bias.index_select(0, slots)
        below = position < ints["min_tokens"].index_select(0, slots)         # [S]
        x = x.masked_fill(state.stop_mask.index_select(0, slots) & below[:, None],
                          float("-inf"))
        counts = state.counts.index_select(0, slots)
        if verify is not None:
            counts = counts + draft_counts(verify, vocab)
        x = filters.apply_penalties(
            x, counts, state.prompt_mask.index_select(0, slots),
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
                        ints["seed_hi"].index_select(0, slots), position)
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
    if verify is not None:
        return _advance_verified(ids, slots, state, mode, verify)
    # the rows' state moves on (duplicate padding rows all land in the padding row)
    ints["last_token"].index_copy_(0, slots, ids)
    ints["output_pos"].index_add_(0, slots, torch.ones_like(slots))
    if mode is SamplingMode.FULL:
        state.counts.view(-1).scatter_add_(0, slots * vocab + ids,
                                           torch.ones_like(ids, dtype=torch.int32))
    return None


def _advance_verified(ids: torch.Tensor, slots: torch.Tensor, state: SlotState,
                      mode: SamplingMode, verify: VerifyRows) -> torch.Tensor:
    """Advance each slot by its emitted rows: a row is emitted when every earlier row of its
    sequence matched its draft (the first row always is); the last emitted row is the first
    that did not match (a row without a draft never does). Returns that row's mask [S]."""
    mismatch = (ids != verify.drafts).to(torch.int64)
    before = mismatch.cumsum(0) - mismatch                  # mismatches in earlier rows
    emitted = before == before.index_select(0, verify.first)
    last = emitted & (mismatch > 0)
    ints = state.ints
    padding = torch.full_like(slots, state.padding_row)
    ints["last_token"].index_copy_(0, torch.where(last, slots, padding), ids)
    ints["output_pos"].index_add_(0, slots, emitted.to(torch.int64))
    if mode is SamplingMode.FULL:
        vocab = state.vocab_size
        state.counts.view(-1).scatter_add_(0, slots * vocab + ids, emitted.to(torch.int32))
    return last
