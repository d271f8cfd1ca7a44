"""FP8 on the GPU: the kernels at Qwen3-8B shapes against float64 quantize-dequantize
references (torch._scaled_mm and the Triton GEMMs, the skinny kernel, the quantization bits),
CUDA-graph replay, and the FP8 model's logits against bf16 on the same weights (top-1 and KL
printed and bounded). Skipped without CUDA (`pytest -m gpu tests/kernels/test_fp8_gpu.py -s`
prints the accuracy numbers)."""

from __future__ import annotations

import pytest
import torch

from services.engine.kernels.pdl import graph_launches
from services.engine.model.fp8 import quantize_activation
from tests.kernels.test_fp8 import (
    SCHEMES,
    SKINNY_MODES,
    act64,
    dequant64,
    make_weight,
    rel,
    use_skinny,
)

pytestmark = pytest.mark.gpu
H, INTER, QKV = 4096, 12288, 6144


@pytest.mark.parametrize("kind", ["token", "group", "static"])
@pytest.mark.parametrize("width", [H, INTER])
def test_quantize_bits_on_gpu(kind, width, gen):
    from services.engine.kernels.fp8_quant import quantize_fp8

    x = (torch.randn(33, width, generator=gen) * 4).to(torch.bfloat16)
    static = torch.tensor([0.01, 0.02]) if kind == "static" else None
    q, scale = quantize_fp8(x.cuda(), kind, 128, None if static is None else static.cuda())
    ref_q, ref_scale = quantize_activation(x, kind, 128, static)
    assert torch.equal(scale.cpu(), ref_scale)
    assert torch.equal(q.cpu().view(torch.uint8), ref_q.view(torch.uint8))


@pytest.mark.parametrize("backend", ["auto", "scaled_mm", "triton"])
@pytest.mark.parametrize("m", [2, 17, 64, 256])
@pytest.mark.parametrize(("n", "k"), [(QKV, H), (H, INTER)])
def test_rowwise_gemm(backend, m, n, k, gen, monkeypatch):
    from services.engine.kernels import fp8_gemm

    monkeypatch.setenv("HELIOS_FP8_GEMM", backend)
    fp8_gemm.gemm_backend.cache_clear()
    try:
        weight, w64 = make_weight(n, k, SCHEMES["token-channel"], gen, torch.device("cuda"))
        x = torch.randn(m, k, generator=gen)
        a, a_scale = quantize_activation(x, "token", 128)
        bias = torch.randn(n, generator=gen).to(torch.bfloat16)
        out = fp8_gemm.rowwise_mm(a.cuda(), a_scale.cuda(), weight.qweight, weight.scale,
                                  bias.cuda(), torch.bfloat16)
    finally:
        fp8_gemm.gemm_backend.cache_clear()
    ref = (dequant64(a, a_scale).cuda() @ w64.cuda().t()).cpu() + bias.double()
    assert out.shape == (m, n) and rel(out, ref) < 1e-2
    assert float((out.double().cpu() - ref).norm(dim=1).div(ref.norm(dim=1)).max()) < 3e-2


@pytest.mark.parametrize("m", [3, 256])
def test_block_gemm(m, gen):
    from services.engine.kernels.fp8_gemm import block_mm

    weight, w64 = make_weight(QKV, H, SCHEMES["group-block"], gen, torch.device("cuda"))
    x = torch.randn(m, H, generator=gen)
    a, a_scale = quantize_activation(x, "group", 128)
    out = block_mm(a.cuda(), a_scale.cuda(), weight.qweight, weight.scale, None, torch.bfloat16)
    assert rel(out, dequant64(a, a_scale).cuda() @ w64.cuda().t()) < 1e-2


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("rows", [1, 8, 200])
@pytest.mark.parametrize(("n", "k", "activation"), [(QKV, H, None), (2 * INTER, H, "silu"),
                                                    (H, INTER, None)])
@pytest.mark.parametrize("skinny", SKINNY_MODES)
def test_fp8_layers_at_qwen3_8b(scheme_name, rows, n, k, activation, skinny, gen, monkeypatch):
    from services.engine.kernels import fp8_layers
    from services.engine.kernels.fp8_layers import fp8_linear, fp8_norm_linear
    from services.engine.model.ops import reference_rms_norm

    use_skinny(monkeypatch, fp8_layers, skinny)
    weight, w64 = make_weight(n, k, SCHEMES[scheme_name], gen, torch.device("cuda"))
    x = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
    if k == H:
        residual = torch.randn(rows, k, generator=gen).to(torch.bfloat16)
        g = (1 + 0.2 * torch.randn(k, generator=gen)).to(torch.bfloat16)
        out, new_res = fp8_norm_linear(x.cuda(), residual.cuda(), g.cuda(), 1e-6, weight, None,
                                       activation)
        assert torch.equal(new_res.cpu(), x + residual)
        inputs = reference_rms_norm(x + residual, g, 1e-6)
    else:
        out = fp8_linear(x.cuda(), weight, None, out_dtype=torch.float32)
        inputs = x
    # W8A16 (the skinny kernels) or quantized activations (the GEMM, the w8a8 kernel)
    a64 = act64(inputs, weight) if fp8_layers.quantizes_rows(rows) else inputs.double()
    y = a64.cuda() @ w64.cuda().t()         # float64 on the GPU (the CPU would take seconds)
    if activation:
        gate, up = y.chunk(2, dim=-1)
        y = torch.nn.functional.silu(gate) * up
    assert rel(out, y) < (2e-2 if activation else 1e-2)


def test_e4m3_words_convert_exactly():
    """fp8_unpack's words path (load_weights + weight_f32 with E4M3_PTX) gives torch's
    e4m3 -> float32 cast bit for bit over all 256 codes (NaNs as NaNs), each code met at
    every byte position of a word, in a [16, 256] tile with a ragged K (248 of 256 loaded)."""
    from tests.kernels.fp8_unpack_probe import convert_tile

    base = torch.arange(256, dtype=torch.uint8)
    codes = torch.stack([base.roll(r) for r in range(16)]).cuda()   # shifted row by row
    tile = codes.view(torch.float8_e4m3fn)
    got = convert_tile(tile, 248)
    want = tile.float()
    want[:, 248:] = 0.0
    nan = want.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))


WORDS_CASES = [(scheme, n, k, act) for scheme in ("token-channel", "group-block")
               for n, k, act in ((QKV, H, None), (2 * INTER, H, "silu"), (H, INTER, None))]
WORDS_CASES.append(("token-channel", 200, 4100, None))   # block scales need whole 128 blocks


@pytest.mark.parametrize(("scheme_name", "n", "k", "activation"), WORDS_CASES)
def test_e4m3_words_match_the_cast(scheme_name, n, k, activation, gen, monkeypatch):
    """The one-row kernel reading e4m3 as words (fp8_unpack.py) against the same kernel with
    Triton's cast, all 254 finite codes among the weights: the products are the same; the
    sums may differ in their last bits where the two tile layouts reduce in another order
    (bit-equal at Qwen3-8B's shapes on an H100, not at 200 x 4100, whose last K step is
    ragged)."""
    from services.engine.kernels import fp8_unpack
    from services.engine.kernels.fp8_layers import fp8_linear, fp8_norm_linear

    weight, _ = make_weight(n, k, SCHEMES[scheme_name], gen, torch.device("cuda"))
    codes = torch.arange(256, dtype=torch.uint8, device="cuda")
    codes = codes[(codes & 0x7F) != 0x7F]                     # e4m3fn's NaNs
    flat = weight.qweight.view(torch.uint8).view(-1)
    flat[: codes.numel() * 8] = codes.repeat(8)
    assert fp8_unpack.hardware_e4m3(weight.qweight)
    x = torch.randn(1, k, generator=gen).to(torch.bfloat16).cuda()
    g = (1 + 0.2 * torch.randn(k, generator=gen)).to(torch.bfloat16).cuda()

    def run():
        if k == H:
            return fp8_norm_linear(x, x, g, 1e-6, weight, None, activation)[0]
        return fp8_linear(x, weight, None, out_dtype=torch.float32)

    words = run()
    monkeypatch.setenv("HELIOS_E4M3_UNPACK", "cast")
    fp8_unpack._switched_to_cast.cache_clear()
    try:
        assert not fp8_unpack.hardware_e4m3(weight.qweight)
        cast = run()
    finally:
        monkeypatch.delenv("HELIOS_E4M3_UNPACK")
        fp8_unpack._switched_to_cast.cache_clear()
    assert torch.isfinite(words).all()
    # float32 sums within 2e-6; bf16 outputs within one bf16 step (a last-bit difference in
    # the sum can round the other way)
    fp32 = words.dtype == torch.float32
    torch.testing.assert_close(words, cast, rtol=2e-6 if fp32 else 2 ** -7,
                               atol=1e-5 if fp32 else 1e-3)


@pytest.mark.parametrize("skinny", SKINNY_MODES)
def test_graph_replay_matches_eager(skinny, gen, monkeypatch):
    """Captured once, replayed on new rows: equal to eager calls, bit for bit (8 rows: the
    GEMM path with its split K for the block-scaled down_proj, or the w8a8 kernel)."""
    from services.engine.kernels import fp8_layers
    from services.engine.kernels.fp8_layers import fp8_linear, fp8_norm_linear

    use_skinny(monkeypatch, fp8_layers, skinny)

    device = torch.device("cuda")
    qkv, _ = make_weight(QKV, H, SCHEMES["token-channel"], gen, device)
    down, _ = make_weight(H, INTER, SCHEMES["group-block"], gen, device)
    g = torch.ones(H, dtype=torch.bfloat16, device=device)
    for rows in (1, 8):
        x = torch.randn(rows, H, generator=gen).to(torch.bfloat16).cuda()
        act = torch.randn(rows, INTER, generator=gen).to(torch.bfloat16).cuda()

        def step(x=x, act=act):
            y, _ = fp8_norm_linear(x, x, g, 1e-6, qkv)
            return y, fp8_linear(act, down)

        with graph_launches():              # PDL, as in the engine's graphs
            eager = step()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                captured = step()
        x.copy_(torch.randn(rows, H, generator=gen).to(torch.bfloat16))
        graph.replay()
        torch.cuda.synchronize()
        fresh = step()
        for got, want in zip(captured, fresh, strict=True):
            assert torch.equal(got, want)
        assert not torch.equal(captured[0], eager[0])


def test_fp8_model_logits_against_bf16(tmp_path):
    """Online FP8 (per-channel weights, per-token activations) vs the bf16 model on the same
    weights, every position of three prompts; and the same comparison on the CPU reference
    path (float32), which the GPU kernels must track."""
    from tests.engine.model.fp8_accuracy import compare, write

    directory = write(tmp_path / "model")
    gpu = compare(directory, torch.device("cuda"), torch.bfloat16)
    cpu = compare(directory, torch.device("cpu"), torch.float32)
    print(f"\nFP8 vs bf16 (GPU kernels): {gpu}\nFP8 vs fp32 (CPU reference): {cpu}")
    assert gpu["top1"] >= 0.75 and gpu["kl_mean"] <= 0.4, gpu
    assert abs(gpu["top1"] - cpu["top1"]) <= 0.1 and gpu["kl_mean"] <= 2 * cpu["kl_mean"] + 0.05



@pytest.mark.parametrize(("seq_lens", "q_lens"), [
    ([1024] * 64, [1] * 64),                 # decode, unsplit
    ([3000], [1]),                           # decode, split
    ([2048, 700], [512, 700]),               # prefill over a prefix, and from scratch
    ([900, 1500, 40], [300, 1, 1]),          # mixed
])
def test_attention_reads_fp8_pages_at_qwen3_8b(seq_lens, q_lens, gen):
    """Qwen3-8B heads (32 / 8, D = 128, pages of 16) over e4m3 pages vs float64."""
    from services.engine.kernels.attention import paged_attention
    from tests.kernels import reference
    from tests.kernels.batch import make_batch
    from tests.kernels.test_fp8_kv import to_fp8

    batch = to_fp8(make_batch(seq_lens, q_lens, num_q_heads=32, num_kv_heads=8, head_dim=128,
                              page_size=16, device="cuda", generator=gen))
    out = paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, 128 ** -0.5)
    ref = reference.paged_attention(batch, 128 ** -0.5)
    assert reference.rel_error(out, ref) < 1e-2
    assert float(reference.row_rel_errors(out, ref).max()) < 3e-2
