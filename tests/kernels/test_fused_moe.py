"""The fused-MoE kernels (services/engine/kernels/fused_moe.py) against moe.py's reference:
small shapes through Triton's CPU interpreter (fp16 operands: the interpreter's tl.dot
mishandles bf16), ragged and empty expert loads, the routing fused into the align kernel, the
expert-load counter, refusals, the row-buffer bound, and every launch compiled for sm_90.
The large shapes, bf16 and CUDA-graph capture: tests/kernels/test_fused_moe_gpu.py."""

from __future__ import annotations

import inspect

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.model import moe
from tests.kernels.test_package import compiled_json


def moe_case(tokens: int, experts: int, top_k: int, hidden: int, inter: int, *, bias: bool,
             skew: bool, gen: torch.Generator, dtype: torch.dtype, device: torch.device):
    """Random inputs; with `skew` expert 1 takes most tokens and the last two none."""
    x = torch.randn(tokens, hidden, generator=gen)
    w_gate_up = torch.randn(experts, 2 * inter, hidden, generator=gen) / hidden ** 0.5
    w_down = torch.randn(experts, hidden, inter, generator=gen) / inter ** 0.5
    logits = torch.randn(tokens, experts, generator=gen)
    if skew:
        logits[:, 1] += 4.0
        logits[:, -2:] -= 50.0
    biases = ((torch.randn(experts, 2 * inter, generator=gen) * 0.5,
               torch.randn(experts, hidden, generator=gen) * 0.5) if bias else (None, None))
    cast = [t if t is None else t.to(device=device, dtype=dtype)
            for t in (x, w_gate_up, w_down, *biases)]
    return (*cast, logits.to(device))


def reference(x, w_gate_up, w_down, weights, ids, b1, b2, activation, limit=7.0):
    """moe.py's reference in float32 on the same (rounded) operands."""
    def up(t):
        return None if t is None else t.float()
    return moe.reference_fused_experts(up(x), up(w_gate_up), up(w_down), weights, ids,
                                       gate_up_bias=up(b1), down_bias=up(b2),
                                       activation=activation, limit=limit)


def assert_close(got: torch.Tensor, want: torch.Tensor) -> None:
    """Relative to the tensor's norm overall (1e-2) and per row (3e-2), as the other kernels."""
    got, want = got.float(), want.float()
    assert torch.isfinite(got).all()
    scale = want.norm().clamp_min(1e-6)
    assert ((got - want).norm() / scale) < 1e-2
    rows = (got - want).norm(dim=1) / want.norm(dim=1).clamp_min(1e-3 * float(scale))
    assert float(rows.max()) < 3e-2


CASES = [  # tokens, experts, top_k, hidden, inter, activation, bias, skew
    (1, 8, 2, 32, 16, "silu", False, False),
    (2, 6, 2, 48, 32, "silu", False, False),          # E not a power of two
    (7, 8, 3, 64, 48, "swiglu_oai", True, True),
    (19, 16, 4, 32, 32, "silu", True, True),           # ragged, two experts unused
    (40, 4, 1, 32, 16, "swiglu_oai", False, True),    # top-1, one expert gets nearly all
    (33, 4, 4, 16, 16, "silu", False, False),          # k = E: every expert every token
]


@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter,activation,bias,skew", CASES)
def test_fused_experts_matches_reference(tokens, experts, top_k, hidden, inter, activation,
                                         bias, skew, gen, device, dot_dtype) -> None:
    from services.engine.kernels import fused_experts

    x, w_gate_up, w_down, b1, b2, logits = moe_case(
        tokens, experts, top_k, hidden, inter, bias=bias, skew=skew, gen=gen, dtype=dot_dtype,
        device=device)
    weights, ids = moe.softmax_topk(logits, top_k, renormalize=True)
    if skew:
        assert set(ids.flatten().tolist()).isdisjoint({experts - 1, experts - 2})
    got = fused_experts(x, w_gate_up, w_down, weights, ids, gate_up_bias=b1, down_bias=b2,
                        activation=activation, limit=1.5)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert_close(got, reference(x, w_gate_up, w_down, weights, ids, b1, b2, activation, 1.5))


MXFP4_CASES = [  # tokens, experts, top_k, hidden, inter, activation, bias, skew
    (1, 8, 2, 64, 32, "swiglu_oai", True, False),       # decode tiles, gpt-oss's activation
    (7, 8, 3, 96, 64, "silu", False, True),             # K not a multiple of the tile
    (40, 4, 2, 64, 96, "swiglu_oai", True, True),       # mid tiles, ragged loads
    (300, 4, 2, 32, 32, "silu", False, False),           # prefill tiles, K = one group
]


def mxfp4_experts(w_gate_up, w_down, dtype):
    from services.engine.model.mxfp4 import Mxfp4Weight, quantize_mxfp4

    return tuple(Mxfp4Weight(*quantize_mxfp4(w.float()), dtype) for w in (w_gate_up, w_down))


@pytest.mark.parametrize("tokens,experts,top_k,hidden,inter,activation,bias,skew", MXFP4_CASES)
def test_mxfp4_experts_match_the_dequantized_reference(tokens, experts, top_k, hidden, inter,
                                                        activation, bias, skew, gen, device,
                                                        dot_dtype) -> None:
    """MXFP4 expert matrices (blocks + E8M0 scales, dequantized tile by tile in the GEMM
    kernels) against the reference on the same weights dequantized, routing fused in too."""
    from services.engine.kernels import fused_experts, fused_moe_routed

    x, w_gate_up, w_down, b1, b2, logits = moe_case(
        tokens, experts, top_k, hidden, inter, bias=bias, skew=skew, gen=gen, dtype=dot_dtype,
        device=device)
    packed_gate_up, packed_down = mxfp4_experts(w_gate_up, w_down, dot_dtype)
    dense_gate_up, dense_down = packed_gate_up.dequantize(), packed_down.dequantize()
    weights, ids = moe.softmax_topk(logits, top_k, renormalize=True)
    want = reference(x, dense_gate_up, dense_down, weights, ids, b1, b2, activation, 1.5)
    got = fused_experts(x, packed_gate_up, packed_down, weights, ids, gate_up_bias=b1,
                        down_bias=b2, activation=activation, limit=1.5)
    assert got.dtype == x.dtype and got.shape == x.shape
    assert_close(got, want)
    # the kernels' dequantization is exact: the dense kernels on the dequantized weights agree
    dense = fused_experts(x, dense_gate_up, dense_down, weights, ids, gate_up_bias=b1,
                          down_bias=b2, activation=activation, limit=1.5)
    torch.testing.assert_close(got, dense, rtol=0, atol=0)
    routed, _, routed_ids = fused_moe_routed(x, logits, packed_gate_up, packed_down, top_k, True,
                                             gate_up_bias=b1, down_bias=b2,
                                             activation=activation, limit=1.5)
    assert torch.equal(routed_ids, ids)
    assert_close(routed, want)


def test_mxfp4_quantization_in_slices_equals_one_pass(gen, monkeypatch) -> None:
    """Above QUANTIZE_CHUNK values the quantizer takes one leading slice at a time (its
    temporaries ran a GPU out of memory at gpt-oss-20b's size); the codes are the same."""
    from services.engine.model import mxfp4

    weight = torch.randn(3, 4, 5, 64, generator=gen) * torch.logspace(-3, 3, 64)
    whole = mxfp4.quantize_mxfp4(weight)
    monkeypatch.setattr(mxfp4, "QUANTIZE_CHUNK", 100)    # 3 slices, then 4 each below them
    sliced = mxfp4.quantize_mxfp4(weight)
    assert [t.shape for t in sliced] == [(3, 4, 5, 32), (3, 4, 5, 2)]
    assert all(torch.equal(a, b) for a, b in zip(whole, sliced, strict=True))


def test_mxfp4_refusals(gen, device, dot_dtype) -> None:
    from services.engine.kernels import fused_experts

    x, w_gate_up, w_down, _, _, logits = moe_case(
        3, 4, 2, 32, 32, bias=False, skew=False, gen=gen, dtype=dot_dtype, device=device)
    packed_gate_up, packed_down = mxfp4_experts(w_gate_up, w_down, dot_dtype)
    weights, ids = moe.softmax_topk(logits, 2, True)
    with pytest.raises(ValidationError, match="both expert matrices MXFP4, or neither"):
        fused_experts(x, packed_gate_up, w_down, weights, ids)
    with pytest.raises(ValidationError, match="share a dtype"):
        fused_experts(x.float(), packed_gate_up, packed_down, weights, ids)


@pytest.mark.parametrize("renormalize", [True, False])
def test_routing_fused_in_and_the_load_counter(renormalize, gen, device, dot_dtype) -> None:
    from services.engine.kernels import fused_moe_routed

    x, w_gate_up, w_down, _, _, logits = moe_case(
        21, 8, 3, 32, 16, bias=False, skew=True, gen=gen, dtype=dot_dtype, device=device)
    load = torch.full((8,), 5, dtype=torch.int64, device=device)
    real = torch.tensor([17], dtype=torch.int32, device=device)   # rows 17..20 are padding
    out, weights, ids = fused_moe_routed(x, logits, w_gate_up, w_down, 3, renormalize,
                                  expert_tokens=load, num_real_tokens=real)
    want_weights, want_ids = moe.softmax_topk(logits, 3, renormalize)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_weights)
    assert_close(out, reference(x, w_gate_up, w_down, want_weights, want_ids, None, None,
                                "silu"))
    counts = torch.bincount(want_ids[:17].flatten().long(), minlength=8)
    assert load.tolist() == (counts + 5).tolist()
    fused_moe_routed(x, logits, w_gate_up, w_down, 3, renormalize, expert_tokens=load,
              num_real_tokens=real)
    assert load.tolist() == (2 * counts + 5).tolist()   # accumulates across calls


@pytest.mark.parametrize("tokens", [1, 2, 3, 4])
@pytest.mark.parametrize(("activation", "bias"), [("silu", False), ("swiglu_oai", True)])
def test_decode_path_equals_the_sorted_path(tokens, activation, bias, gen, device, dot_dtype,
                                            monkeypatch) -> None:
    """At T <= DECODE_TOKENS the two decode launches (fused_moe_decode.py, forced with
    HELIOS_MOE_DECODE=1) route exactly as the align kernel (the same ids, the same weights to
    the bit) and give the sorted path's output (HELIOS_MOE_DECODE=0) within the kernels'
    tolerance, against the reference too; the expert load counts the real tokens' slots
    alone."""
    from services.engine.kernels import fused_moe, fused_moe_routed
    from services.engine.kernels.fused_moe_decode import DECODE_TOKENS

    assert tokens <= DECODE_TOKENS
    decoded: list[int] = []
    run_decode = fused_moe.run_decode
    monkeypatch.setattr(fused_moe, "run_decode",
                        lambda x, *args: decoded.append(x.shape[0]) or run_decode(x, *args))
    x, w_gate_up, w_down, b1, b2, logits = moe_case(
        tokens, 16, 4, 48, 32, bias=bias, skew=True, gen=gen, dtype=dot_dtype, device=device)
    real = torch.tensor([max(1, tokens - 1)], dtype=torch.int32, device=device)
    runs = {}
    for path in ("1", "0"):
        monkeypatch.setenv("HELIOS_MOE_DECODE", path)
        load = torch.zeros(16, dtype=torch.int64, device=device)
        out, weights, ids = fused_moe_routed(
            x, logits, w_gate_up, w_down, 4, True, gate_up_bias=b1, down_bias=b2,
            activation=activation, expert_tokens=load, num_real_tokens=real)
        runs[path] = (out, weights, ids, load)
    assert decoded == [tokens]                    # the decode path ran once, with "1"
    decode, sorted_ = runs["1"], runs["0"]
    assert torch.equal(decode[2], sorted_[2]) and torch.equal(decode[1], sorted_[1])
    assert torch.equal(decode[3], sorted_[3])
    counts = torch.bincount(decode[2][:int(real)].flatten().long(), minlength=16)
    assert decode[3].tolist() == counts.tolist()
    assert_close(decode[0], sorted_[0])
    assert_close(decode[0], reference(x, w_gate_up, w_down, decode[1], decode[2], b1, b2,
                                      activation))


@pytest.mark.parametrize(("tokens", "mode"), [(1, "auto"), (2, "1"), (3, "0")])
def test_the_norm_folded_into_the_experts(tokens, mode, gen, device, dot_dtype,
                                          monkeypatch) -> None:
    """fused_moe_routed with `norm_weight`: x is the residual stream, and the experts see
    rms_norm(x) * g (the decode kernels normalize each row; the sorted path, mode "0", runs
    the norm kernel first); equal to the call on rows normed beforehand."""
    from services.engine.kernels import fused_moe_routed
    from services.engine.model.ops import reference_rms_norm

    monkeypatch.setenv("HELIOS_MOE_DECODE", mode)
    x, w_gate_up, w_down, _, _, logits = moe_case(
        tokens, 16, 2, 48, 32, bias=False, skew=False, gen=gen, dtype=dot_dtype,
        device=device)
    gain = (torch.rand(48, generator=gen) + 0.5).to(device=device, dtype=dot_dtype)
    out, weights, ids = fused_moe_routed(x * 3.0, logits, w_gate_up, w_down, 2, True,
                                         norm_weight=gain, eps=1e-6)
    normed = reference_rms_norm(x * 3.0, gain, 1e-6)
    want, want_weights, want_ids = fused_moe_routed(normed, logits, w_gate_up, w_down, 2, True)
    assert torch.equal(ids, want_ids) and torch.equal(weights, want_weights)
    assert_close(out, want)
    assert_close(out, reference(normed, w_gate_up, w_down, weights, ids, None, None, "silu"))
    with pytest.raises(ValidationError, match="norm weight"):
        fused_moe_routed(x, logits, w_gate_up, w_down, 2, True, norm_weight=gain[:8])


@pytest.mark.parametrize("mode", ["1", "0"])
def test_the_sparse_sublayer_folds_its_norm_into_router_and_experts(mode, gen, device,
                                                                    monkeypatch) -> None:
    """SparseMoeBlock.forward_residual with the norm folded in (float32; through the
    interpreter on the CPU, compiled on a GPU): the router's norm_linear adds the residual and normalizes, the
    decode kernels normalize their rows (mode "1"; "0": the sorted path after the norm
    kernel), and the result, the new residual and the expert load equal the norm kernel +
    routing + experts path (model/moe.py's reference on the CPU)."""
    from services.engine import kernels
    from services.engine.kernels import fused_moe
    from services.engine.model.config import MoEConfig
    from tests.engine.model.test_moe import one_layer_config

    monkeypatch.setenv("HELIOS_MOE_DECODE", mode)
    # the decode launches with the norm folded in (run_decode's norm_weight); on a GPU the
    # unfolded run's experts take the decode path too, without it
    folded: list[int] = []
    run_decode = fused_moe.run_decode
    signature = inspect.signature(run_decode)

    def recording(x, *args):
        if signature.bind(x, *args).arguments.get("norm_weight") is not None:
            folded.append(x.shape[0])
        return run_decode(x, *args)

    monkeypatch.setattr(fused_moe, "run_decode", recording)
    block = moe.SparseMoeBlock(one_layer_config(32), MoEConfig(16, 2, 16, (True,)),
                               device=device, dtype=torch.float32)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x, residual = (torch.randn(2, 32, generator=gen).to(device),
                   torch.randn(2, 32, generator=gen).to(device))
    norm = (torch.rand(32, generator=gen) + 0.5).to(device)
    real = torch.tensor([1], dtype=torch.int32, device=device)
    runs = []
    for fused in (True, False):
        block.expert_tokens.zero_()
        monkeypatch.setattr(moe.SparseMoeBlock, "_folding_kernel",
                            lambda self, t, f=fused: kernels.fused_moe_routed if f else None)
        monkeypatch.setattr(moe, "_kernel", lambda name="fused_experts": getattr(kernels, name))
        out, new_residual = block.forward_residual(x, residual, norm, 1e-6, real)
        runs.append((out, new_residual, block.expert_tokens.clone()))
    (out, new_residual, load), (want, want_residual, want_load) = runs
    torch.testing.assert_close(new_residual, want_residual, rtol=0, atol=0)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert load.tolist() == want_load.tolist() and int(load.sum()) == 2
    assert folded == ([2] if mode == "1" else [])


def test_decode_path_with_given_routing(gen, device, dot_dtype, monkeypatch) -> None:
    """fused_experts (the routing given) at batch 1 and 3 takes the decode launches too."""
    from services.engine.kernels import fused_experts

    monkeypatch.setenv("HELIOS_MOE_DECODE", "1")
    for tokens in (1, 3):
        x, w_gate_up, w_down, _, _, logits = moe_case(
            tokens, 8, 2, 32, 16, bias=False, skew=False, gen=gen, dtype=dot_dtype,
            device=device)
        weights, ids = moe.softmax_topk(logits, 2, False)
        out = fused_experts(x, w_gate_up, w_down, weights, ids)
        assert_close(out, reference(x, w_gate_up, w_down, weights, ids, None, None, "silu"))


def test_a_decode_plan_takes_the_decode_kernels_with_its_tiles(gen, device, dot_dtype,
                                                               monkeypatch) -> None:
    """`plan=DecodePlan(...)` (bench_fused_moe.py's decode sweep) runs the decode launches
    with those tiles, whatever HELIOS_MOE_DECODE says: the routing to the bit and the output
    within tolerance of plan_decode's tiles; past DECODE_TOKENS tokens it is refused."""
    from services.engine.kernels import fused_moe_decode, fused_moe_routed
    from services.engine.kernels.fused_moe_decode import DECODE_TOKENS, DecodePlan
    from services.engine.kernels.skinny_linear import LinearPlan

    monkeypatch.setenv("HELIOS_MOE_DECODE", "0")      # the plan overrides the sorted path
    launched: list[int] = []                          # the gate/up launches' BLOCK_N
    kernel = fused_moe_decode._decode_gate_up_kernel

    class Recorder:
        def __getitem__(self, grid):
            def launch(*args, **kwargs):
                launched.append(kwargs["BLOCK_N"])
                return kernel[grid](*args, **kwargs)
            return launch

    monkeypatch.setattr(fused_moe_decode, "_decode_gate_up_kernel", Recorder())
    x, w_gate_up, w_down, b1, b2, logits = moe_case(
        2, 16, 4, 48, 32, bias=True, skew=True, gen=gen, dtype=dot_dtype, device=device)
    kw = dict(gate_up_bias=b1, down_bias=b2, activation="swiglu_oai")
    default = fused_moe_routed(x, logits, w_gate_up, w_down, 4, True, **kw)
    plan = DecodePlan(LinearPlan(block_n=4, block_k=16, num_warps=2),     # ragged K steps
                      LinearPlan(block_n=32, block_k=32, num_warps=4))    # across slots
    tiled = fused_moe_routed(x, logits, w_gate_up, w_down, 4, True, plan=plan, **kw)
    assert launched == [4]                            # the sorted path ran the default
    assert torch.equal(tiled[2], default[2]) and torch.equal(tiled[1], default[1])
    assert_close(tiled[0], default[0])
    assert_close(tiled[0], reference(x, w_gate_up, w_down, tiled[1], tiled[2], b1, b2,
                                     "swiglu_oai"))
    many = moe_case(DECODE_TOKENS + 1, 16, 4, 48, 32, bias=False, skew=False, gen=gen,
                    dtype=dot_dtype, device=device)
    with pytest.raises(ValidationError, match="DecodePlan runs dense experts at up to 4"):
        fused_moe_routed(many[0], many[5], many[1], many[2], 4, True, plan=plan)


def test_warm_up_token_counts_meet_both_paths(monkeypatch) -> None:
    """model/moe.py's warm-up calls: one at 1 token for the decode kernels, then the sorted
    path's first variant where the decode path stops (one token at 3 of 8 experts; three at
    Qwen3-30B-A3B's 8 of 128, which decodes two); MXFP4 experts (no decode path) and
    HELIOS_MOE_DECODE=0 start the sorted path's variants at 1 token."""
    from services.engine.kernels.fused_moe import variant_token_counts
    from services.engine.kernels.fused_moe_decode import decode_path

    assert variant_token_counts(256, 3, 8, 64, 32)[:3] == (1, 2, 3)
    assert not decode_path(2, 3, 8, False)
    assert [decode_path(t, 8, 128, False) for t in (1, 2, 3)] == [True, True, False]
    assert variant_token_counts(256, 8, 128, 64, 32)[:2] == (1, 3)
    assert [decode_path(t, 4, 32, False) for t in (1, 2)] == [True, False]
    assert not decode_path(1, 8, 128, True)                       # MXFP4 experts
    assert variant_token_counts(256, 8, 128, 64, 32, mxfp4=True)[:3] == (1, 2, 3)
    monkeypatch.setenv("HELIOS_MOE_DECODE", "1")
    assert [decode_path(t, 4, 32, False) for t in (1, 4, 5)] == [True, True, False]
    monkeypatch.setenv("HELIOS_MOE_DECODE", "0")
    assert not decode_path(1, 8, 128, False)
    assert variant_token_counts(256, 8, 128, 64, 32)[:3] == (1, 2, 3)
    monkeypatch.setenv("HELIOS_MOE_DECODE", "on")
    with pytest.raises(ValidationError, match="HELIOS_MOE_DECODE='on': expected one of auto"):
        decode_path(1, 8, 128, False)


def test_empty_batch_and_refusals(device, dot_dtype, gen) -> None:
    from services.engine.kernels import fused_experts

    x, w_gate_up, w_down, _, _, logits = moe_case(
        3, 4, 2, 16, 16, bias=False, skew=False, gen=gen, dtype=dot_dtype, device=device)
    weights, ids = moe.softmax_topk(logits, 2, True)
    empty = fused_experts(x[:0], w_gate_up, w_down, weights[:0], ids[:0])
    assert empty.shape == (0, 16)
    with pytest.raises(ValidationError, match="unknown expert activation"):
        fused_experts(x, w_gate_up, w_down, weights, ids, activation="gelu")
    with pytest.raises(ValidationError, match="disagree"):
        fused_experts(x, w_gate_up, w_down[:, :8], weights, ids)
    with pytest.raises(ValidationError, match="for 2 tokens"):
        fused_experts(x[:2], w_gate_up, w_down, weights, ids)
    with pytest.raises(ValidationError, match="share a dtype"):
        fused_experts(x.float(), w_gate_up, w_down, weights, ids)


def test_row_buffer_bound_holds_for_every_load() -> None:
    """T*k + min(T*k, E) * (BLOCK_M - 1) rows hold the padded rows of any routing: adversarial
    loads (every used expert one row past a multiple of BLOCK_M) and random ones."""
    import random

    from services.engine.kernels.fused_moe import plan_moe

    rng = random.Random(0)
    for tokens, top_k, experts in ((1, 8, 128), (3, 8, 128), (64, 8, 128), (512, 8, 128),
                                   (4096, 4, 32), (5, 2, 4)):
        plan = plan_moe(tokens, top_k, experts, 2048, 768)
        slots, block = tokens * top_k, plan.block_m
        used = min(slots, experts)
        loads = [[1] * used]                             # one row each
        per = slots // used
        loads.append([per + (1 if e < slots - per * used else 0) for e in range(used)])
        full = slots // (block + 1)                      # block + 1 rows: two blocks each
        if 0 < full <= experts:
            loads.append([block + 1] * full + [slots - full * (block + 1)])
        for _ in range(20):
            counts = [0] * experts
            for _ in range(slots):
                counts[rng.randrange(experts)] += 1
            loads.append(counts)
        for counts in loads:
            assert sum(counts) <= slots
            padded = sum(-(-c // block) * block for c in counts)
            assert padded <= plan.max_rows <= plan.max_blocks * block
    assert plan_moe(1, 8, 128, 2048, 768).max_blocks == 8   # batch 1: only k row blocks


def test_fused_moe_launches_compile_for_sm90() -> None:
    """The launches at the gpt-oss-20b shape (batch 1: the two decode kernels, swiglu_oai
    with biases; and the GEMMs with MXFP4 experts at the decode, mid and prefill plans) and
    the Qwen3-30B-A3B one (batch 1's decode kernels with the routing fused in; the sorted
    path's routing and gate/up at 5 tokens; the prefill tile plan) compile for the H200
    without spills, the sorted path's GEMMs on tensor cores."""
    code = (
        "import json, torch\n"
        "from tests.kernels.sm90_compile import capture_launches, compile_launch, gpt_oss_moe_launches, report\n"
        "from services.engine.kernels.fused_moe import fused_experts, fused_moe_routed\n"
        "rows = []\n"
        "def calls(t, e, k, h, i, act, bias, route):\n"
        "    x = torch.zeros(t, h, dtype=torch.bfloat16)\n"
        "    w1 = torch.zeros(e, 2 * i, h, dtype=torch.bfloat16)\n"
        "    w2 = torch.zeros(e, h, i, dtype=torch.bfloat16)\n"
        "    b1 = torch.zeros(e, 2 * i, dtype=torch.bfloat16) if bias else None\n"
        "    b2 = torch.zeros(e, h, dtype=torch.bfloat16) if bias else None\n"
        "    with capture_launches() as launches:\n"
        "        if route:\n"
        "            fused_moe_routed(x, torch.zeros(t, e), w1, w2, k, True, expert_tokens=torch.zeros(e, dtype=torch.int64), num_real_tokens=torch.zeros(1, dtype=torch.int32))\n"
        "        else:\n"
        "            fused_experts(x, w1, w2, torch.zeros(t, k), torch.zeros(t, k, dtype=torch.int32), gate_up_bias=b1, down_bias=b2, activation=act)\n"
        "    return launches\n"
        "for label, args, kernels in [\n"
        "        ('gpt-oss T=1', (1, 32, 4, 2880, 2880, 'swiglu_oai', True, False), None),\n"
        "        ('qwen3 T=1', (1, 128, 8, 2048, 768, 'silu', False, True), None),\n"
        "        ('qwen3 T=5', (5, 128, 8, 2048, 768, 'silu', False, True), ('_route_align_kernel', '_gate_up_kernel')),\n"
        "        ('qwen3 T=2048', (2048, 128, 8, 2048, 768, 'silu', False, False), ('_gate_up_kernel', '_down_kernel'))]:\n"
        "    for launch in calls(*args):\n"
        "        if kernels and launch.fn.fn.__name__ not in kernels:\n"
        "            continue\n"
        "        r = report(label, compile_launch(launch))\n"
        "        rows.append([label, launch.fn.fn.__name__, r.registers, r.local_loads, r.mma])\n"
        "for t in (1, 64, 2048):\n"
        "    for launch in gpt_oss_moe_launches('mxfp4', t):\n"
        "        r = report(f'mxfp4 T={t}', compile_launch(launch))\n"
        "        rows.append([f'gpt-oss mxfp4 T={t}', launch.fn.fn.__name__, r.registers, r.local_loads, r.mma])\n"
        "print(json.dumps(rows))\n"
    )
    rows = compiled_json(code)
    # decode (T <= 4, fused_moe_decode.py): two launches each at gpt-oss and qwen3 T=1
    assert [row[1] for row in rows[:4]] == ["_decode_gate_up_kernel", "_decode_down_kernel"] * 2
    assert len(rows) == 4 + 2 + 2 + 6
    for label, kernel, registers, local_loads, mma in rows:
        assert local_loads == 0 and registers <= 255, f"{label} {kernel}: spills ({registers})"
        if kernel in ("_gate_up_kernel", "_down_kernel"):
            assert mma, f"{label} {kernel}: no tensor-core MMA in the SASS"
