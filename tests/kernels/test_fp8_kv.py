"""FP8 KV pages (kv_cache_dtype fp8): the KV write (plain and per-head scaled) and the fused
prologue store e4m3 values, and paged attention reads e4m3 pages in decode, prefill and mixed
launches, split and unsplit, against float64 references over the same e4m3 values. Triton's
interpreter on a CPU machine (fp16 operands for tl.dot there), compiled on a GPU."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from services.engine.model import ops
from tests.kernels import reference
from tests.kernels.batch import make_batch

E4M3 = torch.float8_e4m3fn


def to_fp8(batch):
    """The batch with its pages in e4m3 (NaN poison kept)."""
    return dataclasses.replace(batch, k_cache=batch.k_cache.float().clamp(-448, 448).to(E4M3),
                               v_cache=batch.v_cache.float().clamp(-448, 448).to(E4M3))


@pytest.mark.parametrize("scaled", [False, True])
def test_write_kv_fp8_bits(scaled, device, gen):
    from services.engine.kernels.kv_write import write_kv

    k = (torch.randn(6, 4, 32, generator=gen) * 150).to(torch.bfloat16)   # some past 448
    v = torch.randn(6, 4, 32, generator=gen).to(torch.bfloat16)
    slots = torch.tensor([3, -1, 17, 8, 0, 30])
    scales = (torch.tensor([0.5, 1.0, 2.0, 0.25]), torch.tensor([0.01, 0.1, 1.0, 3.0])) \
        if scaled else None
    kernel_pages = [torch.zeros(8, 4, 4, 32, dtype=E4M3, device=device) for _ in range(2)]
    ref_pages = [torch.zeros(8, 4, 4, 32, dtype=E4M3) for _ in range(2)]
    write_kv(k.to(device), v.to(device), *kernel_pages, slots.to(device),
             kv_scales=None if scales is None else tuple(s.to(device) for s in scales))
    ops.reference_write_kv(k, v, *ref_pages, slots, scales)
    for got, want in zip(kernel_pages, ref_pages, strict=True):
        assert torch.equal(got.cpu().view(torch.uint8), want.view(torch.uint8))
    # the reference itself: value / scale, clamped, rounded to nearest even
    flat = ref_pages[0].view(-1, 4, 32).float()
    expect = (k.float() / (scales[0][:, None] if scales else 1)).clamp(-448, 448)
    assert torch.equal(flat[slots[slots >= 0]], expect[slots >= 0].to(E4M3).float())
    assert float(flat.abs().max()) == 448.0   # saturated, not NaN


def test_prologue_writes_fp8_pages(device, gen):
    from services.engine.kernels.prologue import qkv_prologue
    from services.engine.model.config import ModelConfig
    from services.engine.model.rope import build_cos_sin_cache

    config = ModelConfig.from_dict({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 1, "vocab_size": 64, "max_position_embeddings": 64,
        "rms_norm_eps": 1e-6})
    table = build_cos_sin_cache(config, 64, "cpu", config.rope)
    qkv = torch.randn(5, 4 * 16 + 2 * 2 * 16, generator=gen).to(torch.float16)
    positions = torch.tensor([0, 1, 2, 7, 9])
    slots = torch.tensor([4, 5, 6, -1, 11])
    # the kernel's pages made on its device (a copy made by .to() would not see its writes)
    pages = [torch.zeros(4, 4, 2, 16, dtype=E4M3, device=device) for _ in range(2)]
    pages += [torch.zeros(4, 4, 2, 16, dtype=E4M3) for _ in range(2)]
    qkv_prologue(qkv.to(device), None, None, 1e-6, positions.to(device), table.to(device), True,
                 pages[0], pages[1], slots.to(device), 4, 2)
    ops.composed_qkv_prologue(qkv, None, None, 1e-6, positions, table, True, pages[2], pages[3],
                              slots, 4, 2)
    for got, want in zip(pages[:2], pages[2:], strict=True):
        got, want = got.cpu().float(), want.float()
        # the fused kernel rounds once less than the composition (rotary in float32 straight
        # to the page): at most one e4m3 step apart
        assert torch.all((got - want).abs() <= want.abs() / 8 + 2 ** -9)
        assert (got == want).float().mean() > 0.8


CASES = {
    "decode": ([37, 5, 64, 100], [1, 1, 1, 1], {}),
    "decode split": ([300, 17], [1, 1], {"num_splits": 3}),
    "prefill over a prefix": ([40, 70], [40, 22], {}),
    "mixed": ([50, 9, 33], [20, 1, 1], {}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_reads_fp8_pages(case, device, dot_dtype, gen):
    from services.engine.kernels.attention import paged_attention

    seq_lens, q_lens, kwargs = CASES[case]
    batch = to_fp8(make_batch(seq_lens, q_lens, num_q_heads=8, num_kv_heads=2, head_dim=32,
                              page_size=16, dtype=dot_dtype, device=device, generator=gen,
                              num_padding=2))
    scale = 32 ** -0.5
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale, **kwargs)
    ref = reference.paged_attention(batch, scale)
    rows = sum(q_lens)
    assert out.dtype == batch.q.dtype and torch.isfinite(out[:rows]).all()
    assert reference.rel_error(out[:rows], ref[:rows]) < 1e-2
    # the torch reference path (graph-safe and CPU varlen) reads e4m3 pages too (it gathers
    # whole pages, so no NaN poison here)
    clean = to_fp8(make_batch(seq_lens, q_lens, num_q_heads=8, num_kv_heads=2, head_dim=32,
                              page_size=16, dtype=dot_dtype, generator=gen, num_padding=2,
                              poison_unused=False))
    ref = reference.paged_attention(clean, scale)
    for fn in (ops.reference_paged_attention, ops.varlen_paged_attention):
        torch_out = fn(clean.q, clean.k_cache, clean.v_cache, clean.meta, scale)
        assert reference.rel_error(torch_out[:rows], ref[:rows]) < 1e-2, fn.__name__


def test_bf16_queries_over_fp8_pages_take_f16_mmas(device, gen):
    """bf16 queries over e4m3 pages (the engine's case): the kernel runs its MMAs in f16 (q
    cast once, clamped into f16's range) and matches the float64 reference; a NaN in a query
    stays NaN in its row instead of being clamped to a finite value (PTX's min/max would
    drop it without `propagate_nan`; the interpreter's clamp keeps it either way)."""
    from services.engine.kernels.attention import paged_attention

    batch = to_fp8(make_batch([37, 5, 64], [1, 3, 1], num_q_heads=8, num_kv_heads=2,
                              head_dim=32, page_size=16, dtype=torch.bfloat16, device=device,
                              generator=gen, num_padding=2))
    batch.q[0, 0, 0] = float("nan")
    scale = 32 ** -0.5
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale)
    ref = reference.paged_attention(batch, scale)
    assert out.dtype == torch.bfloat16
    assert out[0, 0].isnan().all() and torch.isfinite(out[1:5]).all()
    assert reference.rel_error(out[1:5], ref[1:5]) < 1e-2


def test_e4m3_rounding_is_round_to_nearest_even(device):
    """Every e4m3 value, every midpoint between neighbours and its float32 neighbours on both
    sides, through the KV write's store (kernels/fp8_quant.round_e4m3): torch's cast bits."""
    from services.engine.kernels.kv_write import write_kv

    codes = torch.arange(256, dtype=torch.uint8).view(E4M3).float()
    values = codes[torch.isfinite(codes)].unique()
    mids = (values[1:] + values[:-1]) / 2
    x = torch.cat([values, mids, mids.nextafter(torch.tensor(1e9)),
                   mids.nextafter(torch.tensor(-1e9)), torch.tensor([500.0, -1e6, 1e-8])])
    x = torch.cat([x, torch.zeros(-len(x) % 64)]).view(-1, 1, 64)
    pages = [torch.zeros(len(x), 1, 1, 64, dtype=E4M3, device=device) for _ in range(2)]
    write_kv(x.to(device), x.to(device), *pages, torch.arange(len(x), device=device))
    want = x.clamp(-448, 448).to(E4M3)
    got = pages[0].cpu().view(want.shape)
    if device.type == "cuda":
        assert torch.equal(got.view(torch.uint8), want.view(torch.uint8))
    else:   # the interpreter's cast drops the sign of a zero; the values are equal
        assert torch.equal(got.float(), want.float())


def test_attention_over_fp8_pages_compiles_to_f16_mma():
    """Decode attention over e4m3 pages with bf16 queries, compiled for sm_90: the MMAs take
    f16 operands (e4m3 -> f16 is one conversion a pair; bf16 needs more), with no float-to-
    float conversion (F2F) left in the SASS and no spills; bf16 pages keep bf16 MMAs."""
    from tests.kernels.test_package import compiled_json

    code = (
        "import json, re, torch\n"
        "from services.engine.kernels.attention import paged_attention\n"
        "from tests.kernels.batch import make_batch\n"
        "from tests.kernels.sm90_compile import capture_launches, compile_launch, report, sass\n"
        "b = make_batch([1536] * 8, [1] * 8, num_q_heads=32, num_kv_heads=8, head_dim=128,\n"
        "               page_size=16, poison_unused=False)\n"
        "rows = []\n"
        "for fp8 in (False, True):\n"
        "    kc = b.k_cache.to(torch.float8_e4m3fn) if fp8 else b.k_cache\n"
        "    vc = b.v_cache.to(torch.float8_e4m3fn) if fp8 else b.v_cache\n"
        "    with capture_launches() as calls:\n"
        "        paged_attention(b.q, kc, vc, b.meta, 0.088, num_splits=1)\n"
        "    compiled = compile_launch(calls[0])\n"
        "    r = report('attention', compiled)\n"
        "    ptx = compiled.asm['ptx']\n"
        "    rows.append([fp8, r.local_loads, 'mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32' in ptx,\n"
        "                 'mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32' in ptx,\n"
        "                 len(re.findall(r'\\bF2F\\.', sass(compiled)))])\n"
        "print(json.dumps(rows))\n")
    (_, bf16_spills, bf16_f16_mma, bf16_mma, _), (_, spills, f16_mma, bf_mma, f2f) = \
        compiled_json(code)
    assert bf16_spills == 0 and bf16_mma and not bf16_f16_mma
    assert spills == 0 and f16_mma and not bf_mma and f2f == 0
