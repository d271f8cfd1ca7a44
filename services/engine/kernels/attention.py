"""Paged attention over the KV cache: decode, prefill over a cached prefix, or any mix of the
two, in one launch (plus a small reduction launch when the KV range is split).

    paged_attention(q [T, Hq, D], k_cache, v_cache [pages, page_size, Hk, D], meta, scale,
                    sliding_window=0, *, sinks=None) -> [T, Hq, D]

`meta` is the model's `AttentionMetadata` (read by attribute): `query_start_loc` int32 [B+1]
(packed query offsets), `seq_lens` int32 [B] (KV length after this step, the step's own keys
already written), `page_table` int32 [B, max_pages], and the host ints `max_query_len`,
`max_seq_len`. Query token j of sequence i sits at position seq_lens[i] - q_len_i + j and
sees KV [0, position]; with `sliding_window` W > 0 only KV [max(0, position - W + 1),
position] (W keys including its own: transformers' `kv_idx > q_idx - sliding_window`), and the
kernel reads nothing below a block's window, so a long context costs W positions per row.
Rows past `query_start_loc[B]` are padding: they come back as zeros. `sinks` [Hq] (gpt-oss's
attention sinks, natural-log logits) adds exp(sinks[h]) to head h's softmax denominator: the
unsplit kernel folds it into its final normalisation, split launches into the reduction.

The launch shape depends only on host ints (T, B, max_query_len, max_seq_len, the head
counts), never on tensor values, so nothing synchronizes and a CUDA graph captured with
`max_seq_len` set to the longest context it will see replays correctly for shorter ones.
Split-K (`plan.num_splits > 1`) needs fp32 scratch; pass an `AttentionScratch` allocated once
(`AttentionScratch.allocate`) to keep the call allocation-free, or leave it to the wrapper.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Any

import torch

from services.common.errors import UnsupportedError, ValidationError
from services.engine.kernels.attention_kernel import (
    _paged_attention_any_size_kernel,
    _paged_attention_kernel,
    _reduce_splits_kernel,
)
from services.engine.kernels.common import (
    cdiv,
    check_float,
    check_last_dim_contiguous,
    check_out,
    check_rank,
    check_same_device,
    env_choice,
    next_power_of_2,
    sm_count,
)
from services.engine.kernels.pdl import launch_options

# Split-K heuristic, from the H200 sweeps in docs/kernels.md: split only while the grid has
# fewer than NO_SPLIT_PROGRAMS_PER_SM programs per multiprocessor (64 x 8 programs at batch 64
# ran 12% faster unsplit), then up to PROGRAMS_PER_SM, each split reading at least
# MIN_SPLIT_TOKENS positions (batch 1, 8k context: 64 splits of 128 beat 32 of 256 by 11%).
MAX_SPLITS = 64
MIN_SPLIT_TOKENS = 128
PROGRAMS_PER_SM = 4
NO_SPLIT_PROGRAMS_PER_SM = 2


SHORT_RUN_TOKENS = 16     # a verification's rows, or a few tokens of a small prefill


@functools.cache
def short_run_query_tile() -> int | None:
    """HELIOS_ATTENTION_SHORT_TILE=N (a power of two): steps whose longest query run is 2 to
    SHORT_RUN_TOKENS tokens put N query tokens in every tile, one tile size for the launch
    (unset: the plan's wide tile beside its narrow one). A benchmark's A/B switch: at batch
    1, width 5 and 4 query heads a KV head, sm_90 compiles the default two-tile kernel at
    194 registers, one 8-token (32-row) tile at 141 and one 4-token tile at 96 (that one
    with two blocks for the 5 rows). Not timed yet (benchmarks/gpu/pending_benches.txt
    spec_short_tile). Read once."""
    value = os.environ.get("HELIOS_ATTENTION_SHORT_TILE", "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) < 1 or int(value) & (int(value) - 1):
        raise ValidationError(f"HELIOS_ATTENTION_SHORT_TILE={value!r}: expected a power of two")
    return int(value)


@functools.cache
def decode_prefetch() -> str:
    """HELIOS_ATTENTION_PREFETCH: whether decode-only launches load each tile's page numbers
    an iteration ahead and run 3 stages, so the K/V copies are double-buffered (without it:
    one K/V buffer, each tile's copy waited for right after it is issued). "auto" (unset):
    over FP8 pages only, capped at 128 registers; "1": over every page dtype; "0": never.
    Measured on an H100 (RESULTS.md 2026-12-07, seventeenth session): the Qwen3-8B b256 step
    over FP8 pages 18.77 -> 16.69 ms (attention 351.5 -> 293.8 us a layer), over bf16 pages
    at b64 11.41 -> 12.01 ms (the 3-stage bf16 tile's 72 KB of shared memory leaves fewer
    programs an SM). Read once."""
    return env_choice("HELIOS_ATTENTION_PREFETCH", ("auto", "0", "1"))


@dataclass(frozen=True, slots=True)
class AttentionPlan:
    """How one `paged_attention` call is launched; a pure function of host-side sizes."""

    block_q: int  # query tokens per program
    block_m: int  # tile rows: block_q * group, rounded up to a power of two (>= 16)
    block_n: int  # KV positions per tile
    small_block_q: int  # sequences of at most this many query tokens take the narrow tile...
    small_block_m: int  # ...of this many rows (== block_q/block_m when there is one tile)
    num_splits: int  # KV ranges per (block, kv head); 1 = no reduction step
    split_len: int  # KV positions per split, a multiple of block_n
    num_blocks: int  # grid axis 0: an upper bound on query blocks over all sequences
    num_warps: int
    num_stages: int
    # Each block's splits divide its own KV length (a graph's max_seq_len is the context
    # limit, far above most sequences): ranges of at least this many positions, at most
    # split_len. 0: divide evenly whatever the length.
    min_split_len: int = 0
    # W > 0: each query row sees its last W positions (the kernel's SLIDING variant), and the
    # splits divide a block's windowed range; 0: full causal attention.
    sliding_window: int = 0
    # True: each unmasked tile's page numbers are loaded an iteration ahead, so that with
    # num_stages >= 3 the K/V copies are double-buffered (`decode_prefetch`)
    prefetch_pages: bool = False
    # > 0: ptxas's register cap (Triton's `maxnreg`; 0 leaves the compiler's choice). The FP8
    # pages' prefetching decode tile compiles at 152 registers (3 programs an SM) and at 128
    # without a spill (4): benchmarks/sm90_report.py attention, bench_kernels.py's `p3r128`
    max_registers: int = 0


@dataclass(frozen=True, slots=True)
class AttentionScratch:
    """Preallocated fp32 split-K buffers: `partial_out` holds rows of D values, `partial_lse`
    one value per row; a call may use up to `partial_lse.numel()` rows (T * Hq * splits)."""

    partial_out: torch.Tensor  # [rows * D] fp32
    partial_lse: torch.Tensor  # [rows] fp32

    @classmethod
    def allocate(
        cls, max_tokens: int, num_q_heads: int, head_dim: int, device: torch.device | str,
        max_splits: int = MAX_SPLITS,
    ) -> AttentionScratch:
        rows = max_tokens * num_q_heads * max_splits
        return cls(
            partial_out=torch.empty(rows * head_dim, dtype=torch.float32, device=device),
            partial_lse=torch.empty(rows, dtype=torch.float32, device=device),
        )

    def max_splits(self, num_tokens: int, num_q_heads: int, head_dim: int) -> int:
        rows = num_tokens * num_q_heads
        return min(self.partial_lse.numel() // rows, self.partial_out.numel() // (rows * head_dim))


def plan_attention(
    *,
    num_tokens: int,
    num_seqs: int,
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    max_query_len: int,
    max_seq_len: int,
    num_sms: int,
    num_splits: int | None = None,
    max_splits: int = MAX_SPLITS,
    sliding_window: int = 0,
    query_tile: int | None = None,
    kv_itemsize: int = 2,
) -> AttentionPlan:
    """Pick tile sizes and the split count. Decode-only steps (max_query_len == 1) put one
    token's query-head group in a tile and split long KV ranges until the grid fills the
    device; prefill and mixed steps use wide tiles and split only when the grid is small.
    With a sliding window the KV range a block reads is at most W + its rows - 1 positions,
    whatever the context, and the splits are sized for that. `query_tile` overrides the query
    tokens per program (one tile of that many tokens' groups; benchmarks sweep it).
    `kv_itemsize`: bytes a cached K/V value (1 for FP8 pages)."""
    group = num_q_heads // num_kv_heads
    max_registers = 0
    # the narrow tile: one decode token's query-head group, padded to the 16-row MMA minimum
    small_block_m = max(16, next_power_of_2(group))
    small_block_q = small_block_m // group
    block_n = 64 if head_dim <= 128 else 32
    if max_query_len <= 1:
        block_q, block_m = 1, small_block_m
        small_block_q, small_block_m = block_q, block_m
        # measured on an H200 (docs/kernels.md, call 1): 2 stages beat 3 at every decode shape
        # (with the page numbers loaded in the tile, where the stages never double-buffered)
        num_warps, num_stages = 4, 2
        mode = decode_prefetch()
        prefetch_pages = mode == "1" or (mode == "auto" and kv_itemsize == 1)
        if prefetch_pages:
            num_stages = 3
            if kv_itemsize == 1:
                max_registers = 128   # FP8 pages: 4 programs an SM, no spill (sm_90 compile)
    else:
        # call 1: 64-row tiles with 4 warps beat 128 rows with 8 warps by 19% (1 x 4096 prefill)
        block_m = max(64 if head_dim <= 128 else 32, next_power_of_2(group))
        block_q = max(1, block_m // group)
        block_m = max(16, next_power_of_2(block_q * group))
        num_warps, num_stages = 4, 2
        prefetch_pages = False
        if small_block_q >= block_q:
            small_block_q, small_block_m = block_q, block_m
    if query_tile is not None:
        block_q = query_tile
        block_m = max(16, next_power_of_2(block_q * group))
        small_block_q, small_block_m = block_q, block_m
    num_blocks = num_tokens if block_q == 1 else cdiv(num_tokens, block_q) + num_seqs
    kv_span = max(1, max_seq_len)
    if sliding_window > 0:
        # a block's rows [pos0, pos0 + n) see [pos0 - W + 1, pos0 + n): W + n - 1 positions
        # (split launches read them from the first one)
        rows_per_block = min(block_q, max(1, max_query_len))
        kv_span = min(kv_span, sliding_window + rows_per_block - 1)
    if num_splits is None:
        programs = max(1, num_blocks * num_kv_heads)
        if programs >= NO_SPLIT_PROGRAMS_PER_SM * num_sms:
            num_splits = 1
        else:
            wanted = cdiv(PROGRAMS_PER_SM * num_sms, programs)
            num_splits = min(wanted, cdiv(kv_span, MIN_SPLIT_TOKENS))
    num_splits = max(1, min(num_splits, max_splits, cdiv(kv_span, block_n)))
    split_len = cdiv(cdiv(kv_span, num_splits), block_n) * block_n
    num_splits = cdiv(kv_span, split_len)
    return AttentionPlan(
        block_q=block_q, block_m=block_m, block_n=block_n, small_block_q=small_block_q,
        small_block_m=small_block_m, num_splits=num_splits,
        split_len=split_len, num_blocks=max(1, num_blocks), num_warps=num_warps,
        num_stages=num_stages,
        min_split_len=min(split_len, cdiv(MIN_SPLIT_TOKENS, block_n) * block_n),
        sliding_window=sliding_window, prefetch_pages=prefetch_pages, max_registers=max_registers,
    )


def check_sliding_window(sliding_window: Any) -> int:
    """The window as an int >= 0 (None means 0: no window)."""
    if sliding_window is None:
        return 0
    if isinstance(sliding_window, bool) or not isinstance(sliding_window, int) or sliding_window < 0:
        raise ValidationError(f"sliding_window: expected an int >= 0 (0: no window), "
                              f"got {sliding_window!r}")
    return sliding_window


def _check(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: Any) -> None:
    check_rank("q", q, 3)
    check_float("q", q)
    for name, t in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        check_last_dim_contiguous(name, t)
    check_rank("k_cache", k_cache, 4)
    if v_cache.shape != k_cache.shape:
        raise ValidationError(f"v_cache {tuple(v_cache.shape)} != k_cache {tuple(k_cache.shape)}")
    fp8 = (torch.float8_e4m3fn, torch.float8_e4m3fn)
    if (k_cache.dtype, v_cache.dtype) not in ((q.dtype, q.dtype), fp8):
        raise UnsupportedError(f"KV cache dtype {k_cache.dtype} must match q's {q.dtype} "
                               "or be float8_e4m3fn (FP8 pages)")
    num_q_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValidationError(f"head dim: q has {head_dim}, the cache {k_cache.shape[3]}")
    if num_kv_heads == 0 or num_q_heads % num_kv_heads:
        raise ValidationError(f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads")
    qsl, seq_lens, page_table = meta.query_start_loc, meta.seq_lens, meta.page_table
    num_seqs = seq_lens.shape[0]
    if qsl.shape != (num_seqs + 1,) or page_table.dim() != 2 or page_table.shape[0] != num_seqs:
        raise ValidationError(
            f"metadata: query_start_loc {tuple(qsl.shape)}, seq_lens {tuple(seq_lens.shape)}, "
            f"page_table {tuple(page_table.shape)} disagree on the batch size"
        )
    for name, t in (("query_start_loc", qsl), ("seq_lens", seq_lens), ("page_table", page_table)):
        if t.dtype != torch.int32:
            raise ValidationError(f"metadata.{name}: expected int32, got {t.dtype}")
    if page_table.shape[1] > 0 and page_table.stride(1) != 1:
        raise ValidationError("metadata.page_table: rows must be contiguous")
    check_same_device(q=q, k_cache=k_cache, query_start_loc=qsl, seq_lens=seq_lens, page_table=page_table)


def check_sinks(sinks: torch.Tensor | None, q: torch.Tensor) -> None:
    """sinks: None, or one float logit per query head on q's device, contiguous."""
    if sinks is None:
        return
    if sinks.dim() != 1 or sinks.shape[0] != q.shape[1]:
        raise ValidationError(f"sinks: expected [{q.shape[1]}] (one per query head), got "
                              f"{tuple(sinks.shape)}")
    check_float("sinks", sinks)
    if sinks.stride(0) != 1:
        raise ValidationError("sinks: must be contiguous")
    check_same_device(q=q, sinks=sinks)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: Any,
    scale: float,
    sliding_window: int = 0,
    *,
    sinks: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    scratch: AttentionScratch | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Causal attention of the step's query tokens over their sequences' paged KV, each
    query row over its last `sliding_window` positions when that is > 0.

    `num_splits` overrides the split heuristic (tests and benchmarks); with `scratch` the split
    count is capped by what the scratch holds."""
    _check(q, k_cache, v_cache, meta)
    check_sinks(sinks, q)
    sliding_window = check_sliding_window(sliding_window)
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if out is None:
        out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    else:
        check_out("out", out, tuple(q.shape), q)
    if num_tokens == 0:
        return out
    max_splits = MAX_SPLITS
    if scratch is not None:
        max_splits = scratch.max_splits(num_tokens, num_q_heads, head_dim)
    max_query_len = int(meta.max_query_len)
    plan = plan_attention(
        num_tokens=num_tokens, num_seqs=meta.seq_lens.shape[0], num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, max_query_len=max_query_len,
        max_seq_len=int(meta.max_seq_len), num_sms=sm_count(q.device), num_splits=num_splits,
        max_splits=max(1, max_splits), sliding_window=sliding_window,
        query_tile=short_run_query_tile() if 1 < max_query_len <= SHORT_RUN_TOKENS else None,
        kv_itemsize=k_cache.element_size(),
    )
    launch(q, k_cache, v_cache, meta, scale, out, plan, scratch, sinks=sinks)
    return out


def launch(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: Any,
    scale: float,
    out: torch.Tensor,
    plan: AttentionPlan,
    scratch: AttentionScratch | None = None,
    *,
    sinks: torch.Tensor | None = None,
) -> None:
    """Run the kernels for a given plan (benchmarks sweep plans through this)."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads, page_size = k_cache.shape[2], k_cache.shape[1]
    is_split = plan.num_splits > 1
    rows = num_tokens * num_q_heads * plan.num_splits
    if is_split:
        if scratch is None:
            scratch = AttentionScratch.allocate(num_tokens, num_q_heads, head_dim, q.device, plan.num_splits)
        part_out, part_lse = scratch.partial_out[: rows * head_dim], scratch.partial_lse[:rows]
    else:
        part_out, part_lse = out, out  # unused
    page_table = meta.page_table
    grid = (plan.num_blocks, num_kv_heads, plan.num_splits)
    kernel = _paged_attention_kernel if plan.block_q == 1 else _paged_attention_any_size_kernel
    kernel[grid](
        q, k_cache, v_cache, out, part_out, part_lse,
        meta.query_start_loc, meta.seq_lens, page_table,
        meta.seq_lens.shape[0], num_tokens, float(scale) * math.log2(math.e),
        q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        page_table.stride(0),
        plan.num_splits, plan.split_len, plan.min_split_len, plan.sliding_window,
        q if sinks is None else sinks,
        HEAD_DIM=head_dim, BLOCK_D=max(16, next_power_of_2(head_dim)),
        GROUP=num_q_heads // num_kv_heads, BLOCK_Q=plan.block_q, BLOCK_M=plan.block_m,
        BLOCK_N=plan.block_n, SMALL_BLOCK_Q=plan.small_block_q, SMALL_BLOCK_M=plan.small_block_m,
        PAGE_SIZE=page_size, IS_SPLIT=is_split, SLIDING=plan.sliding_window > 0,
        HAS_SINKS=sinks is not None, PREFETCH_PAGES=plan.prefetch_pages,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
        **launch_options(q.device, num_tokens),
        **({"maxnreg": plan.max_registers} if plan.max_registers else {}),
    )
    if is_split:
        _reduce_splits_kernel[(num_tokens, num_q_heads)](
            part_out, part_lse, out, num_q_heads, plan.num_splits, out.stride(0), out.stride(1),
            q if sinks is None else sinks,
            HEAD_DIM=head_dim, BLOCK_D=next_power_of_2(head_dim),
            BLOCK_S=max(2, next_power_of_2(plan.num_splits)), HAS_SINKS=sinks is not None,
            num_warps=4, **launch_options(q.device, num_tokens),
        )
