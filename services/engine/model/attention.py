"""The forward contract: attention metadata for a packed batch and the paged KV cache.

A step's new tokens from B sequences are packed into T rows. Sequence i owns rows
`query_start_loc[i]:query_start_loc[i+1]` (q_len_i rows) and, after the step, has
`seq_lens[i]` tokens of KV. Its new token j sits at position `seq_lens[i] - q_len_i + j` and
attends causally to KV positions [0, that position]. Decode is simply q_len == 1 for every
sequence; chunked prefill, prefix hits and mixed batches are the same arithmetic.

KV lives in pages of `page_size` tokens: per layer `k_cache`/`v_cache` of shape
[num_pages, page_size, num_kv_heads, head_dim]. Position p of sequence i is stored in page
`page_table[i, p // page_size]` at offset `p % page_size`; the flat slot is
`page_id * page_size + offset`. `slot_mapping[t]` is the slot that row t's K/V is written to
(-1 for padding rows, which write nothing).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from services.common.errors import ValidationError
from services.engine.model.config import ModelConfig


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    query_start_loc: torch.Tensor  # int32 [B+1]: sequence i's new tokens are rows qsl[i]:qsl[i+1]
    seq_lens: torch.Tensor         # int32 [B]: KV length of sequence i after this step
    page_table: torch.Tensor       # int32 [B, max_pages_per_seq]: page ids of sequence i in order
    slot_mapping: torch.Tensor     # int64 [T]: page_id * page_size + offset per row; -1 = padding
    max_query_len: int             # host ints, for launch sizing
    max_seq_len: int

    @property
    def num_seqs(self) -> int:
        return int(self.seq_lens.shape[0])

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


@dataclass(frozen=True, slots=True)
class KVCache:
    """Per-layer paged K and V tensors, each [num_pages, page_size, num_kv_heads, head_dim]."""

    k_caches: tuple[torch.Tensor, ...]
    v_caches: tuple[torch.Tensor, ...]

    @property
    def num_layers(self) -> int:
        return len(self.k_caches)

    @property
    def num_pages(self) -> int:
        return int(self.k_caches[0].shape[0])

    @property
    def page_size(self) -> int:
        return int(self.k_caches[0].shape[1])

    @property
    def num_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k_caches, *self.v_caches))

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.k_caches[index], self.v_caches[index]


def kv_slot(page_ids: Sequence[int], position: int, page_size: int) -> int:
    """The flat KV slot of `position` in a sequence whose pages are `page_ids` (in order)."""
    return page_ids[position // page_size] * page_size + position % page_size


def kv_cache_bytes_per_page(model_config: ModelConfig, page_size: int, dtype: torch.dtype) -> int:
    """Bytes one page costs across every layer (K and V), for sizing the pool."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return model_config.kv_bytes_per_token * page_size * itemsize


def allocate_kv_cache(model_config: ModelConfig, num_pages: int, page_size: int,
                      device: torch.device | str, dtype: torch.dtype) -> KVCache:
    """Zeroed K/V pages for every layer (contiguous, so a flat slot view is free)."""
    if num_pages < 1 or page_size < 1:
        raise ValidationError(f"KV cache needs num_pages >= 1 and page_size >= 1, got "
                              f"{num_pages} and {page_size}")
    shape = (num_pages, page_size, model_config.num_key_value_heads, model_config.head_dim)
    layers = range(model_config.num_hidden_layers)
    return KVCache(
        k_caches=tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in layers),
        v_caches=tuple(torch.zeros(shape, dtype=dtype, device=device) for _ in layers),
    )


def build_metadata(query_lens: Sequence[int], seq_lens: Sequence[int],
                   page_tables: Sequence[Sequence[int]], page_size: int,
                   device: torch.device | str = "cpu", *, num_padding_rows: int = 0,
                   max_pages_per_seq: int | None = None) -> AttentionMetadata:
    """Metadata for a packed batch from host lists (the runner's and the tests' helper).

    `page_tables[i]` lists the pages of sequence i in order and must cover seq_lens[i] tokens.
    `num_padding_rows` appends rows with slot -1 (as a CUDA graph's fixed batch would).
    """
    if not (len(query_lens) == len(seq_lens) == len(page_tables)) or not query_lens:
        raise ValidationError("build_metadata needs one query_len, seq_len and page table "
                              "per sequence, and at least one sequence")
    width = max_pages_per_seq or max(1, max(len(p) for p in page_tables))
    starts = [0]
    slots: list[int] = []
    for q_len, s_len, pages in zip(query_lens, seq_lens, page_tables, strict=True):
        if q_len < 1 or s_len < q_len or len(pages) * page_size < s_len or len(pages) > width:
            raise ValidationError(
                f"bad sequence shape: query_len={q_len}, seq_len={s_len}, {len(pages)} pages "
                f"of {page_size} (table width {width})")
        starts.append(starts[-1] + q_len)
        for pos in range(s_len - q_len, s_len):
            slots.append(kv_slot(pages, pos, page_size))
    slots.extend([-1] * num_padding_rows)
    table = [list(p) + [0] * (width - len(p)) for p in page_tables]
    return AttentionMetadata(
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        page_table=torch.tensor(table, dtype=torch.int32, device=device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        max_query_len=max(query_lens),
        max_seq_len=max(seq_lens),
    )
