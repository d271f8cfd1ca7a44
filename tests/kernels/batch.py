"""Random paged batches for the kernel tests and benchmarks.

`make_batch` lays out sequences of given KV lengths and step lengths in a paged KV cache whose
pages are shuffled (a sequence's pages are not adjacent) and whose every unused slot holds NaN,
so a kernel that reads a position it should not shows up as NaN in its output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Metadata:
    """The fields of the model's AttentionMetadata that the kernels read (same names)."""

    query_start_loc: torch.Tensor  # int32 [B+1]
    seq_lens: torch.Tensor  # int32 [B]
    page_table: torch.Tensor  # int32 [B, max_pages_per_seq]
    slot_mapping: torch.Tensor  # int64 [T], -1 = padding
    max_query_len: int
    max_seq_len: int


@dataclass(frozen=True, slots=True)
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [pages, page_size, Hk, D]
    v_cache: torch.Tensor
    meta: Metadata
    q_lens: tuple[int, ...]
    seq_lens: tuple[int, ...]
    num_padding: int  # rows after the last sequence's tokens


def make_batch(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    *,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    page_size: int,
    dtype: torch.dtype = torch.bfloat16,
    device: torch.device | str = "cpu",
    num_padding: int = 0,
    spare_pages: int = 3,
    generator: torch.Generator | None = None,
    poison_unused: bool = True,
) -> PagedBatch:
    assert len(seq_lens) == len(q_lens)
    assert all(1 <= q <= s or (q == 0 and s >= 0) for q, s in zip(q_lens, seq_lens, strict=True))
    device = torch.device(device)
    g = generator
    pages_per_seq = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_per_seq) + spare_pages
    order = torch.randperm(num_pages, generator=g).tolist()
    max_pages = max([1, *pages_per_seq])
    page_table = torch.full((len(seq_lens), max_pages), -1, dtype=torch.int32)
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    v_cache = torch.randn(shape, generator=g, dtype=torch.float32).to(dtype)
    used = torch.zeros(num_pages, page_size, dtype=torch.bool)
    slots: list[int] = []
    next_page = 0
    for i, (s, n) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
        ids = order[next_page : next_page + n]
        next_page += n
        page_table[i, :n] = torch.tensor(ids, dtype=torch.int32)
        for pos in range(s):
            used[ids[pos // page_size], pos % page_size] = True
        for pos in range(s - q_lens[i], s):
            slots.append(ids[pos // page_size] * page_size + pos % page_size)
    if poison_unused:
        k_cache[~used] = float("nan")
        v_cache[~used] = float("nan")
    slots += [-1] * num_padding
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32)
    num_tokens = sum(q_lens) + num_padding
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=g, dtype=torch.float32).to(dtype)
    meta = Metadata(
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        page_table=page_table.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64).to(device),
        max_query_len=max([0, *q_lens]),
        max_seq_len=max([0, *seq_lens]),
    )
    return PagedBatch(
        q=q.to(device), k_cache=k_cache.to(device), v_cache=v_cache.to(device), meta=meta,
        q_lens=tuple(q_lens), seq_lens=tuple(seq_lens), num_padding=num_padding,
    )
