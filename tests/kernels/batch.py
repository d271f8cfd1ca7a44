"""Random paged batches for the kernel tests and benchmarks.

`make_batch` lays out sequences of given KV lengths and step lengths in a paged KV cache whose
pages are shuffled (a sequence's pages are not adjacent) and whose every unused slot holds NaN,
so a kernel that reads a position it should not shows up as NaN in its output. With
`sliding_window` W the positions every query row's window has left behind (below the first
new token's window, seq_len - q_len - W + 1) hold NaN too: a windowed kernel must not read them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.engine.model.attention import AttentionMetadata


@dataclass(frozen=True, slots=True)
class PagedBatch:
    q: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [pages, page_size, Hk, D]
    v_cache: torch.Tensor
    meta: AttentionMetadata
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
    sliding_window: int = 0,
) -> PagedBatch:
    assert len(seq_lens) == len(q_lens)
    assert all(1 <= q <= s or (q == 0 and s >= 0) for q, s in zip(q_lens, seq_lens, strict=True))
    device = torch.device(device)
    g = generator if generator is not None else torch.Generator().manual_seed(0)
    pages_per_seq = [-(-s // page_size) for s in seq_lens]
    num_pages = sum(pages_per_seq) + spare_pages
    order = torch.randperm(num_pages, generator=g)
    max_pages = max([1, *pages_per_seq])
    page_table = torch.full((len(seq_lens), max_pages), -1, dtype=torch.int32)
    used = torch.zeros(num_pages, page_size, dtype=torch.bool)
    slots: list[torch.Tensor] = []
    next_page = 0
    for i, (s, n) in enumerate(zip(seq_lens, pages_per_seq, strict=True)):
        ids = order[next_page : next_page + n]
        next_page += n
        page_table[i, :n] = ids.to(torch.int32)
        pos = torch.arange(s)
        seen = pos[pos >= s - q_lens[i] - sliding_window + 1] if sliding_window > 0 else pos
        used[ids[seen // page_size], seen % page_size] = True
        new = pos[s - q_lens[i] :]
        slots.append(ids[new // page_size] * page_size + new % page_size)
    # the big tensors are drawn on the device, from a seed this batch's generator picks
    dg = torch.Generator(device).manual_seed(int(torch.randint(0, 2**62, (1,), generator=g)))
    shape = (num_pages, page_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=dg, device=device).to(dtype)
    v_cache = torch.randn(shape, generator=dg, device=device).to(dtype)
    if poison_unused:
        unused = ~used.to(device)
        k_cache[unused] = float("nan")
        v_cache[unused] = float("nan")
    slots.append(torch.full((num_padding,), -1, dtype=torch.int64))
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int64), 0).to(torch.int32)
    num_tokens = sum(q_lens) + num_padding
    q = torch.randn(num_tokens, num_q_heads, head_dim, generator=dg, device=device).to(dtype)
    meta = AttentionMetadata(
        query_start_loc=qsl.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32).to(device),
        page_table=page_table.to(device),
        slot_mapping=torch.cat(slots).to(device),
        max_query_len=max([0, *q_lens]),
        max_seq_len=max([0, *seq_lens]),
    )
    return PagedBatch(
        q=q, k_cache=k_cache, v_cache=v_cache, meta=meta,
        q_lens=tuple(q_lens), seq_lens=tuple(seq_lens), num_padding=num_padding,
    )
