"""A test-only greedy driver for the vision-language models over a paged KV cache.

Like tests/engine/model/driver.py (no scheduler; shuffled pages; prompt chunks and decodes of
several sequences in one batch), plus what a multimodal prompt needs: each row's three mRoPE
positions (the prompt's from imageprep's expansion; generated token k of a prompt of L tokens
at L + k + rope_delta on every row) and the image features of the image-pad rows the step
holds (ImageEmbeds, sliced when a chunk boundary cuts an image span).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from services.engine.model import ForwardBatch, allocate_kv_cache, build_metadata
from services.engine.model.qwen_vl import QwenVLForConditionalGeneration
from services.engine.model.vision.inputs import ImageEmbeds, ImageFeatures


@dataclass
class VLSequence:
    prompt: list[int]
    positions: list[list[int]]                       # [3][L] prompt mRoPE rows
    rope_delta: int
    images: list[tuple[int, ImageFeatures]]          # (first span position, features)
    max_new_tokens: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    num_computed: int = 0
    pages: list[int] = field(default_factory=list)

    @property
    def generated(self) -> list[int]:
        return self.tokens[len(self.prompt):]

    @property
    def finished(self) -> bool:
        return len(self.generated) >= self.max_new_tokens

    def position_rows(self, start: int, end: int) -> list[list[int]]:
        rows = []
        for row in range(3):
            values = self.positions[row][start:min(end, len(self.prompt))]
            values += [p + self.rope_delta for p in range(max(start, len(self.prompt)), end)]
            rows.append(values)
        return rows


class VLDriver:
    def __init__(self, model: QwenVLForConditionalGeneration, *, num_pages: int = 256,
                 page_size: int = 4, seed: int = 0) -> None:
        self.model = model
        self.page_size = page_size
        self.kv_cache = allocate_kv_cache(model.config, num_pages, page_size, model.device,
                                          model.dtype)
        self.free_pages = list(range(num_pages))
        random.Random(seed).shuffle(self.free_pages)
        self.sequences: list[VLSequence] = []

    def add(self, prompt: list[int], positions: list[list[int]], rope_delta: int,
            images: list[tuple[int, ImageFeatures]], max_new_tokens: int) -> VLSequence:
        seq = VLSequence(list(prompt), positions, rope_delta, images, max_new_tokens,
                         tokens=list(prompt))
        self.sequences.append(seq)
        return seq

    def step(self, chunk_size: int) -> None:
        live = [s for s in self.sequences if not s.finished]
        query_lens, seq_lens, input_ids = [], [], []
        rows: list[list[int]] = [[], [], []]
        pieces: list[tuple[int, ImageFeatures, int, int]] = []
        for seq in live:
            start = seq.num_computed
            q_len = min(chunk_size, len(seq.tokens) - start)
            end = start + q_len
            while len(seq.pages) * self.page_size < end:
                seq.pages.append(self.free_pages.pop())
            for offset, features in seq.images:        # image tokens inside [start, end)
                lo, hi = max(start, offset), min(end, offset + features.num_tokens)
                if lo < hi:
                    pieces.append((len(input_ids) + lo - start, features, lo - offset, hi - lo))
            query_lens.append(q_len)
            seq_lens.append(end)
            input_ids += seq.tokens[start:end]
            for row, values in zip(rows, seq.position_rows(start, end), strict=True):
                row += values
        device = self.model.device
        meta = build_metadata(query_lens, seq_lens, [s.pages for s in live], self.page_size,
                              device)
        batch = ForwardBatch(torch.tensor(input_ids, device=device),
                             torch.tensor(rows, dtype=torch.int64, device=device), meta,
                             images=ImageEmbeds.gather(pieces, device))
        hidden = self.model(batch, self.kv_cache).hidden
        ends, sampling = [], []
        row = 0
        for seq, q_len in zip(live, query_lens, strict=True):
            row += q_len
            seq.num_computed += q_len
            if seq.num_computed == len(seq.tokens):
                ends.append(row - 1)
                sampling.append(seq)
        if not sampling:
            return
        logprobs = torch.log_softmax(
            self.model.compute_logits(hidden[torch.tensor(ends, device=device)]), dim=-1)
        for i, seq in enumerate(sampling):
            token = int(logprobs[i].argmax())
            seq.tokens.append(token)
            seq.logprobs.append(float(logprobs[i, token]))

    def run(self, chunk_size: int = 1 << 30, max_steps: int = 5_000) -> None:
        for _ in range(max_steps):
            if all(s.finished for s in self.sequences):
                return
            self.step(chunk_size)
        raise AssertionError("driver did not finish")
