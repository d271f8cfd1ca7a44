"""Prompt scoring on the device: prompt logprobs and pooled hidden states of a step's rows.

    scores = score_step(model, step, layout, hidden)   # enqueued device work (no sync)
    results = scores.collect()                          # step.seqs index -> (logprobs, pooled)

Only sequences whose `SeqStep` asks (`score_targets`, `pool`) cost anything: a step without
them returns an empty `StepScores` without touching the device. For scored rows the logits
of the final hidden states go through log_softmax (float32), the next prompt token's logprob
is gathered, its rank counted (1 + tokens with a strictly higher logprob) and the best
`score_top` alternatives taken among the tokenizer's ids (`token_vocab`: an embedding's
padding rows are never listed, as the samplers never draw them). Rows are scored in blocks of `ROW_BLOCK` so that a long prefill
chunk never materialises [T, V] logits at once. Both runners call this from their eager path:
the TorchRunner collects at once, the GraphRunner when the step's completion is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from services.engine.model import CausalLM
from services.engine.runner.layout import StepLayout
from services.engine.scheduler.plan import Step
from services.engine.scheduler.requests import PromptLogprob, TokenLogprob

ROW_BLOCK = 256


@dataclass(slots=True)
class _SeqScores:
    first_position: int                        # position of the first target
    targets: list[int]
    logprobs: list[torch.Tensor] = field(default_factory=list)   # [r] per block
    ranks: list[torch.Tensor] = field(default_factory=list)      # [r]
    top_ids: list[torch.Tensor] = field(default_factory=list)    # [r, k]
    top_logprobs: list[torch.Tensor] = field(default_factory=list)
    pooled: torch.Tensor | None = None         # [H] float32


@dataclass(slots=True)
class StepScores:
    seqs: dict[int, _SeqScores] = field(default_factory=dict)

    def collect(self) -> dict[int, tuple[tuple[PromptLogprob, ...], tuple[float, ...]]]:
        """Host values (waits for the device work behind them)."""
        out: dict[int, tuple[tuple[PromptLogprob, ...], tuple[float, ...]]] = {}
        for index, scores in self.seqs.items():
            entries: list[PromptLogprob] = []
            if scores.targets:
                logprobs = torch.cat(scores.logprobs).tolist()
                ranks = torch.cat(scores.ranks).tolist()
                top_ids = torch.cat(scores.top_ids).tolist()
                top_lps = torch.cat(scores.top_logprobs).tolist()
                for j, target in enumerate(scores.targets):
                    entries.append(PromptLogprob(
                        scores.first_position + j, target, logprobs[j], int(ranks[j]),
                        tuple(TokenLogprob(t, lp) for t, lp in
                              zip(top_ids[j], top_lps[j], strict=True))))
            pooled = tuple(scores.pooled.tolist()) if scores.pooled is not None else ()
            out[index] = (tuple(entries), pooled)
        return out


def score_step(model: CausalLM, step: Step, layout: StepLayout,
               hidden: torch.Tensor | None, token_vocab: int | None = None) -> StepScores:
    """Enqueue the scoring work of every sequence of `step` that asks for it."""
    scores = StepScores()
    if hidden is None or not any(seq.scores for seq in step.seqs):
        return scores
    for k, index in enumerate(layout.forward_seqs):
        seq = step.seqs[index]
        if not seq.scores:
            continue
        first = layout.query_start_loc[k]
        fed = len(seq.token_ids)
        entry = _SeqScores(seq.start + 1, list(seq.score_targets))
        if seq.score_targets:
            if len(seq.score_targets) > fed:
                raise RuntimeError(f"slot {seq.handle}: {len(seq.score_targets)} score "
                                   f"targets for {fed} fed rows")
            targets = torch.tensor(seq.score_targets, dtype=torch.int64, device=hidden.device)
            for a in range(0, len(seq.score_targets), ROW_BLOCK):
                b = min(a + ROW_BLOCK, len(seq.score_targets))
                logits = model.compute_logits(hidden[first + a:first + b])       # [r, V]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                chosen = logprobs.gather(1, targets[a:b, None])                  # [r, 1]
                entry.logprobs.append(chosen[:, 0])
                entry.ranks.append((logprobs > chosen).sum(dim=-1) + 1)
                listed = logprobs[:, :token_vocab]       # the tokenizer's ids only
                top = torch.topk(listed, min(seq.score_top, listed.shape[-1]), dim=-1) \
                    if seq.score_top else None
                entry.top_ids.append(top.indices if top is not None else
                                     targets.new_zeros((b - a, 0)))
                entry.top_logprobs.append(top.values if top is not None else
                                          logprobs.new_zeros((b - a, 0)))
        if seq.pool == "last":
            entry.pooled = hidden[first + fed - 1].float()
        elif seq.pool == "mean":
            entry.pooled = hidden[first:first + fed].float().sum(dim=0)
        elif seq.pool:
            raise RuntimeError(f"slot {seq.handle}: unknown pooling {seq.pool!r}")
        scores.seqs[index] = entry
    return scores
