"""The elementwise kernels captured together in one CUDA graph (no host sync, no allocation
beyond the preallocated outputs) and replayed on new inputs copied in place."""

from __future__ import annotations

import pytest
import torch

from services.engine.kernels.activation import gelu_tanh_and_mul, silu_and_mul
from services.engine.kernels.kv_write import write_kv
from services.engine.kernels.norm import fused_add_rms_norm, rms_norm
from services.engine.kernels.rotary import apply_rotary
from tests.kernels import reference
from tests.kernels.conftest import HAS_CUDA
from tests.kernels.test_rotary import cos_sin_cache


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_ops_replay_in_a_graph(device, gen) -> None:
    tokens, hidden, hq, hk, d, inter, pages, page = 48, 1024, 16, 4, 128, 2048, 64, 16
    bf16 = torch.bfloat16

    def draw(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(bf16).to(device)

    x, res, w = draw(tokens, hidden), draw(tokens, hidden), draw(hidden)
    q, k, v = draw(tokens, hq, d), draw(tokens, hk, d), draw(tokens, hk, d)
    gate_up = draw(tokens, 2 * inter)
    positions = torch.zeros(tokens, dtype=torch.int64, device=device)
    slots = torch.zeros(tokens, dtype=torch.int64, device=device)
    cache = cos_sin_cache(8192, d).to(device)
    k_cache = torch.zeros(pages, page, hk, d, dtype=bf16, device=device)
    v_cache = torch.zeros_like(k_cache)
    outs = {
        "norm": torch.empty_like(x), "fused": torch.empty_like(x), "sum": torch.empty_like(x),
        "q": torch.empty_like(q), "k": torch.empty_like(k), "act": torch.empty(tokens, inter, dtype=bf16, device=device),
        "gelu": torch.empty(tokens, inter, dtype=bf16, device=device),
    }

    def step() -> None:
        rms_norm(x, w, 1e-6, out=outs["norm"])
        fused_add_rms_norm(x, res, w, 1e-6, out=outs["fused"], residual_out=outs["sum"])
        apply_rotary(q, k, positions, cache, out_q=outs["q"], out_k=outs["k"])
        write_kv(outs["k"], v, k_cache, v_cache, slots)
        silu_and_mul(gate_up, out=outs["act"])
        gelu_tanh_and_mul(gate_up, out=outs["gelu"])

    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for _ in range(2):
        for t in (x, res, q, k, v, gate_up):
            t.copy_(torch.randn(t.shape, generator=gen).to(bf16))
        positions.copy_(torch.randint(0, 8192, (tokens,), generator=gen))
        chosen = torch.randperm(pages * page, generator=gen)[:tokens]
        chosen[-3:] = -1  # padding rows
        slots.copy_(chosen)
        for o in outs.values():
            o.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert reference.rel_error(outs["norm"], reference.rms_norm(x, w, 1e-6)) < 1e-2
        assert torch.equal(outs["sum"], x + res)
        assert reference.rel_error(outs["fused"], reference.rms_norm(x + res, w, 1e-6)) < 1e-2
        assert reference.rel_error(outs["q"], reference.rotary(q, positions, cache, True)) < 1e-2
        assert reference.rel_error(outs["k"], reference.rotary(k, positions, cache, True)) < 1e-2
        assert reference.rel_error(outs["act"], reference.silu_and_mul(gate_up)) < 1e-2
        assert reference.rel_error(outs["gelu"], reference.gelu_tanh_and_mul(gate_up)) < 1e-2
        real = slots >= 0
        assert torch.equal(k_cache.view(-1, hk, d)[slots[real]], outs["k"][real])
        assert torch.equal(v_cache.view(-1, hk, d)[slots[real]], v[real])
