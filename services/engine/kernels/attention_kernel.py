"""The paged attention kernels: one launch for any mix of prefill and decode rows, plus the
split-K reduction.

Program (block, kv_head, split) of `_paged_attention_kernel` owns BLOCK_Q consecutive query
tokens of one sequence times the GROUP query heads that share `kv_head` (GQA), packed into the
BLOCK_M rows of one tile: row m is token m // GROUP, query head kv_head * GROUP + m % GROUP.
Each K/V tile is read once for the whole group. The query token at position p (p = seq_len -
q_len + its index in the step) sees KV [0, p], or with a sliding window (SLIDING, `window` =
W > 0) KV [max(0, p - W + 1), p]. The block's KV range runs from the first row's first visible
position to the last row's position; its splits divide that range, and the program walks
its split's part of it in BLOCK_N tiles. Tiles every row sees fully run without a mask; the
rest are masked per row. With a window nothing below the first row's window is read: the
tiles start at it (not at a multiple of BLOCK_N), so a decode row reads exactly W positions.

Blocks are laid out sequence after sequence: sequence i owns blocks starting at
`query_start_loc[i] // BLOCK_Q + i` (just `query_start_loc[i]` when BLOCK_Q == 1), which
bounds the grid by cdiv(T, BLOCK_Q) + B with no host read; a program finds its sequence by a
binary search over `query_start_loc` (decode launches first check the usual answer, token i
belongs to sequence i). Blocks past the last sequence cover the padding tokens
[query_start_loc[B], T): they see no KV and write zeros.

A prefill or mixed launch uses wide tiles (BLOCK_Q tokens); a sequence with at most
SMALL_BLOCK_Q query tokens (decode rows in a mixed step) takes a narrow SMALL_BLOCK_M-row tile
in the same launch, chosen per program at run time.

Without split (IS_SPLIT false) the program writes the normalised output. With split it writes
its normalised partial output and log2-sum-exp (-inf when it saw no KV) to scratch, and
`_reduce_splits_kernel` merges the splits of each (token, head).
"""

from __future__ import annotations

import triton
import triton.language as tl

from services.engine.kernels.pdl import wait_for_previous_grids

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # sinks are natural-log logits


@triton.jit
def _search_sequence(qsl_ptr, num_seqs, block, BLOCK_Q: tl.constexpr):
    """Largest i in [0, num_seqs] whose first block is <= `block` (num_seqs: padding)."""
    lo = 0
    hi = num_seqs
    while lo < hi:
        mid = (lo + hi + 1) // 2
        start = tl.load(qsl_ptr + mid)
        if BLOCK_Q > 1:
            start = start // BLOCK_Q + mid
        if start <= block:
            lo = mid
        else:
            hi = mid - 1
    return lo


@triton.jit
def _find_sequence(qsl_ptr, num_seqs, block, BLOCK_Q: tl.constexpr):
    """The sequence that owns query block `block` (num_seqs for the padding rows)."""
    if BLOCK_Q == 1:
        # Decode steps: sequence i almost always owns token i. Check that guess with two loads
        # issued together instead of a chain of log2(B) dependent loads; search otherwise.
        guess = tl.minimum(block, num_seqs)
        start = tl.load(qsl_ptr + guess)
        end = tl.load(qsl_ptr + tl.minimum(guess + 1, num_seqs))
        owns = (start <= block) & ((guess == num_seqs) | (block < end))
        if owns:  # noqa: SIM108 (a run-time branch: the search runs only on a miss)
            seq = guess
        else:
            seq = _search_sequence(qsl_ptr, num_seqs, block, BLOCK_Q)
    else:
        seq = _search_sequence(qsl_ptr, num_seqs, block, BLOCK_Q)
    return seq


@triton.jit
def _attend_tile(
    acc, m_i, l_i, q, start, seq,
    k_cache_ptr, v_cache_ptr, page_table_ptr,
    stride_pt, stride_kp, stride_ko, stride_vp, stride_vo, kv_head_off_k, kv_head_off_v,
    kv_lo, kv_end, row_pos, window, qk_scale,
    offs_d, d_mask,
    MASKED: tl.constexpr, SLIDING: tl.constexpr, PAGE_SIZE: tl.constexpr, BLOCK_N: tl.constexpr,
    pages=None, PAGES_GIVEN: tl.constexpr = False,
):
    """One BLOCK_N tile of KV folded into the running softmax. With PAGES_GIVEN `pages` holds
    the tile's page numbers (int64 [BLOCK_N], loaded an iteration ahead by the caller)."""
    offs_n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_mask = offs_n < kv_end
        if SLIDING:  # an aligned tile may start below the window: nothing there is loaded
            n_mask = n_mask & (offs_n >= kv_lo)
    else:
        n_mask = offs_n >= 0  # all true; keeps one code path for the loads
    if PAGES_GIVEN:
        page = pages
    else:
        page = tl.load(page_table_ptr + seq * stride_pt + offs_n // PAGE_SIZE, mask=n_mask, other=0)
        page = page.to(tl.int64)
    in_page = offs_n % PAGE_SIZE
    k_off = page * stride_kp + in_page * stride_ko + kv_head_off_k
    v_off = page * stride_vp + in_page * stride_vo + kv_head_off_v
    kv_mask = n_mask[None, :] & d_mask[:, None]
    k_t = tl.load(k_cache_ptr + k_off[None, :] + offs_d[:, None], mask=kv_mask, other=0.0)
    k_t = k_t.to(q.dtype)  # FP8 pages: e4m3 -> q's dtype, exact (a no-op otherwise)
    s = tl.dot(q, k_t) * qk_scale  # [BLOCK_M, BLOCK_N], log2 units
    if MASKED:
        visible = (offs_n[None, :] <= row_pos[:, None]) & n_mask[None, :]
        if SLIDING:  # transformers' window: kv_idx > q_idx - sliding_window
            visible = visible & (offs_n[None, :] > row_pos[:, None] - window)
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, axis=1))
    p = tl.math.exp2(s - m_new[:, None])
    alpha = tl.math.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, axis=1)
    v = tl.load(
        v_cache_ptr + v_off[:, None] + offs_d[None, :],
        mask=n_mask[:, None] & d_mask[None, :],
        other=0.0,
    ).to(q.dtype)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return acc, m_new, l_i


@triton.jit
def _attend_block(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, page_table_ptr,
    seq, kv_head, split, tok0, n_rows, pos0, seq_len, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
    num_splits, split_len, min_split_len, window, sinks_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PAGE_SIZE: tl.constexpr, IS_SPLIT: tl.constexpr, SLIDING: tl.constexpr,
    HAS_SINKS: tl.constexpr, PREFETCH_PAGES: tl.constexpr,
):
    """Attention of query tokens [tok0, tok0 + n_rows) (positions from pos0) x the GROUP query
    heads of `kv_head`, over this program's KV range; writes the output or the split partials.
    With HAS_SINKS (unsplit) each head's sink logit joins the softmax denominator here; split
    launches add it in the reduction."""
    offs_m = tl.arange(0, BLOCK_M)
    row_tok = offs_m // GROUP
    row_head = kv_head * GROUP + offs_m % GROUP
    row_valid = (row_tok < n_rows) & (offs_m < BLOCK_Q * GROUP)
    row_pos = pos0 + row_tok
    token = (tok0 + row_tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM

    q = tl.load(
        q_ptr + token[:, None] * stride_qt + row_head[:, None] * stride_qh + offs_d[None, :],
        mask=row_valid[:, None] & d_mask[None, :],
        other=0.0,
    )
    if k_cache_ptr.dtype.element_ty == tl.float8e4nv and q.dtype == tl.bfloat16:
        # FP8 pages: the MMAs run in f16, which e4m3 reaches in one conversion a pair (bf16
        # takes three more instructions a pair, and made the FP8 decode loop 1.9x bf16's
        # instructions for half its bytes); both exact. q is clamped into f16's range once
        # (a NaN stays a NaN, as the bf16 MMA would carry it).
        q = tl.clamp(q.to(tl.float32), -65504.0, 65504.0,
                     propagate_nan=tl.PropagateNan.ALL).to(tl.float16)

    # KV range of this program: its split, clipped by the causal end of its last row
    kv_end = tl.minimum(seq_len, pos0 + n_rows)
    if SLIDING:
        # ...and by its first row's window: [kv_lo, kv_end) is all any row of the block sees
        kv_lo = tl.maximum(pos0 - window + 1, 0)
        if BLOCK_Q == 1 and not IS_SPLIT:  # noqa: SIM108 (constexpr branch)
            # unsplit decode (large batches, many programs per SM): tiles on multiples of
            # BLOCK_N from the one holding kv_lo, so the compiler knows their alignment as in
            # full attention (measured 8-11% faster at batch 256 than tiles from kv_lo)
            base = (kv_lo // BLOCK_N) * BLOCK_N
        else:
            # split decode and prefill: tiles from kv_lo, so a decode row reads exactly its
            # window in W / BLOCK_N unmasked tiles and needs no masked tile below it (the
            # aligned layout's extra masked loop cost 19 registers: fewer programs per SM)
            base = kv_lo
        if IS_SPLIT:  # the splits divide this range as the unwindowed ones divide [0, kv_end)
            length = tl.cdiv(tl.cdiv(kv_end - base, num_splits), BLOCK_N) * BLOCK_N
            length = tl.minimum(split_len, tl.maximum(min_split_len, length))
            lo = base + split * length
            kv_end = tl.minimum(kv_end, lo + length)
        else:
            lo = base
        # Tiles start at lo + i * BLOCK_N: those below `low_full` hold keys out of the last
        # row's window or below kv_lo (masked; none for a one-token block whose tiles start
        # at kv_lo), those from `full_end` on keys past the first row's position (masked);
        # every row sees the ones in between.
        below = tl.maximum(pos0 + n_rows - window - lo, 0)  # last row's window start - lo
        low_full = tl.minimum(lo + tl.cdiv(below, BLOCK_N) * BLOCK_N, kv_end)
        low_full = tl.maximum(low_full, lo)
        seen_by_all = tl.maximum(tl.minimum(pos0 + 1, kv_end) - lo, 0)
        full_end = tl.maximum(lo + (seen_by_all // BLOCK_N) * BLOCK_N, low_full)
    else:
        if IS_SPLIT:
            # The splits share this block's actual KV range (not the launch's max_seq_len,
            # which a CUDA graph fixes at the context limit): ranges of at least
            # min_split_len, at most split_len, so num_splits * range always covers kv_end.
            length = tl.cdiv(tl.cdiv(kv_end, num_splits), BLOCK_N) * BLOCK_N
            length = tl.minimum(split_len, tl.maximum(min_split_len, length))
            lo = split * length
            kv_end = tl.minimum(kv_end, lo + length)
        else:
            lo = 0
        # tiles below `full_end` are visible to every row (the first row sees [0, pos0])
        full_end = tl.minimum(((pos0 + 1) // BLOCK_N) * BLOCK_N, kv_end)
        full_end = tl.maximum(full_end, lo)
        low_full = lo
        kv_lo = 0

    m_i = tl.full([BLOCK_M], -1.0e30, dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    kv_head_off_k = kv_head.to(tl.int64) * stride_kh
    kv_head_off_v = kv_head.to(tl.int64) * stride_vh
    seq64 = seq.to(tl.int64)
    if SLIDING and (BLOCK_Q > 1 or not IS_SPLIT):
        for start in range(lo, low_full, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, q, start, seq64,
                k_cache_ptr, v_cache_ptr, page_table_ptr,
                stride_pt, stride_kp, stride_ko, stride_vp, stride_vo, kv_head_off_k, kv_head_off_v,
                kv_lo, kv_end, row_pos, window, qk_scale, offs_d, d_mask,
                True, True, PAGE_SIZE, BLOCK_N,
            )
    # The tiles every row sees. With PREFETCH_PAGES each tile's page numbers are loaded an
    # iteration ahead: the K/V copies then depend on no load of their own iteration, and
    # Triton's pipeliner (num_stages >= 3) double-buffers them. With the page-table load in
    # the tile it keeps one K/V buffer at any num_stages and waits for each tile's copy
    # right after issuing it: sm_90 compiles, shared memory 38.9 KB -> 71.7 KB and
    # `async_wait {num = 0}` -> `{num = 2}` at the Qwen3-8B decode tile.
    pt_row = page_table_ptr + seq64 * stride_pt
    offs_t = tl.arange(0, BLOCK_N)
    pages = offs_t  # unused without PREFETCH_PAGES
    if PREFETCH_PAGES:
        pages = tl.load(pt_row + (low_full + offs_t) // PAGE_SIZE,
                        mask=low_full + offs_t < full_end, other=0).to(tl.int64)
    for start in range(low_full, full_end, BLOCK_N):
        if PREFETCH_PAGES:
            ahead = start + BLOCK_N + offs_t
            pages_ahead = tl.load(pt_row + ahead // PAGE_SIZE, mask=ahead < full_end,
                                  other=0).to(tl.int64)
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start, seq64,
            k_cache_ptr, v_cache_ptr, page_table_ptr,
            stride_pt, stride_kp, stride_ko, stride_vp, stride_vo, kv_head_off_k, kv_head_off_v,
            kv_lo, kv_end, row_pos, window, qk_scale, offs_d, d_mask,
            False, SLIDING, PAGE_SIZE, BLOCK_N, pages, PREFETCH_PAGES,
        )
        if PREFETCH_PAGES:
            pages = pages_ahead
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            acc, m_i, l_i, q, start, seq64,
            k_cache_ptr, v_cache_ptr, page_table_ptr,
            stride_pt, stride_kp, stride_ko, stride_vp, stride_vo, kv_head_off_k, kv_head_off_v,
            kv_lo, kv_end, row_pos, window, qk_scale, offs_d, d_mask,
            True, SLIDING, PAGE_SIZE, BLOCK_N,
        )

    if HAS_SINKS and not IS_SPLIT:
        # the sink: one more logit per head (log2 units here), no value behind it
        sink = tl.load(sinks_ptr + row_head, mask=row_valid, other=0.0).to(tl.float32) * LOG2E
        m_sink = tl.maximum(m_i, sink)
        alpha = tl.math.exp2(m_i - m_sink)
        l_i = l_i * alpha + tl.math.exp2(sink - m_sink)
        acc = acc * alpha[:, None]
    seen = l_i > 0.0
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    if IS_SPLIT:
        # partials: [T, Hq, num_splits, D] and [T, Hq, num_splits], contiguous
        part_row = (token * (GROUP * tl.num_programs(1)) + row_head) * num_splits + split
        lse = tl.where(seen, m_i + tl.math.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
        tl.store(part_lse_ptr + part_row, lse, mask=row_valid)
        tl.store(
            part_out_ptr + part_row[:, None] * HEAD_DIM + offs_d[None, :],
            out,
            mask=(row_valid & seen)[:, None] & d_mask[None, :],
        )
    else:
        tl.store(
            out_ptr + token[:, None] * stride_ot + row_head[:, None] * stride_oh + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_valid[:, None] & d_mask[None, :],
        )


def _paged_attention(
    q_ptr, k_cache_ptr, v_cache_ptr, out_ptr,
    part_out_ptr, part_lse_ptr,
    qsl_ptr, seq_lens_ptr, page_table_ptr,
    num_seqs, num_tokens, qk_scale,
    stride_qt, stride_qh, stride_ot, stride_oh,
    stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh,
    stride_pt,
    num_splits, split_len, min_split_len, window, sinks_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SMALL_BLOCK_Q: tl.constexpr, SMALL_BLOCK_M: tl.constexpr,
    PAGE_SIZE: tl.constexpr, IS_SPLIT: tl.constexpr, SLIDING: tl.constexpr, PDL: tl.constexpr,
    HAS_SINKS: tl.constexpr = False, PREFETCH_PAGES: tl.constexpr = False,
):
    block = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    wait_for_previous_grids(PDL)

    seq = _find_sequence(qsl_ptr, num_seqs, block, BLOCK_Q)
    first_token = tl.load(qsl_ptr + seq)
    if BLOCK_Q > 1:  # noqa: SIM108
        local_block = block - (first_token // BLOCK_Q + seq)
    else:
        local_block = block - first_token
    tok0 = first_token + local_block * BLOCK_Q  # first token of this block
    if seq < num_seqs:
        q_len = tl.load(qsl_ptr + seq + 1) - first_token
        seq_len = tl.load(seq_lens_ptr + seq)
        pos0 = seq_len - q_len + local_block * BLOCK_Q  # position of token tok0
    else:  # padding tokens after the last sequence: no KV, zero output
        q_len = num_tokens - first_token
        seq_len = 0
        pos0 = 0
    n_rows = tl.minimum(q_len - local_block * BLOCK_Q, BLOCK_Q)
    if n_rows <= 0:
        return  # this block index maps to no token

    if SMALL_BLOCK_Q < BLOCK_Q:
        # Wide tiles for long query runs; a sequence of at most SMALL_BLOCK_Q tokens (a decode
        # row in a mixed step) has one block and takes the narrow tile, so it does not pay for
        # BLOCK_M rows of tensor-core work to use GROUP of them.
        if q_len <= SMALL_BLOCK_Q:
            _attend_block(
                q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, page_table_ptr,
                seq, kv_head, split, tok0, n_rows, pos0, seq_len, qk_scale,
                stride_qt, stride_qh, stride_ot, stride_oh,
                stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
                num_splits, split_len, min_split_len, window, sinks_ptr,
                HEAD_DIM, BLOCK_D, GROUP, SMALL_BLOCK_Q, SMALL_BLOCK_M, BLOCK_N, PAGE_SIZE, IS_SPLIT,
                SLIDING, HAS_SINKS, PREFETCH_PAGES,
            )
        else:
            _attend_block(
                q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, page_table_ptr,
                seq, kv_head, split, tok0, n_rows, pos0, seq_len, qk_scale,
                stride_qt, stride_qh, stride_ot, stride_oh,
                stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
                num_splits, split_len, min_split_len, window, sinks_ptr,
                HEAD_DIM, BLOCK_D, GROUP, BLOCK_Q, BLOCK_M, BLOCK_N, PAGE_SIZE, IS_SPLIT,
                SLIDING, HAS_SINKS, PREFETCH_PAGES,
            )
    else:
        _attend_block(
            q_ptr, k_cache_ptr, v_cache_ptr, out_ptr, part_out_ptr, part_lse_ptr, page_table_ptr,
            seq, kv_head, split, tok0, n_rows, pos0, seq_len, qk_scale,
            stride_qt, stride_qh, stride_ot, stride_oh,
            stride_kp, stride_ko, stride_kh, stride_vp, stride_vo, stride_vh, stride_pt,
            num_splits, split_len, min_split_len, window, sinks_ptr,
            HEAD_DIM, BLOCK_D, GROUP, BLOCK_Q, BLOCK_M, BLOCK_N, PAGE_SIZE, IS_SPLIT, SLIDING,
            HAS_SINKS, PREFETCH_PAGES,
        )


# Two compilations of one kernel. Decode-only launches (one token per sequence: the decode
# graphs, captured at start-up) keep Triton's specialisation of the per-step sizes (== 1,
# multiples of 16), as measured for the batch-1 figures. Prefill and mixed steps run eagerly
# at ever new sizes: specialised, each new size class would compile a variant mid-serving
# (0.5-2 s stalls were measured); there those sizes, which bound loops and masks only, are
# not specialised (tests/kernels/test_compile_variants.py counts the compilations). Each
# exists with and without a sliding window (SLIDING), the full-attention code unchanged; the
# window is a model constant (one value per layer type), so it may specialise.
_paged_attention_kernel = triton.jit(_paged_attention)
_paged_attention_any_size_kernel = triton.jit(
    _paged_attention,
    do_not_specialize=["num_seqs", "num_tokens", "num_splits", "split_len", "min_split_len"])


@triton.jit
def _reduce_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr,
    num_heads, num_splits, stride_ot, stride_oh, sinks_ptr,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr,
    HAS_SINKS: tl.constexpr = False,
):
    """out[t, h] = sum_s w_s * partial_s / sum_s w_s with w_s = 2^(lse_s - max lse); with
    HAS_SINKS the head's sink adds 2^(sink - max) to the denominator (and to the max)."""
    wait_for_previous_grids(PDL)
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    row = token * num_heads + head
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(part_lse_ptr + row * num_splits + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    lse_max = tl.max(lse, axis=0)
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + head).to(tl.float32) * LOG2E
        lse_max = tl.maximum(lse_max, sink)
    lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)
    w = tl.math.exp2(lse - lse_max)  # 0 for splits that saw no KV
    used = lse > float("-inf")
    part = tl.load(
        part_out_ptr + (row * num_splits + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
        mask=used[:, None] & (offs_d < HEAD_DIM)[None, :],
        other=0.0,
    )
    total = tl.sum(w, axis=0)
    if HAS_SINKS:
        total += tl.math.exp2(sink - lse_max)
    out = tl.sum(part * w[:, None], axis=0) / tl.where(total > 0.0, total, 1.0)
    tl.store(
        out_ptr + token * stride_ot + head * stride_oh + offs_d,
        out.to(out_ptr.dtype.element_ty),
        mask=offs_d < HEAD_DIM,
    )
