"""paged_attention with attention sinks (gpt-oss: one learned logit per query head in the
softmax denominator) against a float64 reference: unsplit and split launches (the sink joins
in the reduction), decode, prefill over a cached prefix, mixed batches with padding rows, with
and without a sliding window (gpt-oss's sliding layers have both). Small cases run through the
interpreter on the CPU; the `gpu` cases at gpt-oss-20b's heads (64 query, 8 KV, D = 64)."""

from __future__ import annotations

import math

import pytest
import torch

from services.common.errors import UnsupportedError, ValidationError
from services.engine.kernels.attention import AttentionScratch, paged_attention
from tests.kernels import reference
from tests.kernels.batch import PagedBatch, make_batch
from tests.kernels.conftest import HAS_CUDA

BF16_TOTAL = 1e-2
BF16_ROW = 3e-2


def run_and_check(batch: PagedBatch, sinks: torch.Tensor, sliding_window: int = 0,
                  **kwargs: object) -> torch.Tensor:
    scale = 1.0 / math.sqrt(batch.q.shape[-1])
    out = torch.full_like(batch.q, float("nan"))
    paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale, sliding_window,
                    sinks=sinks, out=out, **kwargs)
    ref = reference.paged_attention(batch, scale, sliding_window, sinks)
    assert torch.isfinite(out).all(), "unwritten or NaN output rows"
    real = sum(batch.q_lens)
    assert torch.all(out[real:] == 0), "padding rows must come back as zeros"
    if real:
        assert reference.rel_error(out[:real], ref[:real]) < BF16_TOTAL
        assert reference.row_rel_errors(out[:real], ref[:real]).max() < BF16_ROW
    return out


def random_sinks(num_heads: int, gen: torch.Generator, device: torch.device,
                 spread: float = 2.0) -> torch.Tensor:
    """Per-head logits around the scores' scale (a few far above: the sink takes most of the
    mass there), float32 like the model's parameter in a float32 run."""
    sinks = torch.randn(num_heads, generator=gen) * spread
    sinks[0] = 6.0
    return sinks.to(device)


SMALL = [
    # (seq_lens, q_lens, q heads, kv heads, head dim, page size, padding, window); each splits
    # when asked for 3 (the KV span a block sees is over 64 positions)
    pytest.param([1, 37, 150], [1, 1, 1], 8, 2, 64, 16, 0, 0, id="decode-gqa4"),
    pytest.param([140, 17, 9, 3], [1, 0, 1, 0], 4, 4, 32, 16, 2, 0, id="decode-empty-seqs"),
    pytest.param([5, 130], [5, 6], 2, 2, 64, 16, 0, 0, id="prefill-mha"),
    pytest.param([200, 20, 34], [8, 1, 34], 4, 2, 32, 16, 3, 0, id="mixed-padding"),
    pytest.param([1, 37, 300, 9], [1, 1, 1, 1], 8, 1, 64, 16, 0, 150, id="decode-window"),
    pytest.param([230, 50], [6, 1], 8, 2, 32, 16, 2, 100, id="prefill-gqa4-window"),
]


@pytest.mark.parametrize(("seq_lens", "q_lens", "hq", "hk", "d", "page", "pad", "window"), SMALL)
@pytest.mark.parametrize("num_splits", [1, 3])   # 3: the sink joins in the reduction
def test_sinks(seq_lens, q_lens, hq, hk, d, page, pad, window, num_splits, device, dot_dtype,
               gen) -> None:
    batch = make_batch(seq_lens, q_lens, num_q_heads=hq, num_kv_heads=hk, head_dim=d,
                       page_size=page, num_padding=pad, device=device, dtype=dot_dtype,
                       generator=gen, sliding_window=window)
    run_and_check(batch, random_sinks(hq, gen, device), window, num_splits=num_splits)


@pytest.mark.parametrize("num_splits", [1, 3])
def test_sinks_change_the_output_and_minus_infinity_is_no_sink(num_splits, device, dot_dtype,
                                                               gen) -> None:
    """A -inf sink adds nothing: the output is the sink-free kernel's, bit for bit; finite
    sinks scale every row down (by Z / (Z + e^sink)), measurably."""
    batch = make_batch([90, 33, 1], [1, 1, 1], num_q_heads=4, num_kv_heads=2, head_dim=32,
                       page_size=16, device=device, dtype=dot_dtype, generator=gen)
    scale = 32 ** -0.5
    plain = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale,
                            num_splits=num_splits)
    none = torch.full((4,), float("-inf"), device=device)
    masked = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, scale,
                             sinks=none, num_splits=num_splits)
    assert torch.equal(masked, plain)
    sunk = run_and_check(batch, random_sinks(4, gen, device), num_splits=num_splits)
    assert reference.rel_error(sunk, plain.double()) > 0.05


# made on the device: copying a strided view to the GPU would make it contiguous
@pytest.mark.parametrize("bad", [lambda d: torch.zeros(3, device=d),
                                 lambda d: torch.zeros(4, 1, device=d),
                                 lambda d: torch.zeros(4, dtype=torch.int32, device=d),
                                 lambda d: torch.zeros(8, device=d)[::2]],
                         ids=["short", "2-d", "int32", "strided"])
def test_bad_sinks_are_refused(bad, device, dot_dtype, gen) -> None:
    batch = make_batch([9], [1], num_q_heads=4, num_kv_heads=2, head_dim=32, page_size=16,
                       device=device, dtype=dot_dtype, generator=gen)
    with pytest.raises((ValidationError, UnsupportedError), match="sinks"):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, 0.1,
                        sinks=bad(device))


def test_model_reference_paths_match_the_float64_reference(gen) -> None:
    """ops' two torch paths (graph-safe padded and per-sequence varlen) with sinks and a
    window equal the float64 reference (CPU, float32)."""
    from services.engine.model import ops

    batch = make_batch([40, 17, 9], [6, 1, 9], num_q_heads=8, num_kv_heads=2, head_dim=16,
                       page_size=4, num_padding=2, device="cpu", dtype=torch.float32,
                       generator=gen, sliding_window=5, poison_unused=False)
    sinks = random_sinks(8, gen, torch.device("cpu"))
    ref = reference.paged_attention(batch, 0.25, 5, sinks)
    real = sum(batch.q_lens)
    for fn in (ops.reference_paged_attention, ops.varlen_paged_attention):
        out = fn(batch.q, batch.k_cache, batch.v_cache, batch.meta, 0.25, 5, sinks)
        assert torch.allclose(out[:real].double(), ref[:real], atol=1e-5, rtol=1e-5), fn.__name__


# ---- GPU: gpt-oss-20b's heads (64 query, 8 KV, D = 64), its 128-token window ----


def _lens(gen: torch.Generator, n: int, low: int, high: int) -> list[int]:
    return torch.randint(low, high + 1, (n,), generator=gen).tolist()


@pytest.mark.gpu
@pytest.mark.parametrize("batch_size", [1, 16, 256])
@pytest.mark.parametrize("window", [0, 128])
@pytest.mark.parametrize("num_splits", [None, 1, 8])
def test_decode_matrix(batch_size, window, num_splits, device, gen) -> None:
    seq_lens = _lens(gen, batch_size, 1, 5000 if batch_size <= 16 else 1200)
    batch = make_batch(seq_lens, [1] * batch_size, num_q_heads=64, num_kv_heads=8, head_dim=64,
                       page_size=16, num_padding=3, device=device, generator=gen,
                       sliding_window=window)
    run_and_check(batch, random_sinks(64, gen, device).bfloat16(), window, num_splits=num_splits)


@pytest.mark.gpu
@pytest.mark.parametrize("window", [0, 128])
def test_prefill_over_cached_prefixes_mixed_with_decodes(window, device, gen) -> None:
    decode_lens = _lens(gen, 40, 1, 3000)
    q_lens = _lens(gen, 5, 2, 700)
    prefix = _lens(gen, 5, 0, 2000)
    seq_lens = decode_lens + [q + p for q, p in zip(q_lens, prefix, strict=True)]
    batch = make_batch(seq_lens, [1] * 40 + q_lens, num_q_heads=64, num_kv_heads=8,
                       head_dim=64, page_size=16, num_padding=5, device=device, generator=gen,
                       sliding_window=window)
    run_and_check(batch, random_sinks(64, gen, device), window)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_cuda_graph_capture_with_sinks(device, gen) -> None:
    """Captured at a 4096 limit with split-K scratch, replayed: equals the eager call."""
    bsz = 8
    batch = make_batch(_lens(gen, bsz, 1, 4096), [1] * bsz, num_q_heads=64, num_kv_heads=8,
                       head_dim=64, page_size=16, device=device, generator=gen,
                       sliding_window=128)
    meta = batch.meta
    meta = type(meta)(meta.query_start_loc, meta.seq_lens, meta.page_table, meta.slot_mapping,
                      1, 4096)
    sinks = random_sinks(64, gen, device).bfloat16()
    scratch = AttentionScratch.allocate(bsz, 64, 64, device)
    out = torch.empty_like(batch.q)
    eager = paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.125, 128,
                            sinks=sinks)
    paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.125, 128, sinks=sinks,
                    out=out, scratch=scratch)   # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        paged_attention(batch.q, batch.k_cache, batch.v_cache, meta, 0.125, 128, sinks=sinks,
                        out=out, scratch=scratch)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)


def test_sink_variants_compile_for_sm90_without_spills() -> None:
    """The sink launches at gpt-oss-20b's heads (64/8, D = 64): unsplit full decode, split
    decode with its 128-token window + the reduction, windowed prefill; compiled for sm_90
    (Triton + ptxas, no GPU)."""
    from tests.kernels.test_package import compiled_json

    code = (
        "import json, torch\n"
        "from services.engine.kernels.attention import paged_attention\n"
        "from tests.kernels.batch import make_batch\n"
        "from tests.kernels.sm90_compile import capture_launches, compile_launch, report\n"
        "shape = dict(num_q_heads=64, num_kv_heads=8, head_dim=64, page_size=16,"
        " poison_unused=False)\n"
        "decode = make_batch([300] * 4, [1] * 4, **shape)\n"
        "prefill = make_batch([600, 300], [300, 200], **shape)\n"
        "sinks = torch.zeros(64, dtype=torch.bfloat16)\n"
        "with capture_launches() as calls:\n"
        "    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.125, 0,"
        " sinks=sinks, num_splits=1)\n"
        "    paged_attention(decode.q, decode.k_cache, decode.v_cache, decode.meta, 0.125, 128,"
        " sinks=sinks, num_splits=2)\n"
        "    paged_attention(prefill.q, prefill.k_cache, prefill.v_cache, prefill.meta, 0.125,"
        " 128, sinks=sinks, num_splits=1)\n"
        "rows = []\n"
        "for launch in calls:\n"
        "    r = report(launch.fn.fn.__name__, compile_launch(launch))\n"
        "    rows.append([r.name, r.registers, r.local_loads, bool(r.mma),"
        " launch.kwargs.get('HAS_SINKS')])\n"
        "print(json.dumps(rows))\n"
    )
    rows = compiled_json(code)
    assert len(rows) == 4   # decode, windowed split decode + its reduction, windowed prefill
    for name, registers, local_loads, mma, has_sinks in rows:
        assert has_sinks, f"{name}: launched without the sinks"
        assert local_loads == 0 and registers <= 255, f"{name}: spills ({registers} regs)"
        assert mma or "reduce" in name, f"{name}: no tensor-core MMA"
