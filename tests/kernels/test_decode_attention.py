"""decode_attention (qkv_prologue + paged_attention + the split reduction in one launch) against
the unfused kernels it replaces: the same output and the same K/V cache contents, bit for bit,
at batch 1 and larger, contexts of one and several splits (forced too), a new token first in
its page, with and without QK-norm, NeoX and GPT-J pairs, GQA 1/2/4, padding rows, sliding
windows, FP8 pages; each call made twice (the ticket counters must be back at zero). Also
against the model's plain-torch ops, the eligibility rules, the ops dispatch, and the sm_90
compilation (registers, spills, the MMA operand layout and the reduction layouts the bitwise
equality rests on). The interpreter runs the small cases on a CPU machine (fp16 operands for
tl.dot there); `gpu` cases run compiled on a GPU."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from services.common.errors import UnsupportedError, ValidationError
from services.engine.kernels import fused_decode as fused
from services.engine.kernels.attention import AttentionScratch, paged_attention, plan_attention
from services.engine.kernels.common import sm_count
from services.engine.kernels.pdl import graph_launches
from services.engine.kernels.prologue import qkv_prologue
from services.engine.model import ops
from tests.kernels import reference
from tests.kernels.batch import PagedBatch, make_batch
from tests.kernels.conftest import HAS_CUDA
from tests.kernels.test_package import compiled_json
from tests.kernels.test_rotary import cos_sin_cache

EPS = 1e-6
E4M3 = torch.float8_e4m3fn


@dataclasses.dataclass
class Step:
    """A decode step's inputs: the batch (pages, metadata), qkv, norms, rotary table."""

    batch: PagedBatch
    qkv: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    positions: torch.Tensor
    table: torch.Tensor
    is_neox: bool
    hq: int
    hk: int

    @property
    def scale(self) -> float:
        return 1.0 / math.sqrt(self.batch.k_cache.shape[-1])


def make_step(seq_lens, hq, hk, d, *, device, dtype, gen, page=16, pad=0, norm=True,
              is_neox=True, window=0, fp8=False, poison=True) -> Step:
    batch = make_batch(seq_lens, [1] * len(seq_lens), num_q_heads=hq, num_kv_heads=hk,
                       head_dim=d, page_size=page, num_padding=pad, device=device, dtype=dtype,
                       generator=gen, sliding_window=window, poison_unused=poison)
    if fp8:
        batch = dataclasses.replace(
            batch, k_cache=batch.k_cache.float().clamp(-448, 448).to(E4M3),
            v_cache=batch.v_cache.float().clamp(-448, 448).to(E4M3))
    tokens = len(seq_lens) + pad
    qkv = (torch.randn(tokens, (hq + 2 * hk) * d, generator=gen) * 2).to(dtype).to(device)
    weights = [(1 + 0.3 * torch.randn(d, generator=gen)).to(dtype).to(device) if norm else None
               for _ in range(2)]
    # a decode row's position is its sequence's last; padding rows feed position 0
    positions = torch.tensor([s - 1 for s in seq_lens] + [0] * pad, device=device)
    table = cos_sin_cache(max(seq_lens) + 8, d).to(device)
    return Step(batch, qkv, weights[0], weights[1], positions, table, is_neox, hq, hk)


def caches(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    return step.batch.k_cache.clone(), step.batch.v_cache.clone()


def unfused(step: Step, window: int = 0, num_splits: int | None = None, meta=None):
    """qkv_prologue + paged_attention (the kernels the fused one replaces) on fresh caches."""
    meta = meta or step.batch.meta
    k_cache, v_cache = caches(step)
    q = qkv_prologue(step.qkv, step.q_norm, step.k_norm, EPS, step.positions, step.table,
                     step.is_neox, k_cache, v_cache, meta.slot_mapping, step.hq, step.hk)
    out = paged_attention(q, k_cache, v_cache, meta, step.scale, window, num_splits=num_splits)
    return out, k_cache, v_cache


def run_fused(step: Step, k_cache, v_cache, window=0, num_splits=None, meta=None, **kwargs):
    meta = meta or step.batch.meta
    return fused.decode_attention(
        step.qkv, step.q_norm, step.k_norm, EPS, step.positions, step.table, step.is_neox,
        k_cache, v_cache, meta.slot_mapping, meta, step.hq, step.hk, step.scale, window,
        num_splits=num_splits, **kwargs)


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits (NaN poison compares equal to itself)."""
    return t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int16)


def assert_same(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if torch.equal(bits(got), bits(want)):
        return
    diff = (got.float() - want.float()).abs().nan_to_num(float("inf"))
    raise AssertionError(f"{what}: {int((bits(got) != bits(want)).sum())} elements differ "
                         f"(max |diff| {float(diff.max()):.3g})")


def counters_at_rest(k_cache: torch.Tensor) -> bool:
    counters = fused._COUNTERS.get((str(k_cache.device), k_cache.data_ptr()))
    return counters is None or not bool(counters.any())


def check_against_unfused(step: Step, window: int = 0, num_splits: int | None = None,
                          meta=None) -> torch.Tensor:
    """The fused call, twice on the same inputs, equals the unfused kernels bit for bit (the
    output and both caches); the counters are at rest after each call."""
    want, want_k, want_v = unfused(step, window, num_splits, meta)
    k_cache, v_cache = caches(step)
    for _ in range(2):
        out = torch.full_like(want, float("nan"))
        run_fused(step, k_cache, v_cache, window, num_splits, meta, out=out)
        assert_same(out, want, "output")
        assert_same(k_cache, want_k, "k_cache")
        assert_same(v_cache, want_v, "v_cache")
        assert counters_at_rest(k_cache), "ticket counters not reset"
    pad = step.batch.num_padding
    if pad:
        assert torch.all(out[-pad:] == 0), "padding rows must come back as zeros"
    return out


def splits_of(step: Step, window: int = 0, num_splits: int | None = None) -> int:
    meta = step.batch.meta
    return plan_attention(num_tokens=step.qkv.shape[0], num_seqs=meta.seq_lens.shape[0],
                          num_q_heads=step.hq, num_kv_heads=step.hk,
                          head_dim=step.batch.k_cache.shape[-1], max_query_len=1,
                          max_seq_len=meta.max_seq_len, num_sms=sm_count(step.qkv.device),
                          num_splits=num_splits,
                          sliding_window=window).num_splits


# ---- small cases: every machine (the interpreter on a CPU) ----

SMALL = [
    # (seq_lens, q heads, kv heads, head dim, padding rows, forced splits, window)
    pytest.param([1], 4, 4, 32, 0, None, 0, id="b1-first-token-mha"),
    pytest.param([17], 4, 2, 32, 0, None, 0, id="b1-new-token-first-of-page-gqa2"),
    pytest.param([150], 8, 2, 32, 0, None, 0, id="b1-two-splits-gqa4"),
    pytest.param([300], 4, 2, 64, 0, 5, 0, id="b1-forced-5-splits"),
    pytest.param([129], 4, 1, 32, 1, 4, 0, id="b1-split-edge-mqa-padding"),
    pytest.param([1, 37, 150, 17], 4, 2, 32, 2, None, 0, id="b4-mixed-lengths-padding"),
    pytest.param([40, 3, 200], 8, 2, 32, 1, 1, 0, id="b3-unsplit"),
    pytest.param([64, 65, 128, 257], 4, 4, 32, 0, 3, 0, id="b4-three-splits-tile-edges"),
    pytest.param([300, 37, 129, 64], 4, 1, 32, 1, 4, 40, id="window-split"),
    pytest.param([90, 20, 7], 8, 2, 32, 0, 1, 24, id="window-unsplit"),
]


@pytest.mark.parametrize(("seq_lens", "hq", "hk", "d", "pad", "num_splits", "window"), SMALL)
@pytest.mark.parametrize(("norm", "is_neox"), [(True, True), (False, False)])
def test_matches_unfused_kernels(seq_lens, hq, hk, d, pad, num_splits, window, norm, is_neox,
                                 device, dot_dtype, gen) -> None:
    step = make_step(seq_lens, hq, hk, d, device=device, dtype=dot_dtype, gen=gen, pad=pad,
                     norm=norm, is_neox=is_neox, window=window)
    out = check_against_unfused(step, window, num_splits)
    real = len(seq_lens)
    assert torch.isfinite(out[:real]).all()


def test_cases_cover_split_and_unsplit_launches() -> None:
    """The small cases above launch both ways: one split (the kernel writes the output) and
    several (partials, tickets, the last program's merge)."""
    counts = set()
    for param in SMALL:
        seq_lens, hq, hk, d, pad, num_splits, window = param.values
        step = make_step(seq_lens, hq, hk, d, device="cpu", dtype=torch.float16,
                         gen=torch.Generator().manual_seed(0), pad=pad)
        counts.add(splits_of(step, window, num_splits) > 1)
    assert counts == {True, False}


def test_fp8_pages(device, dot_dtype, gen) -> None:
    """FP8 pages with unit scales: the new K/V stored as e4m3 (cast_for_cache) as the prologue
    stores them, the attention reads them back the same way."""
    for seq_lens, num_splits in (([300, 17], 3), ([40, 9], 1)):
        step = make_step(seq_lens, 8, 2, 32, device=device, dtype=dot_dtype, gen=gen, pad=1,
                         fp8=True)
        check_against_unfused(step, 0, num_splits)


def test_new_kv_written_once_per_token(device, dot_dtype, gen) -> None:
    """Only the new positions' slots change (every other slot, NaN poison included, keeps its
    bits), and a padding row's slot -1 writes nothing."""
    step = make_step([150, 17, 1], 4, 2, 32, device=device, dtype=dot_dtype, gen=gen, pad=2)
    k_cache, v_cache = caches(step)
    run_fused(step, k_cache, v_cache, num_splits=3)
    slots = step.batch.meta.slot_mapping
    changed = torch.zeros(k_cache.shape[0] * k_cache.shape[1], dtype=torch.bool, device=device)
    changed[slots[slots >= 0]] = True
    for new, old in ((k_cache, step.batch.k_cache), (v_cache, step.batch.v_cache)):
        flat_new, flat_old = bits(new).flatten(0, 1), bits(old).flatten(0, 1)
        assert torch.equal(flat_new[~changed], flat_old[~changed])
    v = step.qkv[:3, (step.hq + step.hk) * 32:].reshape(3, step.hk, 32)
    assert torch.equal(v_cache.flatten(0, 1)[slots[:3]], v)              # v moves bit-exact


def test_against_the_model_torch_ops(device, dot_dtype, gen) -> None:
    """Against the model's CPU path: composed_qkv_prologue (the reference norm, rotary and
    KV write) then reference_paged_attention, in the float32 the references compute in."""
    step = make_step([150, 37, 1, 64], 8, 2, 32, device=device, dtype=dot_dtype, gen=gen,
                     pad=1, poison=False)
    k_cache, v_cache = caches(step)
    out = run_fused(step, k_cache, v_cache)
    cpu = [t.cpu() if t is not None else None for t in (step.qkv, step.q_norm, step.k_norm,
                                                         step.positions, step.table)]
    meta = step.batch.meta
    meta_cpu = dataclasses.replace(meta, **{f: getattr(meta, f).cpu() for f in (
        "query_start_loc", "seq_lens", "page_table", "slot_mapping")})
    k_ref, v_ref = (c.cpu().clone() for c in caches(step))
    q = ops.composed_qkv_prologue(cpu[0], cpu[1], cpu[2], EPS, cpu[3], cpu[4], True, k_ref,
                                  v_ref, meta_cpu.slot_mapping, step.hq, step.hk)
    ref = ops.reference_paged_attention(q, k_ref, v_ref, meta_cpu, step.scale)
    real = 4
    assert reference.rel_error(out[:real].cpu(), ref[:real]) < 1e-2
    assert reference.row_rel_errors(out[:real].cpu(), ref[:real]).max() < 3e-2
    assert torch.all(out[real:] == 0)
    slots = meta_cpu.slot_mapping[:real]
    for got, want in ((k_cache, k_ref), (v_cache, v_ref)):
        got, want = got.cpu().flatten(0, 1)[slots], want.flatten(0, 1)[slots]
        assert reference.rel_error(got, want) < 1e-2


def test_eligibility(device) -> None:
    qkv = torch.zeros(2, (4 + 2 * 2) * 32, dtype=torch.float16, device=device)
    cache = torch.zeros(3, 16, 2, 32, dtype=torch.float16, device=device)
    positions = torch.zeros(2, dtype=torch.int64, device=device)
    table = cos_sin_cache(8, 32).to(device)

    def supports(qkv=qkv, cache=cache, table=table, positions=positions, **kwargs) -> bool:
        return fused.decode_attention_supports(qkv, cache, table, positions, eager=True,
                                               **kwargs)

    assert supports()
    assert supports(cache=cache.to(E4M3))
    assert not supports(table=table[:, :16])                               # partial rotary
    assert not supports(sinks=torch.zeros(4, device=device))
    assert not supports(positions=positions[None].expand(3, 2))            # mRoPE rows
    odd = torch.zeros(3, 16, 2, 48, dtype=torch.float16, device=device)
    assert not supports(cache=odd, table=cos_sin_cache(8, 48))             # head dim 48
    assert not supports(cache=cache.to(torch.bfloat16))                    # dtype mismatch
    # the model's steps: only inside graph_launches() (captures and their warm-up runs)
    assert not fused.decode_attention_supports(qkv, cache, table, positions)
    with graph_launches():
        assert fused.decode_attention_supports(qkv, cache, table, positions)


def test_bad_input(device, dot_dtype, gen) -> None:
    step = make_step([20, 5], 4, 2, 32, device=device, dtype=dot_dtype, gen=gen)
    k_cache, v_cache = caches(step)
    prefill_meta = dataclasses.replace(step.batch.meta, max_query_len=2)
    with pytest.raises(ValidationError, match="max_query_len"):
        run_fused(step, k_cache, v_cache, meta=prefill_meta)
    with pytest.raises(UnsupportedError, match="partial rotary"):
        run_fused(dataclasses.replace(step, table=step.table[:, :16]), k_cache, v_cache)
    with pytest.raises(ValidationError, match="come together"):
        run_fused(dataclasses.replace(step, k_norm=None), k_cache, v_cache)
    with pytest.raises(ValidationError, match="qkv"):
        run_fused(dataclasses.replace(step, hq=3), k_cache, v_cache)
    with pytest.raises(ValidationError, match="sliding_window"):
        run_fused(step, k_cache, v_cache, window=-1)


def test_counters_grow_and_keep_the_old_buffer(device) -> None:
    """Counters per KV cache: allocated zeroed, grown by a call that needs more (the replaced
    buffer stays referenced: a captured graph may still use it)."""
    cache = torch.zeros(2, 16, 2, 32, device=device)
    first = fused.ticket_counters(cache, 10)
    assert first.numel() >= 10 and not first.any()
    assert fused.ticket_counters(cache, 10) is first
    grown = fused.ticket_counters(cache, first.numel() + 1)
    assert grown.numel() > first.numel() and not grown.any()
    assert any(old is first for old in fused._RETIRED)
    other = fused.ticket_counters(torch.zeros_like(cache), 10)
    assert other is not grown                       # another cache, its own counters


def test_ops_dispatch(monkeypatch, device, dot_dtype, gen) -> None:
    """ops.decode_attention: None off CUDA, in eager steps (outside graph_launches), for
    prefill steps, sinks, per-head KV scales, or with HELIOS_FUSED_DECODE_ATTENTION=0 (the
    caller then runs the two unfused ops); in a graph's launches on CUDA the fused kernel's
    output."""
    step = make_step([20, 5], 4, 2, 32, device=device, dtype=dot_dtype, gen=gen)
    meta = step.batch.meta

    def call(**kwargs):
        k_cache, v_cache = caches(step)
        args = dict(meta=meta, sinks=None, kv_scales=None) | kwargs
        return ops.decode_attention(step.qkv, step.q_norm, step.k_norm, EPS, step.positions,
                                    step.table, True, k_cache, v_cache, args["meta"], 4, 2,
                                    step.scale, 0, args["sinks"], args["kv_scales"])

    ops.fused_decode_attention_kernel.cache_clear()
    try:
        assert call() is None                   # an eager step keeps the unfused kernels
        with graph_launches():                  # a graph's warm-up run (or its capture)
            got = call()
        if HAS_CUDA:
            assert got is not None
            assert_same(got, unfused(step)[0], "ops.decode_attention")
        else:
            assert got is None
        ones = torch.ones(2, device=device)
        with graph_launches():
            assert call(meta=dataclasses.replace(meta, max_query_len=2)) is None
            assert call(sinks=torch.zeros(4, device=device)) is None
            assert call(kv_scales=(ones, ones)) is None
            monkeypatch.setenv("HELIOS_FUSED_DECODE_ATTENTION", "0")
            ops.fused_decode_attention_kernel.cache_clear()
            assert ops.fused_decode_attention_kernel() is None and call() is None
    finally:
        monkeypatch.delenv("HELIOS_FUSED_DECODE_ATTENTION", raising=False)
        ops.fused_decode_attention_kernel.cache_clear()


# ---- sm_90 compilation (no GPU needed) ----

SM90_CODE = """
import dataclasses, json, re
import torch
from tests.kernels.sm90_compile import capture_launches, compile_launch, report
from tests.kernels.batch import make_batch
from services.engine.kernels.attention import paged_attention
from services.engine.kernels.fused_decode import decode_attention
from services.engine.kernels.prologue import qkv_prologue

def layouts(ttgir, pattern):
    defs = dict(re.findall(r"^(#\\w+) = (.*)$", ttgir, re.M))
    found = set()
    for shape, enc in re.findall(pattern, ttgir):
        found.add((shape, defs.get(enc, enc)))
    return found

REDUCE = r"\\}\\) : \\(tensor<([\\dx]+)xf32, (#\\w+)>\\)"
KWIDTH = r"(tensor<\\d+x\\d+xbf16), #ttg.dot_op<\\{opIdx = \\d, parent = #mma, (kWidth = \\d)"
rows = []
for label, hq, hk in (("qwen3-0.6b", 16, 8), ("qwen3-8b", 32, 8)):
    d = 128
    for tokens, splits, window in ((1, None, 0), (4, 8, 0), (64, 1, 0), (1, None, 1024)):
        batch = make_batch([300] * tokens, [1] * tokens, num_q_heads=hq, num_kv_heads=hk,
                           head_dim=d, page_size=16, poison_unused=False)
        batch = dataclasses.replace(batch, meta=dataclasses.replace(batch.meta,
                                                                    max_seq_len=4096))
        qkv = torch.randn(tokens, (hq + 2 * hk) * d, dtype=torch.bfloat16)
        w = torch.randn(d, dtype=torch.bfloat16)
        table = torch.randn(4096, d)
        with capture_launches() as launches:
            decode_attention(qkv, w, w, 1e-6, torch.arange(tokens), table, True, batch.k_cache,
                             batch.v_cache, batch.meta.slot_mapping, batch.meta, hq, hk, 0.088,
                             window, num_splits=splits)
            q = qkv_prologue(qkv, w, w, 1e-6, torch.arange(tokens), table, True, batch.k_cache,
                             batch.v_cache, batch.meta.slot_mapping, hq, hk)
            paged_attention(q, batch.k_cache, batch.v_cache, batch.meta, 0.088, window,
                            num_splits=splits)
        fused, prologue, attention = launches[0], launches[1], launches[2]
        reduction = launches[3] if len(launches) > 3 else None
        ir = {}
        for name, launch in (("fused", fused), ("prologue", prologue),
                             ("attention", attention), ("reduction", reduction)):
            if launch is None:
                continue
            pdl = dataclasses.replace(launch, kwargs={**launch.kwargs, "PDL": True})
            compiled = compile_launch(pdl)
            ir[name] = compiled.asm["ttgir"]
            if name == "fused":
                r = report(name, compiled)
                ptx = compiled.asm["ptx"]
        split = fused.kwargs["IS_SPLIT"]
        unfused_reduces = layouts(ir["prologue"], REDUCE) | layouts(ir["attention"], REDUCE)
        if reduction is not None:
            unfused_reduces |= layouts(ir["reduction"], REDUCE)
        rows.append(dict(
            name=f"{label} T={tokens} split={split} W={window}", registers=r.registers,
            spills=r.local_loads, stack=r.stack_bytes, mma=r.mma,
            waits="griddepcontrol.wait" in ptx, atomic="atom.global.gpu.acq_rel" in ptx,
            cg_loads="ld.global.cg" in ptx, split=split,
            kwidth_same=sorted(set(re.findall(KWIDTH, ir["fused"])))
                == sorted(set(re.findall(KWIDTH, ir["attention"]))),
            reduces_unmatched=sorted(map(str, layouts(ir["fused"], REDUCE) - unfused_reduces))))
print(json.dumps(rows))
"""


def test_compiles_for_sm90_without_spills() -> None:
    """Qwen3-0.6B (16/8 heads) and Qwen3-8B (32/8), D = 128: batch 1 (split), batch 4 (forced
    split), batch 64 (unsplit), a sliding window; with PDL: no spills, MMA, griddepcontrol's
    wait, the ticket atomic and the L1-bypassing partial loads when split. And what the
    bitwise equality with the unfused kernels rests on: the QK dot takes the unfused
    kernel's operand layout (kWidth), and every reduction (RMS sums, softmax, the split
    merge) runs on a layout one of the unfused kernels uses for it."""
    rows = compiled_json(SM90_CODE)
    assert len(rows) == 8
    for row in rows:
        name = row["name"]
        print(f"{name}: {row['registers']} registers, {row['spills']} spilled loads")
        assert row["spills"] == 0 and row["stack"] == 0, f"{name}: spills ({row})"
        assert row["registers"] <= fused.MAX_REGISTERS
        assert row["mma"], f"{name}: no tensor-core MMA"
        assert row["waits"], f"{name}: no griddepcontrol.wait"
        if row["split"]:
            assert row["atomic"] and row["cg_loads"], f"{name}: no ticket / merge"
        assert row["kwidth_same"], f"{name}: another MMA operand layout than the unfused kernel"
        assert row["reduces_unmatched"] == [], f"{name}: {row['reduces_unmatched']}"
    assert {row["split"] for row in rows} == {True, False}


# ---- the GPU matrix ----

GPU_SHAPES = [(16, 8, 128), (32, 8, 128), (32, 32, 128), (16, 4, 64)]   # 0.6B, 8B, MHA, GQA 4


@pytest.mark.gpu
@pytest.mark.parametrize(("hq", "hk", "d"), GPU_SHAPES)
@pytest.mark.parametrize("batch_size", [1, 4, 64, 256])
@pytest.mark.parametrize("window", [0, 700])
def test_gpu_matrix(hq, hk, d, batch_size, window, device, gen) -> None:
    high = 5000 if batch_size <= 4 else 1500
    seq_lens = torch.randint(1, high + 1, (batch_size,), generator=gen).tolist()
    seq_lens[0] = 17 if batch_size > 1 else seq_lens[0]    # a new token first of its page
    step = make_step(seq_lens, hq, hk, d, device=device, dtype=torch.bfloat16, gen=gen,
                     pad=3, window=window)
    check_against_unfused(step, window)


@pytest.mark.gpu
@pytest.mark.parametrize("seq_len", [1, 16, 17, 63, 64, 65, 128, 129, 384, 4097, 8191])
@pytest.mark.parametrize("num_splits", [None, 1, 7, 64])
@pytest.mark.parametrize(("hq", "norm", "is_neox"), [(16, True, True), (32, True, True),
                                                      (32, False, False)])
def test_gpu_contexts_and_splits(seq_len, num_splits, hq, norm, is_neox, device, gen) -> None:
    step = make_step([seq_len, max(1, seq_len // 3)], hq, 8, 128, device=device,
                     dtype=torch.bfloat16, gen=gen, pad=1, norm=norm, is_neox=is_neox)
    check_against_unfused(step, 0, num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("num_splits", [None, 1])
def test_gpu_fp8_pages(num_splits, device, gen) -> None:
    step = make_step([4000, 300, 17], 32, 8, 128, device=device, dtype=torch.bfloat16, gen=gen,
                     pad=2, fp8=True)
    check_against_unfused(step, 0, num_splits)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize(("bsz", "window"), [(1, 0), (8, 0), (8, 1000), (64, 0)])
def test_gpu_graph_replay(bsz, window, device, gen) -> None:
    """Captured with PDL at a 4096 context limit (split-K at small batches: the tickets),
    replayed three times over new lengths, pages and qkv copied in place: each replay equals
    the unfused kernels bit for bit and leaves the counters at zero. Capturing over a KV cache
    whose counters do not exist yet is refused (the eager warm-up allocates them)."""
    hq, hk, d, cap = 16, 8, 128, 4096
    steps = [make_step(torch.randint(1, cap + 1, (bsz,), generator=gen).tolist(), hq, hk, d,
                       device=device, dtype=torch.bfloat16, gen=gen, pad=2, window=window)
             for _ in range(3)]
    pages = max(s.batch.k_cache.shape[0] for s in steps)
    width = cap // 16
    live = dict(
        qkv=steps[0].qkv.clone(), positions=steps[0].positions.clone(),
        k=torch.zeros(pages, 16, hk, d, dtype=torch.bfloat16, device=device),
        v=torch.zeros(pages, 16, hk, d, dtype=torch.bfloat16, device=device),
        table=torch.zeros(bsz, width, dtype=torch.int32, device=device),
        seq_lens=steps[0].batch.meta.seq_lens.clone(),
        slots=steps[0].batch.meta.slot_mapping.clone())
    meta = dataclasses.replace(steps[0].batch.meta, seq_lens=live["seq_lens"],
                               page_table=live["table"], slot_mapping=live["slots"],
                               max_seq_len=cap)
    rope = cos_sin_cache(cap + 8, d).to(device)
    out = torch.empty(bsz + 2, hq, d, dtype=torch.bfloat16, device=device)
    scratch = AttentionScratch.allocate(bsz + 2, hq, d, device)

    def load(step: Step) -> None:
        live["qkv"].copy_(step.qkv)
        live["positions"].copy_(step.positions)
        live["k"].zero_()
        live["v"].zero_()
        live["k"][: step.batch.k_cache.shape[0]].copy_(step.batch.k_cache.nan_to_num())
        live["v"][: step.batch.v_cache.shape[0]].copy_(step.batch.v_cache.nan_to_num())
        live["seq_lens"].copy_(step.batch.meta.seq_lens)
        live["table"].zero_()
        live["table"][:, : step.batch.meta.page_table.shape[1]].copy_(
            step.batch.meta.page_table.clamp(min=0))
        live["slots"].copy_(step.batch.meta.slot_mapping)

    def call() -> None:
        fused.decode_attention(live["qkv"], steps[0].q_norm, steps[0].k_norm, EPS,
                               live["positions"], rope, True, live["k"], live["v"],
                               live["slots"], meta, hq, hk, steps[0].scale, window,
                               out=out, scratch=scratch)

    split = splits_of(dataclasses.replace(steps[0], batch=dataclasses.replace(
        steps[0].batch, meta=meta)), window) > 1
    if split:   # a capture cannot allocate the counters
        fused._COUNTERS.pop((str(live["k"].device), live["k"].data_ptr()), None)
        with pytest.raises(UnsupportedError, match="captured"):
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                call()
    load(steps[0])
    stream = torch.cuda.Stream()
    with graph_launches():
        with torch.cuda.stream(stream):
            call()                                       # the warm-up: compiles, allocates
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    for step in steps:
        load(step)
        reference_step = dataclasses.replace(
            step, qkv=live["qkv"], positions=live["positions"], table=rope,
            q_norm=steps[0].q_norm, k_norm=steps[0].k_norm,
            batch=dataclasses.replace(step.batch, k_cache=live["k"].clone(),
                                      v_cache=live["v"].clone(), meta=meta))
        want, want_k, want_v = unfused(reference_step, window)
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_same(out, want, "replayed output")
        assert_same(live["k"], want_k, "replayed k_cache")
        assert_same(live["v"], want_v, "replayed v_cache")
        assert counters_at_rest(live["k"])
