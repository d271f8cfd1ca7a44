"""The attention kernel's page-number prefetch (`AttentionPlan.prefetch_pages`,
HELIOS_ATTENTION_PREFETCH): every unmasked tile's page numbers are loaded an iteration ahead.
Its numerics against the float64 reference on decode, split, windowed, prefill and mixed
batches (the interpreter on the CPU, the compiled kernel on a GPU), and what it is for, as the
H200 compiler makes it: double-buffered K/V copies at three stages, where the page numbers
loaded in the tile leave one buffer whatever the stages (tests/kernels/sm90_compile.py)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels import attention
from tests.kernels.batch import make_batch
from tests.kernels.test_attention import SMALL, WINDOWED, run_and_check
from tests.support.switches import env_switch


@pytest.fixture
def prefetching(monkeypatch):
    """Every plan (decode, prefill, mixed) with the prefetch and three stages."""
    plan = attention.plan_attention

    def prefetched(**sizes):
        return dataclasses.replace(plan(**sizes), prefetch_pages=True, num_stages=3)

    monkeypatch.setattr(attention, "plan_attention", prefetched)


@pytest.mark.parametrize(("seq_lens", "q_lens", "hq", "hk", "d", "page", "pad"), SMALL)
@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_prefetched_pages_match_the_reference(seq_lens, q_lens, hq, hk, d, page, pad, num_splits,
                                              prefetching, device, dot_dtype, gen) -> None:
    batch = make_batch(seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hk, head_dim=d,
                       page_size=page, num_padding=pad, device=device, dtype=dot_dtype,
                       generator=gen)
    run_and_check(batch, num_splits=num_splits)


@pytest.mark.parametrize(("seq_lens", "q_lens", "hq", "hk", "d", "page", "pad", "window"), WINDOWED)
@pytest.mark.parametrize("num_splits", [1, 3])
def test_prefetched_pages_with_a_sliding_window(seq_lens, q_lens, hq, hk, d, page, pad, window,
                                                num_splits, prefetching, device, dot_dtype,
                                                gen) -> None:
    """The positions below every row's window hold NaN: a prefetch that read a tile below it,
    or a page past the row's end, fails here."""
    batch = make_batch(seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hk, head_dim=d,
                       page_size=page, num_padding=pad, device=device, dtype=dot_dtype,
                       generator=gen, sliding_window=window)
    run_and_check(batch, window, num_splits=num_splits)


def test_the_switch_sets_decode_plans_only(monkeypatch) -> None:
    """auto (the default): the prefetch over FP8 pages only; 1: every decode plan; 0: none.
    Prefill and mixed plans never prefetch."""
    sizes = dict(num_q_heads=32, num_kv_heads=8, head_dim=128, num_sms=132, max_seq_len=2048)
    with env_switch(monkeypatch, "HELIOS_ATTENTION_PREFETCH",
                    attention.decode_prefetch) as set_switch:
        for value, bf16_on, fp8_on in (("", False, True), ("auto", False, True),
                                       ("0", False, False), ("1", True, True)):
            set_switch(value)
            decode = attention.plan_attention(num_tokens=256, num_seqs=256, max_query_len=1, **sizes)
            assert (decode.prefetch_pages, decode.num_stages) == (bf16_on, 3 if bf16_on else 2)
            assert decode.max_registers == 0
            fp8 = attention.plan_attention(num_tokens=256, num_seqs=256, max_query_len=1,
                                           kv_itemsize=1, **sizes)
            assert (fp8.prefetch_pages, fp8.num_stages, fp8.max_registers) == \
                ((True, 3, 128) if fp8_on else (False, 2, 0)), value
            for itemsize in (1, 2):
                prefill = attention.plan_attention(num_tokens=512, num_seqs=1, max_query_len=512,
                                                   kv_itemsize=itemsize, **sizes)
                assert (prefill.prefetch_pages, prefill.num_stages) == (False, 2)
        set_switch("yes")
        with pytest.raises(ValidationError, match="HELIOS_ATTENTION_PREFETCH='yes'"):
            attention.decode_prefetch()


@pytest.mark.parametrize("num_splits", [None, 1, 3])
def test_the_default_prefetches_fp8_pages_with_sinks_and_a_window(num_splits, monkeypatch,
                                                                  device, dot_dtype, gen) -> None:
    """gpt-oss's decode over FP8 pages (sinks, a sliding window, a padding row): the default
    plan (auto) takes the prefetch, matches the float64 reference and gives the bits of the
    plan without it."""
    from tests.kernels.test_attention_sinks import random_sinks
    from tests.kernels.test_attention_sinks import run_and_check as check_with_sinks
    from tests.kernels.test_fp8_kv import to_fp8

    batch = to_fp8(make_batch([1, 37, 300, 9], [1, 1, 1, 1], num_q_heads=8, num_kv_heads=2,
                              head_dim=64, page_size=16, num_padding=1, device=device,
                              dtype=dot_dtype, generator=gen, sliding_window=150))
    sinks = random_sinks(8, gen, device)
    plan, plans = attention.plan_attention, []

    def recorded(**sizes):
        plans.append(plan(**sizes))
        return plans[-1]

    monkeypatch.setattr(attention, "plan_attention", recorded)
    outs = {}
    with env_switch(monkeypatch, "HELIOS_ATTENTION_PREFETCH",
                    attention.decode_prefetch) as set_switch:
        for value in ("0", "auto"):
            set_switch(value)
            outs[value] = check_with_sinks(batch, sinks, 150, num_splits=num_splits)
    assert [p.prefetch_pages for p in plans] == [False, True]
    assert torch.equal(outs["0"], outs["auto"])


SM90_CODE = """
import json, torch
from tests.kernels.sm90_compile import (attention_variant, compile_launch,
                                      qwen3_8b_decode_attention, report)
rows = []
for kv_dtype in (torch.bfloat16, torch.float8_e4m3fn):   # the Qwen3-8B decode step at batch 256
    decode = qwen3_8b_decode_attention(256, 1536, kv_dtype)
    for prefetch in (False, True):
        for stages in (2, 3):
            launch = attention_variant(decode, prefetch, stages)
            compiled = compile_launch(launch)
            r = report("decode", compiled)
            rows.append([str(kv_dtype), prefetch, stages, r.registers, r.local_loads, r.shared_bytes,
                         sorted(set(r.async_waits))])
print(json.dumps(rows))
"""


def test_prefetch_double_buffers_the_decode_tiles_for_sm90():
    """Compiled for the H200 at the Qwen3-8B b256 decode tile (bf16 and FP8 pages): with the
    page numbers loaded in the tile, K/V get one buffer at 2 and 3 stages and every wait is
    for all copies (`num = 0`); with the prefetch at 3 stages the shared memory holds two
    K/V tiles and the main loop's wait leaves the next tile's copies in flight."""
    from tests.kernels.test_package import compiled_json

    rows = compiled_json(SM90_CODE)
    assert len(rows) == 8
    shared = {}
    for kv_dtype, prefetch, stages, registers, local_loads, shared_bytes, waits in rows:
        assert local_loads == 0, f"{kv_dtype} prefetch={prefetch} s{stages}: spills"
        shared[kv_dtype, prefetch, stages] = shared_bytes
        if not prefetch:
            assert waits == [0], (kv_dtype, stages, waits)
        if prefetch and stages == 3:
            assert max(waits) >= 2, (kv_dtype, waits)
            assert registers <= 168, (kv_dtype, registers)
    for kv_dtype, tile in (("torch.bfloat16", 2 * 64 * 128 * 2), ("torch.float8_e4m3fn", 2 * 64 * 128)):
        single = shared[kv_dtype, False, 2]
        assert shared[kv_dtype, False, 3] < single + tile // 2, (kv_dtype, shared)  # no K/V buffer
        assert shared[kv_dtype, True, 3] >= single + tile, (kv_dtype, shared)  # a second K/V tile


@pytest.mark.gpu
@pytest.mark.parametrize("pages", ["bf16", "fp8"])
@pytest.mark.parametrize(("batch_size", "high", "window"), [(1, 5000, 0), (16, 3000, 700),
                                                            (256, 1600, 0)])
def test_prefetch_gives_the_same_bits_at_real_shapes(pages, batch_size, high, window, device,
                                                     gen) -> None:
    """Qwen3-8B's decode heads (32 / 8, D = 128) over random lengths: the prefetching plan
    (3 stages) reads the same tiles in the same order as the default one, so the outputs are
    equal bit for bit, over bf16 and e4m3 pages, split (batch 1, 16) and unsplit (256)."""
    from tests.kernels.test_attention import _random_lens
    from tests.kernels.test_fp8_kv import to_fp8

    batch = make_batch(_random_lens(gen, batch_size, 1, high), [1] * batch_size,
                       num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                       num_padding=2, device=device, generator=gen, sliding_window=window)
    if pages == "fp8":
        batch = to_fp8(batch)
    scale = 128 ** -0.5
    meta = batch.meta
    default = attention.plan_attention(
        num_tokens=batch.q.shape[0], num_seqs=meta.seq_lens.shape[0], num_q_heads=32,
        num_kv_heads=8, head_dim=128, max_query_len=1, max_seq_len=int(meta.max_seq_len),
        num_sms=attention.sm_count(device), sliding_window=window)
    outs = []
    for plan in (default, dataclasses.replace(default, prefetch_pages=True, num_stages=3)):
        out = torch.full_like(batch.q, float("nan"))
        attention.launch(batch.q, batch.k_cache, batch.v_cache, meta, scale, out, plan)
        outs.append(out)
    assert torch.equal(outs[0], outs[1])


def test_a_register_cap_reaches_the_launch(gen, monkeypatch) -> None:
    """AttentionPlan.max_registers > 0 launches with Triton's `maxnreg`; 0 (every plan
    plan_attention makes) launches without the keyword, so its compilations are the ones
    before the field."""
    launches: list[dict[str, object]] = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: launches.append(kwargs)

    monkeypatch.setattr(attention, "_paged_attention_kernel", Recorder())
    batch = make_batch([70, 9], [1, 1], num_q_heads=8, num_kv_heads=2, head_dim=32,
                       page_size=16, generator=gen)
    plan = attention.plan_attention(num_tokens=2, num_seqs=2, num_q_heads=8, num_kv_heads=2,
                                    head_dim=32, max_query_len=1, max_seq_len=70, num_sms=132)
    out = torch.empty_like(batch.q)
    for cap in (0, 128):
        attention.launch(batch.q, batch.k_cache, batch.v_cache, batch.meta, 0.1, out,
                         dataclasses.replace(plan, max_registers=cap, num_splits=1))
    assert "maxnreg" not in launches[0] and launches[1]["maxnreg"] == 128
