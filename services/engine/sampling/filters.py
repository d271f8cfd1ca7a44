"""Batched logit transforms, one per sampling setting, each row with its own parameters.

All functions take float32 logits [N, V] and per-row tensors, return new logits (or edit in
place where named `*_`), never read values back to the host, and keep each row's maximum
token, so no row can end up with nothing to sample. Semantics (the reference.py twins state
them one row at a time):

- penalties (over output tokens; repetition also over the prompt): a token seen before has its
  logit divided by `repetition` when positive, multiplied when not; then
  `logit -= frequency * count + presence * (count > 0)` with counts over the output.
- min_p: drop tokens whose probability is below min_p * (the top token's probability).
- top_k: keep tokens whose logit is at least the k-th largest (ties at the boundary stay).
- top_p: over the top-k survivors, keep the smallest prefix of the sorted distribution whose
  probability mass reaches top_p (the first token always stays; ties at the boundary stay).
- token bitmask (structured outputs): a token whose bit is clear (bit t % 32 of int32 word
  t // 32) gets -inf. This one is applied first and may leave a row nothing but what its
  grammar allows.
"""

from __future__ import annotations

import torch

NEG_INF = float("-inf")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """logits float [N, V], bitmask int32 [N, ceil(V / 32)] -> disallowed tokens at -inf.
    Pure tensor ops (graph-safe): the bits are unpacked on the device."""
    rows, vocab = logits.shape
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1                            # [N, W, 32]
    allowed = bits.reshape(rows, -1)[:, :vocab] != 0                        # [N, V]
    return logits.masked_fill(~allowed, NEG_INF)


def add_logit_bias_(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor,
                    values: torch.Tensor) -> None:
    """logits[rows[i], cols[i]] += values[i] (flat triples, one per (row, biased token))."""
    logits.index_put_((rows, cols), values, accumulate=True)


def suppress_tokens_(logits: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> None:
    """logits[rows[i], cols[i]] = -inf (EOS/stop ids of rows below min_tokens)."""
    logits.index_put_((rows, cols), torch.full(rows.shape, NEG_INF, dtype=logits.dtype,
                                               device=logits.device))


def apply_penalties(logits: torch.Tensor, output_counts: torch.Tensor,
                    prompt_mask: torch.Tensor, presence: torch.Tensor, frequency: torch.Tensor,
                    repetition: torch.Tensor) -> torch.Tensor:
    """output_counts int [N, V], prompt_mask bool [N, V]; penalties float32 [N]."""
    counts = output_counts.to(logits.dtype)
    seen = (output_counts > 0) | prompt_mask
    rep = repetition[:, None]
    logits = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
    return logits - frequency[:, None] * counts - presence[:, None] * (output_counts > 0)


def apply_temperature(logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """Divide by each row's temperature (greedy rows, temperature 0, are left unscaled)."""
    return logits / torch.where(temperature > 0, temperature, 1.0)[:, None]


def apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True) * min_p[:, None]
    return logits.masked_fill(probs < threshold, NEG_INF)


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None,
                      top_p: torch.Tensor | None, num_candidates: int | None = None
                      ) -> torch.Tensor:
    """top_k int64 [N] (> num_candidates means off), top_p float32 [N] (1 means off).

    Only the `num_candidates` largest logits of each row are sorted (torch.topk; the whole row
    when None). It must be at least every row's top_k, and the vocabulary size when a row with
    top_p < 1 has no top_k; the batch computes it. Ties beyond the candidates are still
    handled by value, so the result equals a full sort's.
    """
    vocab = logits.shape[-1]
    candidates = vocab if num_candidates is None or top_k is None else min(num_candidates,
                                                                            vocab)
    values = torch.topk(logits, candidates, dim=-1).values                     # [N, C] desc
    if top_k is not None:
        index = (top_k.clamp(1, candidates) - 1)[:, None]
        kth = torch.where(top_k[:, None] <= candidates, values.gather(1, index), NEG_INF)
        logits = logits.masked_fill(logits < kth, NEG_INF)
        values = values.masked_fill(values < kth, NEG_INF)
    if top_p is not None:
        log_total = torch.logsumexp(logits, dim=-1, keepdim=True)   # over every survivor
        probs = torch.exp(values - log_total)                                  # [N, C]
        mass_before = torch.cumsum(probs, dim=-1) - probs                      # exclusive
        keep = mass_before < top_p[:, None]
        keep[:, 0] = True
        last = keep.sum(dim=-1, keepdim=True) - 1                              # [N, 1]
        threshold = torch.where(top_p[:, None] < 1, values.gather(1, last), NEG_INF)
        logits = logits.masked_fill(logits < threshold, NEG_INF)
    return logits
