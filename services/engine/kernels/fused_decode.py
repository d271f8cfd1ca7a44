"""Decode attention in one launch: the attention prologue (QK-norm, rotary, the new K/V into
the paged cache), paged attention over the KV and the split-K reduction, for steps whose
every sequence feeds exactly one token (`meta.max_query_len == 1`).

    decode_attention(qkv [T, (Hq + 2 Hk) D], q_norm [D] | None, k_norm [D] | None, eps,
                     positions [T], cos_sin_cache [P, D], is_neox, k_cache, v_cache,
                     slot_mapping [T], meta, num_q_heads, num_kv_heads, scale,
                     sliding_window=0, *, out=None) -> [T, Hq, D]

It replaces three launches per layer (`qkv_prologue`, `paged_attention`'s kernel and its
split reduction) with the same arithmetic, so the output and the cache contents equal the
unfused path's. The grid is the decode attention's (token, KV head, split), planned by
`plan_attention` (the same split count and split lengths). Program (t, h, s):

1. Before `wait_for_previous_grids`: the step inputs (query_start_loc, seq_lens, positions,
   slot_mapping, the cos/sin row) and q's norm weights, which no kernel of the step writes
   (host copies before the graph, or torch ops ahead of the step's first PDL kernel), and
   its KV range from them. qkv is the previous kernel's output: read after the wait.
2. Splits whose range is empty (past the sequence's end) return after the wait.
3. Its GROUP query heads' q, normed and rotated with the prologue's arithmetic and rounded
   to q's dtype as the prologue's store rounds it, in registers, in the layout the attention
   tile loads: each head's RMS from the prologue's own tiles of rotary pairs (prologue.py's
   `_load_heads`: the same sums), then per element the prologue's products (`_rotate`).
   Not `tl.join` of the two halves: a join in q's history makes Triton give the QK dot
   another MMA operand layout (kWidth 4 instead of 2), which sums the products in another
   order (and cost 30 registers).
4. The split holding the new position seq_len - 1 (the last non-empty one) computes the new
   k (norm + rotary) and v and stores them at `slot_mapping[t]` (skipped when < 0) with the
   prologue's code (FP8 pages: e4m3 with unit scales), then a CTA barrier, so its own tile
   loop reads the new position from the cache like every other. No other program reads it.
5. The tile loop of `_paged_attention_kernel` (`_attend_kv`). With one non-empty split (an
   unsplit plan, or a context of at most one split's length) it writes the normalised
   output (a reduction of one split gives the same values). Otherwise it writes its partial
   output and log2-sum-exp as the split kernel does, then takes a ticket: CTA barrier,
   `atomic_add` (acq_rel, GPU scope, one thread) on the (t, h) counter; the program that
   draws the last ticket resets the counter to 0 and merges the non-empty splits of its
   GROUP heads in split order with `_reduce_splits_kernel`'s code (`_merge_splits`, the
   partials loaded past L1: `.cg`).

The unfused kernels' arithmetic, step for step, so the output and the caches equal theirs bit
for bit: in the interpreter (tests/kernels/test_decode_attention.py), and compiled, the sm_90
compile test checks that the QK dot's operand layout and every reduction's layout are the
unfused kernels' (the GPU tests then compare bits). Launches are capped at `MAX_REGISTERS`.

Padding rows (past query_start_loc[B]) come back as zeros; their K/V is written when their
slot is >= 0 (as the prologue would). The fused kernel assumes what a decode step is: each
sequence's one token sits at position seq_len - 1 and its slot is that position's cache
slot, so no program reads a slot another one writes.

Ticket counters: int32, one per (token, KV head), zero at rest (the merger resets its own).
One buffer per KV cache tensor (two model streams, the target's decode graph and an EAGLE-3
round's, may run at once over their own caches; one cache is used by one kernel at a time),
allocated zeroed on first use and grown by an eager call that needs more; it cannot grow
while a CUDA graph is being captured (an error: every capture in the engine follows an
eager warm-up run of the same step), and a replaced buffer is kept alive for the graphs
that captured it. A launch with one split per (token, head) uses no counters.

Scope (`unsupported_reason`): full rotary, a power-of-two head dim (16..256), positions [T],
no attention sinks; FP8 pages only with unit scales (the caller keeps per-head scales on the
unfused path). Sliding windows take the decode kernel's windowed ranges. Launch shapes come
from host ints only, nothing synchronises; with `out=` and `scratch=` (and the counters
allocated) a call allocates nothing, so a CUDA graph captures it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import triton
import triton.language as tl

from services.common.errors import UnsupportedError, ValidationError
from services.engine.kernels import pdl
from services.engine.kernels.attention import (
    MAX_SPLITS,
    AttentionScratch,
    _check,
    check_sliding_window,
    plan_attention,
)
from services.engine.kernels.attention_kernel import (
    _attend_kv,
    _find_sequence,
    _kv_range,
    _merge_splits,
    _store_partials,
)
from services.engine.kernels.common import (
    check_float,
    check_kv_cache_dtype,
    check_out,
    check_rank,
    check_same_device,
    next_power_of_2,
    sm_count,
)
from services.engine.kernels.pdl import launch_options, wait_for_previous_grids
from services.engine.kernels.prologue import (
    _load_heads,
    _norm_weight,
    _normed,
    _rope_dims,
    _rotate,
    _store_kv,
    prologue_tiles,
)


@triton.jit
def _decode_attention_kernel(
    qkv_ptr, qw_ptr, kw_ptr, pos_ptr, cos_sin_ptr, slot_ptr,
    k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, counter_ptr,
    qsl_ptr, seq_lens_ptr, page_table_ptr,
    num_seqs, num_tokens, eps, qk_scale,
    stride_qkv, stride_cos, stride_ot, stride_oh,
    stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
    num_splits, split_len, min_split_len, window,
    HEAD_DIM: tl.constexpr, IS_NEOX: tl.constexpr, HAS_NORM: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_H: tl.constexpr,
    BLOCK_S: tl.constexpr, PAGE_SIZE: tl.constexpr, IS_SPLIT: tl.constexpr,
    SLIDING: tl.constexpr, PDL: tl.constexpr,
):
    HALF: tl.constexpr = HEAD_DIM // 2
    token = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    num_kv_heads = tl.num_programs(1)

    # ---- before the wait: step inputs and weights only (no earlier kernel writes them) ----
    seq = _find_sequence(qsl_ptr, num_seqs, token, 1)
    first_token = tl.load(qsl_ptr + seq)
    local = token - first_token
    if seq < num_seqs:
        q_len = tl.load(qsl_ptr + seq + 1) - first_token
        seq_len = tl.load(seq_lens_ptr + seq)
        pos0 = seq_len - q_len + local  # this token's position (seq_len - 1 in a decode)
    else:  # padding tokens after the last sequence: no KV, zero output
        q_len = num_tokens - first_token
        seq_len = 0
        pos0 = 0
    n_rows = tl.minimum(q_len - local, 1)
    kv_lo, lo, low_full, full_end, kv_end, n_used = _kv_range(
        pos0, n_rows, seq_len, split, num_splits, split_len, min_split_len, window,
        1, BLOCK_N, IS_SPLIT, SLIDING,
    )
    # the split holding position seq_len - 1 writes the new K/V (split 0 for padding rows)
    writer = tl.maximum(n_used - 1, 0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    pos = tl.load(pos_ptr + token).to(tl.int64)
    i, d1, d2, imask = _rope_dims(HALF, IS_NEOX, HALF)
    cos = tl.load(cos_sin_ptr + pos * stride_cos + i, mask=imask, other=0.0).to(tl.float32)
    sin = tl.load(cos_sin_ptr + pos * stride_cos + HALF + i, mask=imask, other=0.0).to(
        tl.float32)
    # the q tile's view of dim d: its rotary pair, whether d is the pair's first dim, and the
    # pair's other dim
    offs_d = tl.arange(0, HEAD_DIM)
    d_mask = offs_d < HEAD_DIM
    if IS_NEOX:
        pair_i = offs_d % HALF
        first_d = offs_d < HALF
        pair_d = (offs_d + HALF) % HEAD_DIM
    else:
        pair_i = offs_d // 2
        first_d = offs_d % 2 == 0
        pair_d = offs_d ^ 1
    cos_d = tl.load(cos_sin_ptr + pos * stride_cos + pair_i).to(tl.float32)
    sin_d = tl.load(cos_sin_ptr + pos * stride_cos + HALF + pair_i).to(tl.float32)
    qw = _norm_weight(qw_ptr, offs_d, d_mask, HAS_NORM)
    qw_pair = _norm_weight(qw_ptr, pair_d, d_mask, HAS_NORM)

    wait_for_previous_grids(PDL)
    if (split > writer) | (n_rows <= 0):
        return  # an empty split (past the sequence's end), or no token
    qkv_row = qkv_ptr + token.to(tl.int64) * stride_qkv
    offs_m = tl.arange(0, BLOCK_M)
    row_valid = offs_m < GROUP
    row_head = kv_head * GROUP + offs_m
    # q of the GROUP heads in the tile the attention loads (row m: query head
    # kv_head * GROUP + m, dims in order), as the prologue computes and stores it: each
    # head's rstd from the prologue's tiles of rotary pairs (so the same sums), then per
    # element the prologue's products and roundings (`_rotate` with its operand order: A for
    # a pair's first dim, B for its second). No join: a tl.join in q's history would make
    # Triton pick another MMA operand layout (kWidth) than the unfused kernel's, so another
    # order of the dot's sums. Padding rows compute theirs too.
    q_rows = qkv_row + row_head[:, None] * HEAD_DIM
    rstd = _load_heads(q_rows, row_valid, d1, d2, imask, d1, imask[None, :], eps, HEAD_DIM,
                       0)[3]
    tile_mask = row_valid[:, None] & d_mask[None, :]
    x = _normed(tl.load(q_rows + offs_d[None, :], mask=tile_mask, other=0.0).to(tl.float32),
                qw, rstd, HAS_NORM)
    x_pair = _normed(tl.load(q_rows + pair_d[None, :], mask=tile_mask, other=0.0).to(
        tl.float32), qw_pair, rstd, HAS_NORM)
    first_a = _rotate(x, x_pair, cos_d, sin_d)[0]
    second_b = _rotate(x_pair, x, cos_d, sin_d)[1]
    q = tl.where(first_d[None, :], first_a, second_b).to(out_ptr.dtype.element_ty)
    if (split == writer) & (slot >= 0):
        # the new k (normed, rotated) and v of this KV head, as the prologue's k programs
        # write them (tiles of BLOCK_H heads, only the first one real)
        heads = kv_head + tl.arange(0, BLOCK_H)
        hmask = heads < kv_head + 1
        k_row = qkv_row + GROUP * num_kv_heads * HEAD_DIM + heads[:, None] * HEAD_DIM
        kmask = hmask[:, None] & imask[None, :]
        k_x1, k_x2, _k_rest, k_rstd = _load_heads(k_row, hmask, d1, d2, imask, d1, kmask,
                                                  eps, HEAD_DIM, 0)
        k1, k2 = _rotate(_normed(k_x1, _norm_weight(kw_ptr, d1, imask, HAS_NORM), k_rstd,
                                 HAS_NORM),
                         _normed(k_x2, _norm_weight(kw_ptr, d2, imask, HAS_NORM), k_rstd,
                                 HAS_NORM), cos, sin)
        _store_kv(
            k_row, heads, hmask, slot, k1, k2, k1, d1, d2, imask, d1, kmask, k_cache_ptr,
            v_cache_ptr, num_kv_heads, stride_ko, stride_kh, stride_vo, stride_vh,
            HEAD_DIM, 0, HEAD_DIM,
        )
        tl.debug_barrier()  # the whole CTA reads the new position from the cache below
    if seq >= num_seqs:
        tl.store(out_ptr + token.to(tl.int64) * stride_ot + row_head[:, None] * stride_oh
                 + offs_d[None, :], tl.zeros([BLOCK_M, HEAD_DIM], tl.float32).to(
                     out_ptr.dtype.element_ty), mask=row_valid[:, None] & d_mask[None, :])
        return

    acc, m_i, l_i = _attend_kv(
        q, seq, kv_head, k_cache_ptr, v_cache_ptr, page_table_ptr,
        stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
        kv_lo, lo, low_full, full_end, kv_end, pos0 + offs_m // GROUP, window, qk_scale,
        offs_d, d_mask, BLOCK_M, HEAD_DIM, 1, BLOCK_N, PAGE_SIZE, IS_SPLIT, SLIDING,
    )
    seen = l_i > 0.0
    o = acc / tl.where(seen, l_i, 1.0)[:, None]
    token64 = token.to(tl.int64)
    out_rows = out_ptr + token64 * stride_ot + row_head[:, None] * stride_oh + offs_d[None, :]
    if n_used <= 1:
        # one split saw all the KV: its normalised output is the result (the reduction of
        # one split gives the same values)
        tl.store(out_rows, o.to(out_ptr.dtype.element_ty),
                 mask=row_valid[:, None] & d_mask[None, :])
    else:
        _store_partials(part_out_ptr, part_lse_ptr, o, m_i, l_i, seen, token64, row_head,
                        row_valid, split, num_splits, GROUP * num_kv_heads, offs_d, d_mask,
                        HEAD_DIM)
        # the ticket: every thread's partial stores come before the (one) atomic, whose
        # release and acquire (GPU scope) order them before the last program's loads
        tl.debug_barrier()
        counter = counter_ptr + token64 * num_kv_heads + kv_head
        ticket = tl.atomic_add(counter, 1, sem="acq_rel")
        if ticket == n_used - 1:
            tl.store(counter, 0)  # zero at rest: the next layer and the next replay
            for g in tl.static_range(GROUP):
                head = kv_head * GROUP + g
                _merge_splits(
                    part_out_ptr, part_lse_ptr, out_ptr, token64 * (GROUP * num_kv_heads) + head,
                    token64 * stride_ot + head * stride_oh, head, n_used, num_splits,
                    part_lse_ptr, HEAD_DIM, HEAD_DIM, BLOCK_S, False, ".cg",
                )


# ---- ticket counters ----------------------------------------------------------------------

_COUNTERS: dict[tuple[str, int], torch.Tensor] = {}
_RETIRED: list[torch.Tensor] = []   # replaced buffers, still referenced by captured graphs
MIN_COUNTERS = 1024

# Registers per thread: left alone, ptxas gives some variants (unsplit, or split with a sliding
# window) 148-150 at head dim 128, 3 programs of 4 warps per SM where the unfused attention
# kernel (96-117) has 4 or 5; capped at 128 (4 per SM) none spills (the sm_90 compile test)
MAX_REGISTERS = 128


def ticket_counters(k_cache: torch.Tensor, rows: int) -> torch.Tensor:
    """The zero-at-rest int32 counters (at least `rows`) of the fused launches over
    `k_cache`; allocated or grown here, never while a CUDA graph is being captured."""
    key = (str(k_cache.device), k_cache.data_ptr())
    counters = _COUNTERS.get(key)
    if counters is not None and counters.numel() >= rows:
        return counters
    if k_cache.is_cuda and torch.cuda.is_current_stream_capturing():
        raise UnsupportedError(
            f"decode_attention: its ticket counters ({rows} needed) cannot be allocated while "
            "a CUDA graph is being captured; run the step once eagerly before the capture")
    if counters is not None:
        _RETIRED.append(counters)
    size = max(rows, MIN_COUNTERS, 2 * counters.numel() if counters is not None else 0)
    counters = torch.zeros(size, dtype=torch.int32, device=k_cache.device)
    _COUNTERS[key] = counters
    return counters


# ---- the wrapper --------------------------------------------------------------------------


def unsupported_reason(
    qkv: torch.Tensor, k_cache: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, *, sinks: torch.Tensor | None = None,
) -> str | None:
    """Why the fused kernel does not take this layer (the caller then runs qkv_prologue +
    paged_attention), or None when it does."""
    head_dim = k_cache.shape[-1] if k_cache.dim() == 4 else 0
    if head_dim < 16 or head_dim > 256 or head_dim & (head_dim - 1):
        return f"head dim {head_dim} (a power of two from 16 to 256 is fused)"
    if cos_sin_cache.dim() != 2 or cos_sin_cache.shape[1] != head_dim:
        return (f"rotary dim {cos_sin_cache.shape[-1]} != head dim {head_dim} (partial rotary "
                "is not fused)")
    if positions.dim() != 1:
        return f"positions of shape {tuple(positions.shape)} (one row [T] is fused)"
    if sinks is not None:
        return "attention sinks are not fused"
    if k_cache.dtype not in (qkv.dtype, torch.float8_e4m3fn):
        return f"KV cache dtype {k_cache.dtype} with qkv {qkv.dtype}"
    return None


def decode_attention_supports(
    qkv: torch.Tensor, k_cache: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, *, sinks: torch.Tensor | None = None, eager: bool = False,
) -> bool:
    """Whether the model runs `decode_attention` for this layer's decode step: the kernel
    takes the layer (`unsupported_reason`), and the launch belongs to a CUDA graph (inside
    `pdl.graph_launches()`: the captures and the warm-up run before each), unless `eager`.
    Eager steps keep the unfused kernels, as they keep launching without PDL: their variants
    are the ones the start-up's eager warm-up meets (runner/warm_up.py), while the fused
    kernel's key joins the attention's split class to the reduction's split tier (BLOCK_S),
    so eager decode steps over new contexts would compile variants while serving."""
    if not eager and not pdl._in_graph_launches:
        return False
    return unsupported_reason(qkv, k_cache, cos_sin_cache, positions, sinks=sinks) is None


def decode_attention(
    qkv: torch.Tensor,
    q_norm: torch.Tensor | None,
    k_norm: torch.Tensor | None,
    eps: float,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    is_neox: bool,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    meta: Any,
    num_q_heads: int,
    num_kv_heads: int,
    scale: float,
    sliding_window: int = 0,
    *,
    out: torch.Tensor | None = None,
    scratch: AttentionScratch | None = None,
    num_splits: int | None = None,
) -> torch.Tensor:
    """qkv_prologue + paged_attention of a decode-only step in one launch: the attention
    output [T, Hq, D]; the new k (normed, rotated) and v written to the cache slots.

    `num_splits` overrides the split heuristic (tests and benchmarks); with `scratch` the
    split count is capped by what the scratch holds. `out` must not alias qkv."""
    check_rank("qkv", qkv, 2)
    check_rank("cos_sin_cache", cos_sin_cache, 2)
    check_rank("k_cache", k_cache, 4)
    check_same_device(qkv=qkv, positions=positions, cos_sin_cache=cos_sin_cache,
                      k_cache=k_cache, v_cache=v_cache, slot_mapping=slot_mapping)
    num_tokens = qkv.shape[0]
    head_dim = k_cache.shape[3]
    if qkv.shape[1] != (num_q_heads + 2 * num_kv_heads) * head_dim or qkv.stride(1) != 1:
        raise ValidationError(f"qkv: expected [T, {(num_q_heads + 2 * num_kv_heads) * head_dim}]"
                              f" with contiguous rows, got {tuple(qkv.shape)}")
    if (k_cache.shape[2] != num_kv_heads or v_cache.shape != k_cache.shape or
            not k_cache.is_contiguous() or not v_cache.is_contiguous()):
        raise ValidationError(f"KV caches must be contiguous [pages, page_size, {num_kv_heads},"
                              f" {head_dim}], got {tuple(k_cache.shape)}")
    if (q_norm is None) != (k_norm is None):
        raise ValidationError("q_norm and k_norm come together")
    for name, t in (("qkv", qkv), ("cos_sin_cache", cos_sin_cache)):
        check_float(name, t)
    check_kv_cache_dtype("k_cache", k_cache)
    if positions.shape != (num_tokens,) or slot_mapping.shape != (num_tokens,):
        raise ValidationError(f"positions and slot_mapping must be [{num_tokens}]")
    if cos_sin_cache.stride(1) != 1:
        raise ValidationError("cos_sin_cache: rows must be contiguous")
    reason = unsupported_reason(qkv, k_cache, cos_sin_cache, positions)
    if reason is not None:
        raise UnsupportedError(f"decode_attention: {reason}")
    if int(meta.max_query_len) != 1:
        raise ValidationError(f"decode_attention: a decode-only step (max_query_len 1), got "
                              f"max_query_len {meta.max_query_len}")
    sliding_window = check_sliding_window(sliding_window)
    shape = (num_tokens, num_q_heads, head_dim)
    if out is None:
        out = torch.empty(shape, dtype=qkv.dtype, device=qkv.device)
    else:
        check_out("out", out, shape, qkv)
    _check(out, k_cache, v_cache, meta)  # the metadata, head counts and cache dtypes
    if num_tokens == 0:
        return out
    max_splits = MAX_SPLITS
    if scratch is not None:
        max_splits = scratch.max_splits(num_tokens, num_q_heads, head_dim)
    plan = plan_attention(
        num_tokens=num_tokens, num_seqs=meta.seq_lens.shape[0], num_q_heads=num_q_heads,
        num_kv_heads=num_kv_heads, head_dim=head_dim, max_query_len=1,
        max_seq_len=int(meta.max_seq_len), num_sms=sm_count(qkv.device), num_splits=num_splits,
        max_splits=max(1, max_splits), sliding_window=sliding_window,
    )
    is_split = plan.num_splits > 1
    if is_split:
        rows = num_tokens * num_q_heads * plan.num_splits
        if scratch is None:
            scratch = AttentionScratch.allocate(num_tokens, num_q_heads, head_dim, qkv.device,
                                                plan.num_splits)
        part_out = scratch.partial_out[: rows * head_dim]
        part_lse = scratch.partial_lse[:rows]
        counters = ticket_counters(k_cache, num_tokens * num_kv_heads)
    else:
        part_out, part_lse, counters = out, out, slot_mapping  # unused
    block_h = prologue_tiles(num_q_heads, num_kv_heads, head_dim, head_dim)[0]
    has_norm = q_norm is not None
    page_table = meta.page_table
    grid = (plan.num_blocks, num_kv_heads, plan.num_splits)
    _decode_attention_kernel[grid](
        qkv, q_norm if has_norm else qkv, k_norm if has_norm else qkv, positions,
        cos_sin_cache, slot_mapping, k_cache, v_cache, out, part_out, part_lse, counters,
        meta.query_start_loc, meta.seq_lens, page_table,
        meta.seq_lens.shape[0], num_tokens, float(eps), float(scale) * math.log2(math.e),
        qkv.stride(0), cos_sin_cache.stride(0), out.stride(0), out.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), page_table.stride(0),
        plan.num_splits, plan.split_len, plan.min_split_len, plan.sliding_window,
        HEAD_DIM=head_dim, IS_NEOX=bool(is_neox), HAS_NORM=has_norm,
        GROUP=num_q_heads // num_kv_heads, BLOCK_M=plan.block_m, BLOCK_N=plan.block_n,
        BLOCK_H=block_h, BLOCK_S=max(2, next_power_of_2(plan.num_splits)),
        PAGE_SIZE=k_cache.shape[1], IS_SPLIT=is_split, SLIDING=plan.sliding_window > 0,
        num_warps=plan.num_warps, num_stages=plan.num_stages,
        maxnreg=MAX_REGISTERS,
        **launch_options(qkv.device, num_tokens),
    )
    return out
