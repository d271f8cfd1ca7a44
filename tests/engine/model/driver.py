"""A test-only driver: greedy generation through `CausalLM.forward` over a paged KV cache.

No scheduler: the driver keeps each sequence's tokens, computed count and pages, and every
step packs, for each live sequence, either its next prompt chunk or its one decode token into
one batch, so prefill chunks and decodes mix freely. Pages come from a shuffled free list, so
sequences never get contiguous pages. A sequence may start from another's cached prefix: it
shares that sequence's full pages and prefills only the rest of its prompt.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from services.engine.model import CausalLM, ForwardBatch, allocate_kv_cache, build_metadata


@dataclass
class Sequence:
    prompt: list[int]
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)      # prompt + generated
    logprobs: list[float] = field(default_factory=list)  # of each generated token
    num_computed: int = 0                                # tokens whose KV is cached
    pages: list[int] = field(default_factory=list)
    hidden: list[torch.Tensor] = field(default_factory=list)  # final hidden per generated token

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def finished(self) -> bool:
        return len(self.generated) >= self.max_new_tokens


class PagedDriver:
    def __init__(self, model: CausalLM, *, num_pages: int = 128, page_size: int = 4,
                 seed: int = 0, num_padding_rows: int = 0):
        self.model = model
        self.page_size = page_size
        self.kv_cache = allocate_kv_cache(model.config, num_pages, page_size, model.device,
                                          model.dtype)
        self.free_pages = list(range(num_pages))
        random.Random(seed).shuffle(self.free_pages)
        self.num_padding_rows = num_padding_rows
        self.sequences: list[Sequence] = []
        self.num_steps = 0
        self.num_mixed_steps = 0   # steps holding both a prefill chunk and a decode token

    def add(self, prompt: list[int], max_new_tokens: int, *, prefix_of: Sequence | None = None,
            prefix_len: int = 0) -> Sequence:
        seq = Sequence(list(prompt), max_new_tokens, tokens=list(prompt))
        if prefix_of is not None:
            assert prefix_len % self.page_size == 0 and prefix_len <= prefix_of.num_computed
            assert prefix_of.tokens[:prefix_len] == prompt[:prefix_len]
            assert prefix_len < len(prompt)
            seq.pages = prefix_of.pages[: prefix_len // self.page_size]   # shared, read only
            seq.num_computed = prefix_len
        self.sequences.append(seq)
        return seq

    def _ensure_pages(self, seq: Sequence, num_tokens: int) -> None:
        while len(seq.pages) * self.page_size < num_tokens:
            seq.pages.append(self.free_pages.pop())

    def step(self, chunk_size: int) -> None:
        """One forward over every unfinished sequence (a prompt chunk or one decode token)."""
        live = [s for s in self.sequences if not s.finished]
        query_lens: list[int] = []
        seq_lens: list[int] = []
        input_ids: list[int] = []
        positions: list[int] = []
        for seq in live:
            q_len = min(chunk_size, len(seq.tokens) - seq.num_computed)
            self._ensure_pages(seq, seq.num_computed + q_len)
            query_lens.append(q_len)
            seq_lens.append(seq.num_computed + q_len)
            input_ids += seq.tokens[seq.num_computed : seq.num_computed + q_len]
            positions += range(seq.num_computed, seq.num_computed + q_len)
        input_ids += [0] * self.num_padding_rows
        positions += [0] * self.num_padding_rows
        meta = build_metadata(query_lens, seq_lens, [s.pages for s in live], self.page_size,
                              self.model.device, num_padding_rows=self.num_padding_rows)
        device = self.model.device
        batch = ForwardBatch(torch.tensor(input_ids, device=device),
                             torch.tensor(positions, device=device), meta)
        hidden = self.model(batch, self.kv_cache).hidden
        self.num_steps += 1
        is_decode = [q == 1 and s.num_computed >= len(s.prompt)
                     for q, s in zip(query_lens, live, strict=True)]
        self.num_mixed_steps += int(any(is_decode) and not all(is_decode))
        ends, sampling = [], []
        row = 0
        for seq, q_len in zip(live, query_lens, strict=True):
            row += q_len
            seq.num_computed += q_len
            if seq.num_computed == len(seq.tokens):   # caught up: sample the next token
                ends.append(row - 1)
                sampling.append(seq)
        if not sampling:
            return
        last_hidden = hidden[torch.tensor(ends, device=device)]
        logprobs = torch.log_softmax(self.model.compute_logits(last_hidden), dim=-1)
        token_ids = logprobs.argmax(dim=-1).tolist()
        for i, (seq, token) in enumerate(zip(sampling, token_ids, strict=True)):
            seq.tokens.append(token)
            seq.logprobs.append(float(logprobs[i, token]))
            seq.hidden.append(last_hidden[i].clone())

    def run(self, chunk_size: int = 1 << 30, arrivals: dict[int, list[tuple]] | None = None,
            max_steps: int = 10_000) -> None:
        """Step until every sequence finished; `arrivals[step]` adds (prompt, max_new) later."""
        arrivals = dict(arrivals or {})
        for step in range(max_steps):
            for prompt, max_new in arrivals.pop(step, []):
                self.add(prompt, max_new)
            if not arrivals and all(s.finished for s in self.sequences):
                return
            if any(not s.finished for s in self.sequences):
                self.step(chunk_size)
        raise AssertionError("driver did not finish")
