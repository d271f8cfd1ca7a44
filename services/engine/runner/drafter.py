"""The draft-model proposer (`speculative_method draft`): a small model sharing the target's
tokenizer proposes each decoding choice's next k tokens greedily, on the target's device.

    drafter = open_drafter(config, target_source, device, dtype, context)  # before sizing KV
    layout = plan_layout(page_bytes=target_page_bytes + drafter.page_bytes(page_size), ...)
    proposer = drafter.proposer(layout.num_pages, page_size, ...)
    drafts, forwards = proposer.propose_for(handle, tokens, limit)     # at plan time

KV: the draft model has its own paged KV, as many pages as the target's pool (the memory
accounting sizes both from one budget: a page costs the target's and the draft's bytes), owned
per live choice (by slot; a new slot generation starts over). Each choice's entry records the
tokens its draft KV holds. A round keeps the longest prefix of those that the choice's known
tokens repeat (accepted drafts stay, the KV of rejected drafts is rolled back by truncating
the entry: the next forward overwrites those positions), feeds the rest (catching up on the
accepted tokens and the correction; a new choice prefills its prompt in chunks), then runs
k - 1 one-token forwards for the drafts after the first (the policy picks k before, from
the acceptance statistics and, with the cost model, the measured `forward_s`). Without free pages the least
recently used other choices give their pages back (they prefill again when next asked); a choice
that still does not fit gets no drafts this round.

Rounds: a round that catches up on at most max(k + 1, 32) rows (every round after a choice's
first: the last verification's accepted drafts plus its correction, or the plain rounds since
its last drafts) runs as one CUDA graph replay (`DraftRoundGraphs`, runner/round_graphs.py:
the catch-up forward padded to a power-of-two row capacity, the draft from its last real
row, then the chained forwards), captured at start-up after the target's graphs
(`PagedDrafter.warm_up`). Eagerly, each forward of a 28-layer draft model costs the host's
launch latency for its ~200 kernels. A longer catch-up (a choice's first round, over its
prompt, or a gap past the graphs' rows) feeds all but its last `CATCH_UP_ROWS` (64) rows
eagerly, in chunks and without logits (`PagedDrafter._catch_up`), then replays the round's
graph for the rest and the drafts, so only the chunks run eagerly, never the chained
one-row forwards. Those chunks meet the prompt-chunk and context shapes the target's eager
steps meet, so start-up warms the draft model over the same single-sequence shapes
(runner/warm_up.py) and no kernel compiles while serving. Before that, an H100 spent 1.7 s
of a 256-token request planning: the Qwen3-0.6B-shape draft's first 256-row catch-up
compiled the kernels its own widths need (RESULTS.md 2026-12-07, eleventh session).

Exactness: the drafts are a deterministic function of the choice's tokens (a greedy draft:
its proposal distribution is a point mass), so the existing verification, which samples the
target at every draft row and accepts on equality, needs no rejection-sampling correction:
greedy output is the plain greedy output, and a seeded request draws the very tokens it draws
without speculation (docs/engine.md, "Speculative decoding"). The drafter never changes
what is emitted, only how many tokens a step verifies.

Start-up refuses a draft model whose tokenizer differs from the target's
(`check_same_vocabulary`): a draft id must name the target's token.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from services.common.core import ModelSource, open_model
from services.common.errors import ValidationError
from services.engine.model import (
    CausalLM,
    ForwardBatch,
    KVCache,
    ModelConfig,
    allocate_kv_cache,
    kv_cache_bytes_per_page,
    load_dummy_model,
    load_model,
)
from services.engine.model.registry import resolve
from services.engine.runner.draft_pages import (
    DraftEntry,
    DraftPages,
    ForwardInputs,
    PagedDrafter,
    common_prefix,
    round_inputs,
)
from services.engine.runner.round_graphs import RoundGraphs
from services.engine.runner.warm_up import warm_up_eager
from services.engine.sampling.vocab import mask_beyond_vocab_, token_vocab_size
from services.engine.scheduler.plan import SlotHandle
from services.engine.scheduler.speculation import DRAFT


class DraftModelProposer(PagedDrafter):
    """Greedy drafts from a draft model with its own paged KV (module docstring)."""

    method = "draft"
    source = DRAFT

    def __init__(self, model: CausalLM, kv: KVCache, *, num_tokens: int, token_vocab: int,
                 chunk_tokens: int, max_positions: int) -> None:
        self.model = model
        self.kv = kv
        self.num_tokens = num_tokens          # drafts per round at most
        self.token_vocab = token_vocab        # ids past the tokenizer's are never proposed
        self.chunk_tokens = max(1, chunk_tokens)   # prompt tokens per catch-up forward
        self.max_positions = max_positions   # no draft at or past the draft's range
        self.page_size = kv.page_size
        self.device = model.device
        self.pages = DraftPages(kv.num_pages, kv.page_size)
        # a round that catches up on at most max(k + 1, 32) rows: one graph replay
        self.graphs = DraftRoundGraphs(model, kv, num_tokens=num_tokens,
                                       token_vocab=token_vocab, max_positions=max_positions)

    @torch.inference_mode()
    def propose_for(self, handle: SlotHandle, tokens: Any, limit: int,
                    target_pages: Any = ()) -> tuple[tuple[int, ...], int]:
        """At most min(limit, num_tokens) drafts after `tokens` (the choice's known tokens,
        the pending one last), and the draft-model forwards run for them (`target_pages`
        unused: the draft model reads only tokens)."""
        limit = min(limit, self.num_tokens, self.max_positions - len(tokens) + 1)
        if limit <= 0 or not tokens:
            return (), 0
        tokens = list(tokens)
        entry = self.pages.entry(handle)
        keep = min(common_prefix(entry.tokens, tokens), len(tokens) - 1)
        del entry.tokens[keep:]                # roll back what the choice did not accept
        if not self.pages.reserve(handle.slot, entry, len(tokens) + limit - 1):
            self.pages.drop(handle.slot)
            return (), 0
        started = time.perf_counter()
        if self.graphs.fits(len(entry.pages), 1, limit):
            # a prompt or a long gap: the rows before the graph's last capacity eagerly, in
            # chunks and without logits; then the round's graph drafts
            split = max(len(entry.tokens), len(tokens) - self.graphs.row_capacities[-1])
            eager = self._catch_up(entry, tokens, split)
            out = self.graphs.run(entry.pages, split, tokens[split:], None, limit)
            entry.tokens.extend(tokens[split:])
            entry.tokens.extend(out[:limit - 1])     # the chained rows fed drafts
            self.record_forwards(started, eager + limit, graph_round=not eager)
            return out, eager + limit
        out, forwards = self._eager_round(entry, tokens, limit)
        self.record_forwards(started, forwards, graph_round=False)
        return out, forwards

    def _feed(self, step: ForwardInputs) -> None:
        assert step.ids is not None
        self.model(ForwardBatch(step.ids, step.positions, step.meta), self.kv)

    def _eager_round(self, entry: DraftEntry, tokens: list[int], limit: int
                     ) -> tuple[tuple[int, ...], int]:
        """Catch `entry` up on `tokens` in chunks, then chain to `limit` drafts, forward by
        forward: the drafts (one read-back) and the forwards run."""
        feeds = [(start, tokens[start:start + self.chunk_tokens], None)   # catch up (chunked)
                 for start in range(len(entry.tokens), len(tokens), self.chunk_tokens)]
        steps = round_inputs(entry.pages, self.page_size, self.device, feeds, limit - 1)
        draft: torch.Tensor | None = None
        drafts: list[torch.Tensor] = []
        for i, step in enumerate(steps):
            if step.ids is not None:
                ids = step.ids
            else:                                   # a chained row feeds the last draft
                assert draft is not None
                ids = draft.view(1)
            hidden = self.model(ForwardBatch(ids, step.positions, step.meta), self.kv).hidden
            if i < len(feeds):
                entry.tokens.extend(feeds[i][1])
            if i >= len(feeds) - 1:                 # the last catch-up row drafts first
                logits = mask_beyond_vocab_(self.model.compute_logits(hidden[-1:]),
                                            self.token_vocab)[0]
                draft = logits.argmax()             # on the device: nothing waits for it
                drafts.append(draft)
        out = tuple(int(d) for d in torch.stack(drafts).tolist())    # the one read-back
        entry.tokens.extend(out[:len(steps) - len(feeds)])   # the chained rows fed drafts
        return out, len(steps)

    def warm_up(self) -> None:
        """The shared warm-up (round graphs, two eager rounds), then the draft model's
        forwards over the eager step shapes of one sequence (module docstring)."""
        super().warm_up()
        warm_up_eager(self.model, self.kv, max_tokens=self.chunk_tokens, max_seqs=1,
                      max_model_len=self.max_positions)

    def _warm_round(self, pages: list[int], rows: int) -> None:
        self._eager_round(DraftEntry(generation=-1, pages=pages), [0] * rows, self.num_tokens)


class DraftRoundGraphs(RoundGraphs):
    """A draft-model round as CUDA graphs (runner/round_graphs.py): the draft model's
    catch-up forward over the fed rows, the greedy draft from the last real row's logits,
    then the chained one-row forwards, each feeding the last draft."""

    kind = "draft-model"

    def __init__(self, model: CausalLM, kv: KVCache, *, num_tokens: int, token_vocab: int,
                 max_positions: int) -> None:
        self.model = model
        self.kv = kv
        self.token_vocab = token_vocab
        super().__init__(model.device, max_positions=max_positions, num_tokens=num_tokens,
                         page_size=kv.page_size)

    def _draft(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [1, H] -> the greedy draft, int64 [1] on the device (no host read)."""
        logits = mask_beyond_vocab_(self.model.compute_logits(hidden), self.token_vocab)
        return logits.argmax(dim=-1)

    @torch.inference_mode()
    def _body(self, rows: int, drafts: int) -> None:
        dev = self._dev
        hidden = self.model(ForwardBatch(dev.ids[:rows], dev.positions[:rows],
                                         self.catch_up_meta(rows)), self.kv).hidden
        draft = self._draft(hidden.index_select(0, dev.last))
        self.out[0:1].copy_(draft)
        for j in range(drafts - 1):
            hidden = self.model(ForwardBatch(draft, dev.chain_positions[j, :1],
                                             self.chained_meta(j)), self.kv).hidden
            draft = self._draft(hidden)
            self.out[j + 1:j + 2].copy_(draft)


@dataclass(frozen=True, slots=True)
class Drafter:
    """The loaded draft model, before the KV pool is sized (its page cost enters it)."""

    model: CausalLM
    config: ModelConfig
    token_vocab: int
    dtype: torch.dtype
    max_positions: int        # positions the draft model's rotary tables cover

    def page_bytes(self, page_size: int) -> int:
        return kv_cache_bytes_per_page(self.config, page_size, self.dtype)

    def proposer(self, num_pages: int, page_size: int, *, num_tokens: int,
                 chunk_tokens: int) -> DraftModelProposer:
        kv = allocate_kv_cache(self.config, num_pages, page_size, self.model.device,
                               self.dtype)
        return DraftModelProposer(self.model, kv, num_tokens=num_tokens,
                                  token_vocab=self.token_vocab, chunk_tokens=chunk_tokens,
                                  max_positions=self.max_positions)


def open_drafter(model_path: str, target: ModelSource, device: torch.device,
                 dtype: torch.dtype, max_positions: int, *, dummy_seed: int | None = None
                 ) -> Drafter:
    """Open and load `speculative_model` after checking that it shares the target's
    vocabulary (`dummy_seed`: random weights, as `--load-format dummy` loads the target; the
    target's own directory then drafts with the target's weights)."""
    source = open_model(model_path, allow_missing_weights=dummy_seed is not None)
    token_vocab = check_same_vocabulary(target, source, model_path)
    config = ModelConfig.from_dict(source.config)
    if resolve(source.config).model_class.position_rows != 1:
        raise ValidationError(
            f"speculative_model {model_path} is a {config.architecture}, whose positions "
            "are multimodal (mRoPE rows): a draft model must be a text model (its drafts "
            "feed token ids at 1-D positions)", param="speculative_model")
    max_positions = min(max_positions, config.max_context)
    if dummy_seed is not None:
        model = load_dummy_model(config, device, dtype, max_positions=max_positions,
                                 seed=dummy_seed)
    else:
        model = load_model(source, device, dtype, max_positions=max_positions)
    return Drafter(model, config, token_vocab, dtype, max_positions)


def check_same_vocabulary(target: ModelSource, draft: ModelSource, name: str) -> int:
    """The shared tokenizer's size; ValidationError (param speculative_model) naming the
    first difference when the draft's tokenizer or logits do not cover the target's."""
    ours, theirs = _vocabulary(target), _vocabulary(draft)
    target_size = token_vocab_size(_tokenizer_path(target),
                                   ModelConfig.from_dict(target.config).vocab_size)
    draft_logits = ModelConfig.from_dict(draft.config).vocab_size
    if ours != theirs:
        differ = sorted(set(ours.items()) ^ set(theirs.items()))
        token, token_id = differ[0]
        where = "the target's" if ours.get(token) == token_id else "the draft's"
        raise ValidationError(
            f"speculative_model {name} has another vocabulary than the target "
            f"({len(theirs)} tokens vs {len(ours)}; {token!r} = id {token_id} only in "
            f"{where} tokenizer): a draft model must share the target's tokenizer",
            param="speculative_model")
    if draft_logits < target_size:
        raise ValidationError(
            f"speculative_model {name} scores {draft_logits} token ids, the target's "
            f"tokenizer has {target_size}", param="speculative_model")
    return target_size


def _tokenizer_path(source: ModelSource) -> Path | None:
    name = source.manifest.tokenizer_file
    return source.path(name) if name else None


def _vocabulary(source: ModelSource) -> dict[str, int]:
    """token -> id over the tokenizer's model vocabulary and added tokens ({} without a
    tokenizer file: then both must lack one)."""
    path = _tokenizer_path(source)
    if path is None or not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    vocab = (data.get("model") or {}).get("vocab")
    out: dict[str, int] = {}
    if isinstance(vocab, dict):
        out.update({str(k): int(v) for k, v in vocab.items()})
    elif isinstance(vocab, list):            # Unigram: [piece, score] by id
        out.update({str(piece[0]): i for i, piece in enumerate(vocab)})
    for token in data.get("added_tokens") or ():
        out[str(token["content"])] = int(token["id"])
    return out
