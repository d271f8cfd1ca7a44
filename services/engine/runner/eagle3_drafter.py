"""The EAGLE-3 proposer (`speculative_method eagle3`): a head (model/eagle3.py) drafts each
decoding choice's next k tokens greedily from the target's own hidden states.

    drafter = open_eagle3(config.speculative_model, target, source, device, dtype, context)
    layout = plan_layout(page_bytes=target_page_bytes + drafter.page_bytes(page_size), ...)
    proposer = drafter.proposer(layout.num_pages, page_size, ...)   # before graph capture
    drafts, forwards = proposer.propose_for(handle, tokens, limit, target_pages)

The target's hidden states: the target returns its three aux layers' outputs
(`CausalLM.set_aux_hidden_layers`), and a forward hook on it writes their fusion
(`head.fuse`, the head's fc) into `TargetHiddenStore`, one row per KV slot of the target's
page pool, at the rows' `slot_mapping` (as the K/V write does: no host sync, so a CUDA graph
captures it; padding rows go to a spare row). Every target forward fills it, whichever
runner runs it, and a prefix-cache hit finds the states where its pages were computed.
Positions restored from a snapshot or the host tier have no state written (the pages hold an
older one): the head then drafts from it, worse drafts, never other output.

Per choice the head has its own paged KV (one layer, as many pages as the target's pool),
like the draft-model proposer (runner/drafter.py). Row i holds the head's K/V for token
i + 1 with the target's state at i; the target has computed positions 0..n-2 of a choice
with n known tokens (the pending one last), so a round catches the head up on rows
len(held)..n-2 (chunked), drafts from row n-2's logits, and chains k - 1 rows that feed the
head's own pre-norm state back. Only rows built from the target's states are kept (`tokens`
of the entry): the chained rows, and rows whose tokens the choice did not keep (rejected
drafts), are rolled back by truncation and overwritten by the next round.

Exactness: greedy drafts, a deterministic function of what the target computed, so the
verification (sampling the target at every draft row, accepting on equality) stays exact,
as for the draft model. The head never changes what is emitted, only how much a step
verifies.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.hooks import RemovableHandle

from services.common.core import ModelSource
from services.common.errors import ValidationError
from services.engine.model import (
    CausalLM,
    KVCache,
    allocate_kv_cache,
    kv_cache_bytes_per_page,
)
from services.engine.model.attention import kv_slot
from services.engine.model.config import ModelConfig
from services.engine.model.eagle3 import Eagle3Head, load_eagle3_head, parse_eagle3_config
from services.engine.model.layers import Embedding
from services.engine.runner.draft_pages import (
    DraftPages,
    ForwardInputs,
    PagedDrafter,
    common_prefix,
    round_inputs,
)
from services.engine.runner.eagle3_graphs import Eagle3RoundGraphs, greedy_draft
from services.engine.sampling.vocab import token_vocab_size
from services.engine.scheduler.plan import SlotHandle
from services.engine.scheduler.speculation import DRAFT


class TargetHiddenStore:
    """The head's fused target state [H] for every KV slot of the target's pool."""

    def __init__(self, head: Eagle3Head, target: CausalLM, num_slots: int) -> None:
        self.head = head
        with torch.inference_mode():
            self.rows = torch.zeros((num_slots + 1, head.config.layer.hidden_size),
                                    dtype=head.fc.weight.dtype, device=target.device)
        self.padding_row = num_slots
        target.set_aux_hidden_layers(head.config.target_layers)
        self.handle: RemovableHandle = target.register_forward_hook(self._write,
                                                                    with_kwargs=True)

    def _write(self, module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        batch = args[0] if args else kwargs["batch"]
        slots = batch.meta.slot_mapping
        with torch.inference_mode():
            fused = self.head.fuse(output.aux_hidden)
            index = torch.where(slots < 0, self.padding_row, slots)
            self.rows.index_copy_(0, index, fused.to(self.rows.dtype))


class Eagle3Proposer(PagedDrafter):
    """Greedy drafts from an EAGLE-3 head over the target's hidden states (module doc)."""

    method = "eagle3"
    source = DRAFT

    def __init__(self, head: Eagle3Head, embedding: Embedding, kv: KVCache,
                 store: TargetHiddenStore, *, num_tokens: int, token_vocab: int,
                 chunk_tokens: int) -> None:
        self.head = head
        self.embedding = embedding        # the head's, else the target's (shared)
        self.kv = kv
        self.store = store
        self.num_tokens = num_tokens
        self.chunk_tokens = max(1, chunk_tokens)
        self.page_size = kv.page_size
        self.device = head.fc.weight.device
        # draft ids whose target id is past the tokenizer's are never proposed
        self._beyond = head.draft_to_target >= token_vocab
        self.pages = DraftPages(kv.num_pages, kv.page_size)
        # a round that catches up on at most k + 1 rows: one graph replay (eagle3_graphs.py)
        self.graphs = Eagle3RoundGraphs(head, embedding, kv, store, self._beyond,
                                        num_tokens=num_tokens, page_size=kv.page_size)

    @torch.inference_mode()
    def propose_for(self, handle: SlotHandle, tokens: Sequence[int], limit: int,
                    target_pages: Sequence[int] = ()) -> tuple[tuple[int, ...], int]:
        """At most min(limit, num_tokens) drafts after `tokens` (the pending one last) and
        the head forwards run; `target_pages`: the choice's pages in the target's pool."""
        n = len(tokens)
        limit = min(limit, self.num_tokens, self.head.max_positions - n + 2)
        if limit <= 0 or n < 2 or len(target_pages) * self.page_size < n - 1:
            return (), 0
        inputs = list(tokens[1:])                   # row i's token; rows 0..n-2
        entry = self.pages.entry(handle)
        keep = min(common_prefix(entry.tokens, inputs), n - 2)
        del entry.tokens[keep:]                     # roll back what the choice did not keep
        if not self.pages.reserve(handle.slot, entry, n - 1 + limit - 1):
            self.pages.drop(handle.slot)
            return (), 0
        started = time.perf_counter()

        def target_slots(begin: int, stop: int) -> list[int]:     # rows' target states
            return [kv_slot(target_pages, p, self.page_size) for p in range(begin, stop)]

        if self.graphs.fits(len(entry.pages), 1, limit):
            # a prompt or a long gap: all but the graph's last capacity of rows eagerly
            # (PagedDrafter._catch_up), then the round's graph
            split = max(len(entry.tokens), n - 1 - self.graphs.row_capacities[-1])
            eager = self._catch_up(entry, inputs, split, target_slots)
            feed = inputs[split:n - 1]
            replayed = self.graphs.run(entry.pages, split, feed, target_slots(split, n - 1),
                                       limit)
            entry.tokens.extend(feed)
            self.record_forwards(started, eager + limit, graph_round=not eager)
            return replayed, eager + limit
        feeds = []                                  # catch up (chunked) on the target's rows
        for start in range(len(entry.tokens), n - 1, self.chunk_tokens):
            chunk = inputs[start:min(n - 1, start + self.chunk_tokens)]
            feeds.append((start, chunk, [kv_slot(target_pages, p, self.page_size)
                                         for p in range(start, start + len(chunk))]))
        out = self._eager_round(entry.pages, feeds, limit)
        for _, chunk, _ in feeds:
            entry.tokens.extend(chunk)
        forwards = len(feeds) + limit - 1
        self.record_forwards(started, forwards, graph_round=False)
        return out, forwards

    def _eager_round(self, pages: list[int], feeds: list[tuple[int, list[int], list[int]]],
                     limit: int) -> tuple[int, ...]:
        """The catch-up chunks `feeds` (start, ids, target slots) over `pages`, drafting from
        the last one's last row, then limit - 1 chained rows; the drafts (one read-back)."""
        steps = round_inputs(pages, self.page_size, self.device, feeds, limit - 1)
        prenorm = draft = None
        drafts: list[torch.Tensor] = []
        for i, step in enumerate(steps):
            if i < len(feeds):                      # a catch-up chunk: the target's states
                assert step.ids is not None and step.extra is not None
                ids, hidden = step.ids, self.store.rows[step.extra]
            else:                                   # a chained row: the last draft, its state
                assert draft is not None and prenorm is not None
                ids, hidden = draft, prenorm
            normed, prenorm = self.head(self.embedding(ids), hidden, step.positions, self.kv,
                                        step.meta)
            normed, prenorm = normed[-1:], prenorm[-1:]
            if i >= len(feeds) - 1:                 # the last catch-up row drafts first
                draft = greedy_draft(self.head, normed, self._beyond)   # on the device
                drafts.append(draft)
        return tuple(torch.cat(drafts).tolist())    # the one read-back

    def _warm_round(self, pages: list[int], rows: int) -> None:
        self._eager_round(pages, [(0, [0] * rows, [self.store.padding_row] * rows)],
                          self.num_tokens)

    def _feed(self, step: ForwardInputs) -> None:
        assert step.ids is not None and step.extra is not None
        self.head(self.embedding(step.ids), self.store.rows[step.extra], step.positions,
                  self.kv, step.meta)


@dataclass(frozen=True, slots=True)
class Eagle3Drafter:
    """The loaded head, before the KV pool is sized (its page cost enters it)."""

    head: Eagle3Head
    target: CausalLM
    token_vocab: int
    dtype: torch.dtype

    def page_bytes(self, page_size: int) -> int:
        """The head's K/V and the stored target states of one page's positions."""
        itemsize = torch.empty((), dtype=self.dtype).element_size()
        layer = self.head.config.layer
        return (kv_cache_bytes_per_page(layer, page_size, self.dtype) +
                page_size * layer.hidden_size * itemsize)

    def proposer(self, num_pages: int, page_size: int, *, num_tokens: int,
                 chunk_tokens: int) -> Eagle3Proposer:
        """The proposer, its KV and the target's state store (hooked into the target:
        build it before a runner captures graphs)."""
        kv = allocate_kv_cache(self.head.config.layer, num_pages, page_size,
                               self.target.device, self.dtype)
        store = TargetHiddenStore(self.head, self.target, num_pages * page_size)
        embedding = self.head.embed_tokens if self.head.embed_tokens is not None else \
            self.target.model.embed_tokens
        return Eagle3Proposer(self.head, embedding, kv, store, num_tokens=num_tokens,
                              token_vocab=self.token_vocab, chunk_tokens=chunk_tokens)


def open_eagle3(head_path: str, target: CausalLM, source: ModelSource, device: torch.device,
                dtype: torch.dtype, max_positions: int) -> Eagle3Drafter:
    """Load `speculative_model` as an EAGLE-3 head for `target` (ValidationError naming the
    directory and what is wrong: model/eagle3.py)."""
    directory = Path(head_path)
    config_path = directory / "config.json"
    if not config_path.is_file():
        raise ValidationError(f"EAGLE-3 head {head_path}: no config.json",
                              param="speculative_model")
    try:
        raw = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValidationError(f"EAGLE-3 head {head_path}: config.json unreadable: {exc}",
                              param="speculative_model") from exc
    target_config: ModelConfig = target.config
    config = parse_eagle3_config(raw, target_config, head_path)
    tokenizer = source.manifest.tokenizer_file
    token_vocab = token_vocab_size(source.path(tokenizer) if tokenizer else None,
                                   target_config.vocab_size)
    head = load_eagle3_head(directory, config, device, dtype, max_positions,
                            target_config.vocab_size)
    return Eagle3Drafter(head, target, token_vocab, dtype)
