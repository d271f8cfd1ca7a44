"""paged_attention against the float64 reference: decode, prefill over a cached prefix, mixed
batches with padding rows, split-K, GQA ratios, head dims and page sizes, with and without a
sliding window. Outputs are poisoned with NaN before each run; the KV cache's unused slots
hold NaN, and with a window so do the positions every query row's window has left behind."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels.attention import AttentionScratch, paged_attention, plan_attention
from services.engine.kernels.pdl import graph_launches
from tests.kernels import reference
from tests.kernels.batch import PagedBatch, make_batch
from tests.kernels.conftest import HAS_CUDA, INTERPRETED
from tests.support.switches import env_switch

BF16_TOTAL = 1e-2  # ||out - ref|| / ||ref|| over the whole output, bf16 operands
BF16_ROW = 3e-2  # the same for every single (token, head) row


def run_and_check(batch: PagedBatch, sliding_window: int = 0, **kwargs: object) -> torch.Tensor:
    scale = 1.0 / math.sqrt(batch.q.shape[-1])
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale, sliding_window,
                    out=out, **kwargs)
    ref = reference.paged_attention(batch, scale, sliding_window)
    assert torch.isfinite(out).all(), "unwritten or NaN output rows"
    real = sum(batch.q_lens)
    assert torch.all(out[real:] == 0), "padding rows must come back as zeros"
    if real:
        assert reference.rel_error(out[:real], ref[:real]) < BF16_TOTAL
        assert reference.row_rel_errors(out[:real], ref[:real]).max() < BF16_ROW
    return out


# ---- small cases: every machine (the CPU runs them through Triton's interpreter) ----

SMALL = [
    # (seq_lens, q_lens, q heads, kv heads, head dim, page size, padding)
    pytest.param([1, 37, 150], [1, 1, 1], 8, 2, 64, 16, 0, id="decode-gqa4"),
    pytest.param([40, 17, 9, 3], [1, 0, 1, 0], 4, 4, 32, 16, 2, id="decode-empty-seqs"),
    pytest.param([5, 70], [5, 70], 2, 2, 64, 16, 0, id="prefill-mha"),
    pytest.param([100, 20, 64], [30, 1, 64], 4, 2, 64, 16, 3, id="mixed-padding"),
    pytest.param([33, 9], [1, 9], 8, 1, 32, 1, 0, id="page1-gqa8"),
    pytest.param([40, 17], [3, 0], 6, 2, 48, 5, 2, id="odd-sizes-empty-seq"),
    pytest.param([50, 30, 90, 7], [2, 3, 17, 1], 16, 2, 32, 16, 1, id="short-runs-gqa8"),
]


@pytest.mark.parametrize(("seq_lens", "q_lens", "hq", "hk", "d", "page", "pad"), SMALL)
def test_small(seq_lens, q_lens, hq, hk, d, page, pad, device, dot_dtype, gen) -> None:
    batch = make_batch(
        seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hk, head_dim=d, page_size=page,
        num_padding=pad, device=device, dtype=dot_dtype, generator=gen,
    )
    run_and_check(batch)


@pytest.mark.parametrize("tile", ["4", "8", "16"])
def test_short_run_tile_switch(tile, device, dot_dtype, gen, monkeypatch) -> None:
    """HELIOS_ATTENTION_SHORT_TILE (a benchmark's switch): steps whose longest query run is
    2-16 tokens (verification rows, with decodes and padding beside them) use N-token tiles
    and still match the reference; a value that is not a power of two is refused by name."""
    from services.engine.kernels import attention

    with env_switch(monkeypatch, "HELIOS_ATTENTION_SHORT_TILE",
                    attention.short_run_query_tile) as set_switch:
        set_switch(tile)
        assert attention.short_run_query_tile() == int(tile)
        for q_lens in ([5], [5, 1, 3], [16, 2]):
            batch = make_batch(
                [60 + 7 * i for i in range(len(q_lens))], q_lens, num_q_heads=8,
                num_kv_heads=2, head_dim=32, page_size=16, num_padding=1, device=device,
                dtype=dot_dtype, generator=gen)
            run_and_check(batch)
        set_switch("6")
        with pytest.raises(ValidationError, match="HELIOS_ATTENTION_SHORT_TILE='6'"):
            attention.short_run_query_tile()


@pytest.mark.parametrize("num_splits", [2, 5])
def test_split_matches_unsplit(num_splits, device, dot_dtype, gen) -> None:
    batch = make_batch(
        [150, 3, 80], [1, 1, 2], num_q_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
        num_padding=1, device=device, dtype=dot_dtype, generator=gen,
    )
    split = run_and_check(batch, num_splits=num_splits)
    whole = run_and_check(batch, num_splits=1)
    assert reference.rel_error(split, whole) < BF16_TOTAL


def test_scratch_is_used_and_caps_splits(device, dot_dtype, gen) -> None:
    batch = make_batch(
        [200], [1], num_q_heads=4, num_kv_heads=1, head_dim=32, page_size=16,
        device=device, dtype=dot_dtype, generator=gen,
    )
    scratch = AttentionScratch.allocate(1, 4, 32, device, max_splits=3)
    scratch.partial_lse.fill_(float("nan"))
    run_and_check(batch, scratch=scratch, num_splits=8)
    assert torch.isfinite(scratch.partial_lse[:3]).any()  # the call wrote into the scratch
    assert scratch.max_splits(1, 4, 32) == 3


def test_unwritten_partials_never_reach_the_output(device, dot_dtype, gen) -> None:
    """Splits past a short sequence's end write no partial rows; the reduction must never
    let those scratch rows reach the output: with the scratch poisoned with NaN the output is
    still finite and right."""
    batch = make_batch(
        [300, 37, 9], [1, 1, 1], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=16,
        device=device, dtype=dot_dtype, generator=gen,
    )
    scratch = AttentionScratch.allocate(3, 4, 32, device, max_splits=8)
    scratch.partial_out.fill_(float("nan"))
    run_and_check(batch, scratch=scratch, num_splits=8)


def test_splits_follow_the_actual_length_not_max_seq_len(device, dot_dtype, gen) -> None:
    """A decode graph is captured with max_seq_len at the context limit; each sequence's splits
    still divide its own length (ranges of MIN_SPLIT_TOKENS), so a 300-token context is read by
    three programs per KV head, not by one or two long ones sized for 16k."""
    from services.engine.kernels.attention import MIN_SPLIT_TOKENS

    batch = make_batch(
        [300, 37, 129], [1, 1, 1], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=16,
        device=device, dtype=dot_dtype, generator=gen,
    )
    batch = dataclasses.replace(batch, meta=dataclasses.replace(batch.meta, max_seq_len=16384))
    plan = plan_attention(num_tokens=3, num_seqs=3, num_q_heads=4, num_kv_heads=2, head_dim=32,
                          max_query_len=1, max_seq_len=16384, num_sms=132)
    assert plan.num_splits == 64 and plan.split_len == 256  # sized for the limit
    scratch = AttentionScratch.allocate(3, 4, 32, device)
    scratch.partial_lse.fill_(float("nan"))
    run_and_check(batch, scratch=scratch)
    lse = scratch.partial_lse[: 3 * 4 * plan.num_splits].view(3, 4, plan.num_splits)
    used = torch.isfinite(lse) & (lse > float("-inf"))
    for row, seq_len in enumerate([300, 37, 129]):
        assert used[row].sum(dim=-1).tolist() == [-(-seq_len // MIN_SPLIT_TOKENS)] * 4


# (seq_lens, q_lens, q heads, kv heads, head dim, page size, padding, window)
WINDOWED = [
    pytest.param([1, 37, 150, 9], [1, 1, 1, 1], 8, 2, 64, 16, 0, 5, id="decode-window-in-a-page"),
    pytest.param([300, 37, 129, 64], [1, 1, 1, 1], 4, 1, 32, 16, 1, 40, id="decode-mqa-cross-pages"),
    pytest.param([1, 50, 17], [1, 1, 1], 4, 4, 32, 16, 0, 1, id="decode-window-1"),
    pytest.param([100, 70], [30, 70], 4, 2, 64, 16, 2, 40, id="prefill-chunk-in-cached-prefix"),
    pytest.param([90, 20], [60, 20], 2, 2, 32, 16, 0, 7, id="prefill-window-below-a-tile"),
    pytest.param([90, 40], [90, 13], 2, 2, 32, 16, 1, 1, id="prefill-window-1"),
    pytest.param([300, 200], [100, 200], 2, 2, 32, 16, 0, 150, id="prefill-window-over-tiles"),
    pytest.param([260, 90], [130, 1], 8, 2, 32, 16, 0, 100, id="prefill-gqa4-window"),
    pytest.param([100, 20, 64, 300], [30, 1, 64, 1], 8, 2, 32, 16, 3, 24, id="mixed-narrow-tiles"),
    pytest.param([50, 30, 90, 7], [2, 3, 17, 1], 16, 2, 32, 16, 1, 10, id="short-runs-gqa8"),
    pytest.param([33, 9], [1, 9], 8, 1, 32, 1, 0, 3, id="page1-mqa"),
    pytest.param([40, 17], [3, 0], 6, 2, 48, 5, 2, 12, id="odd-sizes-empty-seq"),
]


@pytest.mark.parametrize(("seq_lens", "q_lens", "hq", "hk", "d", "page", "pad", "window"), WINDOWED)
@pytest.mark.parametrize("num_splits", [1, 3])  # 3: capped where the window is one tile
def test_sliding_window(seq_lens, q_lens, hq, hk, d, page, pad, window, num_splits, device,
                        dot_dtype, gen) -> None:
    """Each row sees its last `window` positions; the positions below every row's window hold
    NaN, so a kernel reading below the window fails here."""
    batch = make_batch(
        seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hk, head_dim=d, page_size=page,
        num_padding=pad, device=device, dtype=dot_dtype, generator=gen, sliding_window=window,
    )
    run_and_check(batch, window, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [None, 1])  # the heuristic splits these in two
def test_window_covering_the_sequence_is_full_attention(num_splits, device, dot_dtype, gen) -> None:
    """W >= every sequence's length: the windowed kernels compute what the full ones do (the
    same tiles in the same order: bit for bit in the interpreter)."""
    batch = make_batch(
        [70, 17, 130, 5], [1, 17, 40, 1], num_q_heads=8, num_kv_heads=2, head_dim=32,
        page_size=16, num_padding=2, device=device, dtype=dot_dtype, generator=gen,
    )
    full = run_and_check(batch, 0, num_splits=num_splits)
    for window in (130, 10**6):
        windowed = run_and_check(batch, window, num_splits=num_splits)
        if INTERPRETED:
            assert torch.equal(windowed, full)
        else:
            assert reference.rel_error(windowed, full) < 1e-3
    decode = make_batch([70, 17, 130], [1, 1, 1], num_q_heads=8, num_kv_heads=2, head_dim=32,
                        page_size=16, device=device, dtype=dot_dtype, generator=gen)
    full = run_and_check(decode, 0, num_splits=num_splits)
    windowed = run_and_check(decode, 130, num_splits=num_splits)
    assert torch.equal(windowed, full) if INTERPRETED else reference.rel_error(windowed, full) < 1e-3


def test_window_splits_divide_the_window_not_the_context(device, dot_dtype, gen) -> None:
    """A decode graph captured at a 16k context limit with a 300-position window: the plan
    sizes its splits for the window (3 programs per KV head, not 64), each sequence's splits
    start at its own window (a 5000-token context is read by 3 programs, 37 tokens by one), and
    nothing below a window is read (those positions hold NaN)."""
    from services.engine.kernels.attention import MIN_SPLIT_TOKENS

    window, seq_lens = 300, [5000, 37, 300, 301]
    batch = make_batch(
        seq_lens, [1] * 4, num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=16,
        device=device, dtype=dot_dtype, generator=gen, sliding_window=window,
    )
    batch = dataclasses.replace(batch, meta=dataclasses.replace(batch.meta, max_seq_len=16384))
    plan = plan_attention(num_tokens=4, num_seqs=4, num_q_heads=4, num_kv_heads=2, head_dim=32,
                          max_query_len=1, max_seq_len=16384, num_sms=132,
                          sliding_window=window)
    assert (plan.num_splits, plan.split_len, plan.sliding_window) == (3, 128, window)
    scratch = AttentionScratch.allocate(4, 4, 32, device)
    scratch.partial_lse.fill_(float("nan"))
    run_and_check(batch, window, scratch=scratch)
    lse = scratch.partial_lse[: 4 * 4 * plan.num_splits].view(4, 4, plan.num_splits)
    used = torch.isfinite(lse) & (lse > float("-inf"))
    for row, seq_len in enumerate(seq_lens):  # the splits divide [seq_len - W, seq_len)
        expect = -(-min(seq_len, window) // MIN_SPLIT_TOKENS)
        assert used[row].sum(dim=-1).tolist() == [expect] * 4


@pytest.mark.parametrize("bad", [-1, 2.5, True, "64"])
def test_bad_window_is_a_validation_error(bad, device) -> None:
    batch = make_batch([5], [1], num_q_heads=2, num_kv_heads=1, head_dim=16, page_size=16,
                       device=device, dtype=torch.float16)
    with pytest.raises(ValidationError, match="sliding_window"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, 0.25, bad)


def test_window_plans() -> None:
    """The split plan of a windowed launch covers W + a block's rows - 1 positions whatever the
    context; a window wider than the context changes nothing."""
    common = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, num_sms=132)
    decode = plan_attention(num_tokens=1, num_seqs=1, max_query_len=1, max_seq_len=32768,
                            sliding_window=4096, **common)
    assert decode.num_splits * decode.split_len >= 4096
    assert (decode.num_splits - 1) * decode.split_len < 4096  # no split past the window
    prefill = plan_attention(num_tokens=4096, num_seqs=1, max_query_len=4096, max_seq_len=32768,
                             sliding_window=512, num_splits=64, **common)
    span = 512 + prefill.block_q - 1
    assert prefill.num_splits * prefill.split_len >= span
    assert (prefill.num_splits - 1) * prefill.split_len < span
    for max_query_len, max_seq_len in ((1, 300), (200, 300)):
        sized = dict(num_tokens=max_query_len, num_seqs=1, max_query_len=max_query_len,
                     max_seq_len=max_seq_len, **common)
        wide = plan_attention(sliding_window=1000, **sized)
        assert dataclasses.replace(wide, sliding_window=0) == plan_attention(**sized)


def test_plan_is_a_function_of_host_sizes() -> None:
    decode = plan_attention(
        num_tokens=1, num_seqs=1, num_q_heads=32, num_kv_heads=8, head_dim=128,
        max_query_len=1, max_seq_len=8192, num_sms=132,
    )
    assert decode.block_q == 1 and decode.num_splits > 1
    assert decode.split_len % decode.block_n == 0
    assert decode.split_len * decode.num_splits >= 8192
    busy = plan_attention(
        num_tokens=256, num_seqs=256, num_q_heads=32, num_kv_heads=8, head_dim=128,
        max_query_len=1, max_seq_len=8192, num_sms=132,
    )
    assert busy.num_splits == 1
    prefill = plan_attention(
        num_tokens=4096, num_seqs=2, num_q_heads=32, num_kv_heads=8, head_dim=128,
        max_query_len=4000, max_seq_len=4000, num_sms=132,
    )
    assert prefill.block_q * 4 <= prefill.block_m and prefill.num_splits == 1
    assert (prefill.small_block_q, prefill.small_block_m) == (4, 16)  # decode rows in a mixed step


# ---- the full matrix: GPU only ----

def _random_lens(gen: torch.Generator, n: int, low: int, high: int) -> list[int]:
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


GPU_SHAPES = [  # (q heads, kv heads, head dim)
    (32, 32, 128), (32, 8, 128), (64, 8, 128), (16, 16, 64), (16, 4, 64), (32, 4, 64),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hk", "d"), GPU_SHAPES)
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("batch_size", [1, 16, 256])
@pytest.mark.parametrize("window", [0, 700])
def test_decode_matrix(hq, hk, d, page, batch_size, window, device, gen) -> None:
    high = 5000 if batch_size <= 16 else 1200
    seq_lens = _random_lens(gen, batch_size, 1, high)
    batch = make_batch(
        seq_lens, [1] * batch_size, num_q_heads=hq, num_kv_heads=hk, head_dim=d, page_size=page,
        num_padding=3, device=device, generator=gen, sliding_window=window,
    )
    run_and_check(batch, window)


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hk", "d"), GPU_SHAPES)
@pytest.mark.parametrize("page", [16, 64])
@pytest.mark.parametrize("window", [0, 100, 1000])
def test_prefill_ragged_with_cached_prefix(hq, hk, d, page, window, device, gen) -> None:
    n = 9
    q_lens = _random_lens(gen, n, 1, 700)
    prefix = _random_lens(gen, n, 0, 2500)
    batch = make_batch(
        [q + p for q, p in zip(q_lens, prefix, strict=True)], q_lens, num_q_heads=hq,
        num_kv_heads=hk, head_dim=d, page_size=page, num_padding=5, device=device, generator=gen,
        sliding_window=window,
    )
    run_and_check(batch, window)


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hk", "d"), [(32, 8, 128), (16, 16, 64)])
@pytest.mark.parametrize("window", [0, 512])
def test_mixed_prefill_and_decode(hq, hk, d, window, device, gen) -> None:
    decode_lens = _random_lens(gen, 200, 1, 3000)
    prefill_q = _random_lens(gen, 4, 2, 900)
    prefill_prefix = _random_lens(gen, 4, 0, 1000)
    seq_lens = decode_lens + [q + p for q, p in zip(prefill_q, prefill_prefix, strict=True)]
    q_lens = [1] * len(decode_lens) + prefill_q
    order = torch.randperm(len(seq_lens), generator=gen).tolist()
    batch = make_batch(
        [seq_lens[i] for i in order], [q_lens[i] for i in order], num_q_heads=hq,
        num_kv_heads=hk, head_dim=d, page_size=16, num_padding=7, device=device, generator=gen,
        sliding_window=window,
    )
    run_and_check(batch, window)


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [1, 63, 64, 65, 4096, 8191])
@pytest.mark.parametrize("num_splits", [None, 1, 7, 64])
@pytest.mark.parametrize("window", [0, 1, 100, 4096])
def test_long_context_splits(seq_len, num_splits, window, device, gen) -> None:
    batch = make_batch(
        [seq_len, max(1, seq_len // 3)], [1, 1], num_q_heads=32, num_kv_heads=8, head_dim=128,
        page_size=16, device=device, generator=gen, sliding_window=window,
    )
    run_and_check(batch, window, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("window", [0, 1000])
def test_cuda_graph_replay_with_new_lengths(window, device, gen) -> None:
    """Captured once at a capacity (max_seq_len 4096, split-K, preallocated scratch), replayed
    after the batch's lengths, pages and queries change in place; with a window the positions
    below each row's window hold NaN."""
    hq, hk, d, page, bsz, cap = 32, 8, 128, 16, 8, 4096
    first, static = (
        make_batch(_random_lens(gen, bsz, 1, cap), [1] * bsz, num_q_heads=hq, num_kv_heads=hk,
                   head_dim=d, page_size=page, device=device, generator=gen, spare_pages=300,
                   sliding_window=window)
        for _ in range(2))
    meta = first.meta
    page_table = torch.full((bsz, cap // page), -1, dtype=torch.int32, device=device)
    meta = type(meta)(meta.query_start_loc, meta.seq_lens.clone(), page_table, meta.slot_mapping, 1, cap)
    num_pages = max(first.k_cache.shape[0], static.k_cache.shape[0])
    k_cache = torch.full((num_pages, page, hk, d), float("nan"), dtype=first.k_cache.dtype, device=device)
    v_cache = torch.full_like(k_cache, float("nan"))
    q = first.q.clone()
    scratch = AttentionScratch.allocate(bsz, hq, d, device)
    out = torch.empty_like(q)
    scale = d ** -0.5

    def load(b: PagedBatch) -> None:
        q.copy_(b.q)
        k_cache[: b.k_cache.shape[0]].copy_(b.k_cache)
        v_cache[: b.v_cache.shape[0]].copy_(b.v_cache)
        meta.seq_lens.copy_(b.meta.seq_lens)
        page_table.fill_(-1)
        page_table[:, : b.meta.page_table.shape[1]].copy_(b.meta.page_table)

    plan = plan_attention(num_tokens=bsz, num_seqs=bsz, num_q_heads=hq, num_kv_heads=hk, head_dim=d,
                          max_query_len=1, max_seq_len=cap, num_sms=132, sliding_window=window)
    assert plan.num_splits > 1  # the split-K path (kernel + reduction) is what gets captured
    load(first)
    stream = torch.cuda.Stream()
    with graph_launches():                   # PDL, as in the engine's decode graphs
        with torch.cuda.stream(stream):
            paged_attention(q, k_cache, v_cache, meta, scale, window, out=out, scratch=scratch)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            paged_attention(q, k_cache, v_cache, meta, scale, window, out=out, scratch=scratch)
    for b in (first, static):
        load(b)
        out.fill_(float("nan"))
        graph.replay()
        view = PagedBatch(q, k_cache[: b.k_cache.shape[0]], v_cache[: b.v_cache.shape[0]], b.meta,
                          b.q_lens, b.seq_lens, 0)
        ref = reference.paged_attention(view, scale, window)
        assert torch.isfinite(out).all()
        assert reference.row_rel_errors(out, ref).max() < BF16_ROW
