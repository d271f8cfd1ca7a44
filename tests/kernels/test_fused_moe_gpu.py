"""The fused-MoE kernels on the GPU (skipped without CUDA): bf16 at the real shapes against
moe.py's float32 reference over batch sizes 1 to 512 and prefill sizes, ragged loads and
experts no token selected, fp32 exactness, and CUDA-graph capture + replay at decode
capacities. Bounds as the other kernels: ||out - ref|| / ||ref|| < 1e-2, every row < 3e-2."""

from __future__ import annotations

import pytest
import torch

from services.engine.model import moe
from tests.kernels.test_fused_moe import assert_close, moe_case, reference

pytestmark = pytest.mark.gpu

QWEN3_30B = (128, 8, 2048, 768, "silu", False)        # experts, top_k, hidden, inter
GPT_OSS_20B = (32, 4, 2880, 2880, "swiglu_oai", True)
MIXTRAL_SMALL = (8, 2, 1024, 3584, "silu", False)
BATCHES = (1, 2, 3, 5, 8, 16, 31, 64, 100, 128, 255, 256, 512)


def _case(tokens, shape, gen, skew=False):
    experts, top_k, hidden, inter, activation, bias = shape
    x, w1, w2, b1, b2, logits = moe_case(tokens, experts, top_k, hidden, inter, bias=bias,
                                         skew=skew, gen=gen, dtype=torch.bfloat16,
                                         device=torch.device("cuda"))
    return x, w1, w2, b1, b2, logits, top_k, activation


@pytest.mark.parametrize("tokens", BATCHES)
@pytest.mark.parametrize("shape", [QWEN3_30B, GPT_OSS_20B], ids=["qwen3-30b-a3b", "gpt-oss-20b"])
def test_decode_batches_match_reference(tokens, shape, gen) -> None:
    from services.engine.kernels import fused_experts

    x, w1, w2, b1, b2, logits, top_k, activation = _case(tokens, shape, gen)
    weights, ids = moe.softmax_topk(logits, top_k, renormalize=True)
    got = fused_experts(x, w1, w2, weights, ids, gate_up_bias=b1, down_bias=b2,
                        activation=activation)
    assert_close(got, reference(x, w1, w2, weights, ids, b1, b2, activation))


@pytest.mark.parametrize("tokens", (1, 4, 64, 256, 2048))
def test_mxfp4_experts_at_the_gpt_oss_shape(tokens, gen) -> None:
    """Kept MXFP4 experts (mxfp4_experts: keep) against the reference and against the bf16
    kernels on the same weights dequantized, routing fused in."""
    from services.engine.kernels import fused_experts, fused_moe_routed
    from tests.kernels.test_fused_moe import mxfp4_experts

    x, w1, w2, b1, b2, logits, top_k, activation = _case(tokens, GPT_OSS_20B, gen)
    packed1, packed2 = mxfp4_experts(w1, w2, torch.bfloat16)
    dense1, dense2 = packed1.dequantize(), packed2.dequantize()
    weights, ids = moe.softmax_topk(logits, top_k, renormalize=True)
    got = fused_experts(x, packed1, packed2, weights, ids, gate_up_bias=b1, down_bias=b2,
                        activation=activation)
    assert_close(got, reference(x, dense1, dense2, weights, ids, b1, b2, activation))
    assert_close(got, fused_experts(x, dense1, dense2, weights, ids, gate_up_bias=b1,
                                    down_bias=b2, activation=activation))
    routed, _, _ = fused_moe_routed(x, logits, packed1, packed2, top_k, True, gate_up_bias=b1,
                                    down_bias=b2, activation=activation)
    assert_close(routed, got)


@pytest.mark.parametrize("tokens", (600, 2048, 8192))
@pytest.mark.parametrize("shape", [QWEN3_30B, MIXTRAL_SMALL], ids=["qwen3-30b-a3b", "mixtral"])
def test_prefill_sizes_with_ragged_loads(tokens, shape, gen) -> None:
    from services.engine.kernels import fused_moe_routed

    x, w1, w2, b1, b2, logits, top_k, activation = _case(tokens, shape, gen, skew=True)
    load = torch.zeros(shape[0], dtype=torch.int64, device="cuda")
    real = torch.tensor([tokens - 7], dtype=torch.int32, device="cuda")
    out, weights, ids = fused_moe_routed(x, logits, w1, w2, top_k, True, expert_tokens=load,
                                         num_real_tokens=real)
    want_w, want_ids = moe.softmax_topk(logits, top_k, True)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(weights, want_w)
    counts = torch.bincount(want_ids[:tokens - 7].flatten().long(), minlength=shape[0])
    assert load.tolist() == counts.tolist() and counts[-2:].sum() == 0   # two unused experts
    assert_close(out, reference(x, w1, w2, want_w, want_ids, b1, b2, activation))


def test_float32_is_exact_enough_for_cpu_parity(gen) -> None:
    from services.engine.kernels import fused_experts

    x, w1, w2, b1, b2, logits = moe_case(37, 8, 2, 64, 96, bias=True, skew=True, gen=gen,
                                         dtype=torch.float32, device=torch.device("cuda"))
    weights, ids = moe.softmax_topk(logits, 2, True)
    got = fused_experts(x, w1, w2, weights, ids, gate_up_bias=b1, down_bias=b2,
                        activation="swiglu_oai")
    want = moe.reference_fused_experts(x, w1, w2, weights, ids, gate_up_bias=b1,
                                       down_bias=b2, activation="swiglu_oai")
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("capacity", (1, 8, 64, 256, 512))
def test_graph_capture_and_replay(capacity, gen) -> None:
    """Captured once per decode capacity, replayed with other activations and routings (one
    with every token on one expert): each replay equals an eager call; the load counter
    accumulates inside the graph."""
    from services.engine.kernels import fused_moe_routed

    x, w1, w2, _, _, logits, top_k, activation = _case(capacity, QWEN3_30B, gen)
    load = torch.zeros(128, dtype=torch.int64, device="cuda")
    real = torch.tensor([capacity], dtype=torch.int32, device="cuda")
    static_x, static_logits = x.clone(), logits.clone()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):   # warm up (compiles the counting variant) outside the
        fused_moe_routed(static_x, static_logits, w1, w2, top_k, True,   # capture
                         expert_tokens=torch.zeros_like(load), num_real_tokens=real)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, _, _ = fused_moe_routed(static_x, static_logits, w1, w2, top_k, True,
                                     expert_tokens=load, num_real_tokens=real)
    total = torch.zeros_like(load)
    for trial in range(3):
        new_x, _, _, _, _, new_logits, _, _ = _case(capacity, QWEN3_30B, gen)
        if trial == 2:
            new_logits[:, 5] += 30.0   # every token routes to expert 5 first (at +100 the
            # others' probabilities are float32 subnormals, and their ties order either way)
        static_x.copy_(new_x)
        static_logits.copy_(new_logits)
        out.fill_(float("nan"))
        graph.replay()
        want, _, ids = fused_moe_routed(new_x, new_logits, w1, w2, top_k, True)
        torch.testing.assert_close(out, want, atol=0, rtol=0)   # the same kernels, bitwise
        weights = _assert_top_k(ids, new_logits, top_k)
        assert_close(out, reference(new_x, w1, w2, weights, ids, None, None, activation))
        total += torch.bincount(ids.flatten().long(), minlength=128)
        torch.cuda.synchronize()
        assert load.tolist() == total.tolist()


def _assert_top_k(ids: torch.Tensor, logits: torch.Tensor, top_k: int) -> torch.Tensor:
    """`ids` (int32 [T, k]) are a top k of softmax(logits): k distinct experts a row whose
    probabilities are the k largest, up to float32 rounding. With one logit 30 above the
    rest, `logits - max` keeps ~2e-6 of absolute precision, so two experts closer than that
    compare either way in the kernel and in torch. Returns their renormalized weights."""
    probs = torch.softmax(logits.float(), dim=-1)
    chosen = probs.gather(1, ids.long())
    assert (ids.sort(dim=-1).values.diff(dim=-1) != 0).all()
    best = torch.topk(probs, top_k, dim=-1).values
    torch.testing.assert_close(chosen.sort(dim=-1, descending=True).values, best,
                               rtol=1e-4, atol=0)
    return chosen / chosen.sum(dim=-1, keepdim=True)


def test_model_dispatches_to_the_kernel() -> None:
    from services.engine.kernels import fused_experts, fused_moe_routed

    moe._kernel.cache_clear()
    assert moe._kernel("fused_experts") is fused_experts
    assert moe._kernel("fused_moe_routed") is fused_moe_routed
