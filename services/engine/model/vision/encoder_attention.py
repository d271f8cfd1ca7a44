"""The vision encoder's attention backends: non-causal attention within each packed segment
(an image, or a Qwen2.5-VL window), by SDPA or by the engine's Triton paged-attention kernel.

    backend = check_backend("sdpa")          # ENCODER_ATTENTION: "sdpa" (default) or "triton"
    paged = PagedSegments.of(cu_seqlens, device)         # the triton backend's layout
    out = paged_segment_attention(q, k, v, paged, scale)  # [N, H, D]

`sdpa` pads the segments into a batch and runs `F.scaled_dot_product_attention` with a key
mask (layers.varlen_attention; exact on the CPU, flash / memory-efficient kernels on CUDA).
`triton` runs the decoder's kernel unchanged (kernels/attention.py, causal over paged KV)
in its decode form: every patch row is a one-query sequence whose KV is its whole segment
(the segment's keys written into pages of their own), so causality never hides a key and
each row sees exactly its segment. The decode form shares no key tile between queries, so
it reads each segment's keys once per row; benchmarks/bench_vision.py times both on the
Qwen2.5-VL-7B shape and the engine setting `vision_attention` picks one. CUDA only.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import ValidationError
from services.engine.model.attention import AttentionMetadata

ENCODER_ATTENTION = ("sdpa", "triton")
PAGE_SIZE = 16


def check_backend(name: str) -> str:
    if name not in ENCODER_ATTENTION:
        raise ValidationError(f"vision attention backend {name!r}: expected one of "
                              f"{', '.join(ENCODER_ATTENTION)}", param="vision_attention")
    return name


@dataclass(frozen=True, slots=True)
class PagedSegments:
    """Packed rows as one-query sequences over their segments' paged keys (built once per
    tower pass, shared by its blocks)."""

    slots: torch.Tensor          # int64 [N]: each row's KV slot (its segment's pages, offset)
    num_pages: int
    meta: AttentionMetadata      # N sequences of one query, seq_len = its segment's length

    @classmethod
    def of(cls, cu_seqlens: Sequence[int], device: torch.device | str) -> PagedSegments:
        lengths = [b - a for a, b in itertools.pairwise(cu_seqlens)]
        pages = [-(-length // PAGE_SIZE) for length in lengths]
        first_page = [0, *itertools.accumulate(pages)]
        width = max(pages)
        sizes = torch.tensor(lengths)
        segment = torch.repeat_interleave(torch.arange(len(lengths)), sizes)        # [N]
        offset = torch.arange(int(cu_seqlens[-1])) - torch.tensor(
            cu_seqlens[:-1]).repeat_interleave(sizes)
        base = torch.tensor(first_page[:-1])[segment]                              # [N]
        slots = base * PAGE_SIZE + offset
        columns = torch.arange(width)
        table = torch.where(columns[None, :] < torch.tensor(pages)[segment][:, None],
                            base[:, None] + columns[None, :], 0).to(torch.int32)   # [N, W]
        rows = slots.shape[0]
        meta = AttentionMetadata(
            query_start_loc=torch.arange(rows + 1, dtype=torch.int32).to(device),
            seq_lens=sizes[segment].to(torch.int32).to(device),
            page_table=table.contiguous().to(device), slot_mapping=slots.to(device),
            max_query_len=1, max_seq_len=max(lengths))
        return cls(slots.to(device), first_page[-1], meta)


def paged_segment_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                            paged: PagedSegments, scale: float) -> torch.Tensor:
    """q/k/v [N, H, D] -> [N, H, D]: each row over every key of its segment."""
    from services.engine.kernels.attention import paged_attention

    heads, dim = k.shape[1], k.shape[2]
    caches = []
    for x in (k, v):
        cache = x.new_zeros(paged.num_pages, PAGE_SIZE, heads, dim)
        cache.view(-1, heads, dim).index_copy_(0, paged.slots, x)
        caches.append(cache)
    return paged_attention(q.contiguous(), caches[0], caches[1], paged.meta, scale)
