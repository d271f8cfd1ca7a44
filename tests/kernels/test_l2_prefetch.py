"""The L2 weight prefetch (kernels/l2_prefetch.py, HELIOS_L2_PREFETCH): when it is on, what
each hook prefetches, and what the H200 compiler makes of it (tests/kernels/sm90_compile.py).
A prefetch is a hint, so the outputs cannot show it; a GPU benchmark times it
(benchmarks/gpu/pending_benches.txt `l2_prefetch_b1`)."""

from __future__ import annotations

import pytest
import torch

from services.common.errors import ValidationError
from services.engine.kernels import l2_prefetch, pdl
from tests.kernels.conftest import HAS_CUDA
from tests.support.switches import env_switch


@pytest.fixture
def switch(monkeypatch):
    """set(value) sets HELIOS_L2_PREFETCH and re-reads it; the device counts as PDL-capable."""
    monkeypatch.setattr(pdl, "pdl_enabled", lambda device: True)
    with env_switch(monkeypatch, "HELIOS_L2_PREFETCH", l2_prefetch.switched_on) as set_switch:
        yield set_switch


def test_on_only_when_switched_on_inside_graph_launches_of_few_rows(switch) -> None:
    device = torch.device("cpu")
    dummy = torch.zeros(4)
    weight = torch.zeros(1024, 2048, dtype=torch.bfloat16)
    switch("0")
    with pdl.graph_launches():
        assert l2_prefetch.prefetch_args(weight, device, 1, dummy) == (dummy, 0, False)
    switch("1")
    assert l2_prefetch.prefetch_args(weight, device, 1, dummy)[2] is False    # eager step
    with pdl.graph_launches():
        ptr, nbytes, on = l2_prefetch.prefetch_args(weight, device, 1, dummy)
        assert (ptr is weight, nbytes, on) == (True, 1024 * 2048 * 2, True)
        assert l2_prefetch.prefetch_args(weight, device, 64, dummy)[2] is False   # cuBLAS rows
        assert l2_prefetch.prefetch_args(None, device, 1, dummy) == (dummy, 0, False)
        big = torch.zeros(8192, 4096, dtype=torch.bfloat16)                      # 64 MiB
        assert l2_prefetch.prefetch_args(big, device, 1, dummy)[1] == l2_prefetch.MAX_BYTES
        # a target the instruction cannot take is skipped, not an error (a hint)
        assert l2_prefetch.prefetch_args(weight.t(), device, 1, dummy) == (dummy, 0, False)
        unaligned = weight.view(-1)[1:1025]
        assert l2_prefetch.prefetch_args(unaligned, device, 1, dummy) == (dummy, 0, False)


def test_a_bad_switch_value_is_refused_by_name(switch) -> None:
    switch("yes")
    with pytest.raises(ValidationError, match="HELIOS_L2_PREFETCH='yes'"):
        l2_prefetch.switched_on()


def test_the_attention_layer_hands_its_o_proj_weight_to_the_kernel(monkeypatch) -> None:
    """ops.paged_attention passes the layer's o_proj weight (an FP8 layer's codes) as the
    kernel's `prefetch`; the reference path ignores it."""
    from services.engine.model import ops
    from services.engine.model.fp8 import Fp8Weight

    seen: list[object] = []

    def fake_kernel(q, k_cache, v_cache, meta, scale, sliding_window, **kwargs):
        seen.append(kwargs.get("prefetch"))
        return torch.zeros_like(q)

    monkeypatch.setattr(ops, "_kernel", lambda name, t: fake_kernel if name == "paged_attention" else None)
    q = torch.zeros(1, 4, 8)
    weight = torch.zeros(16, 32)
    ops.paged_attention(q, q, q, None, 1.0, prefetch=weight)
    codes = torch.zeros(16, 32, dtype=torch.float8_e4m3fn)
    ops.paged_attention(q, q, q, None, 1.0, prefetch=Fp8Weight(codes, torch.ones(16), None))
    ops.paged_attention(q, q, q, None, 1.0)
    assert seen[0] is weight and seen[1] is codes and seen[2] is None


def test_fp8_projections_pass_the_hint_as_weight_bytes(monkeypatch) -> None:
    """ops.norm_linear with an FP8 gate/up hands the FP8 kernel the next weight's e4m3
    codes; without a hint the kernel is called as before (no `prefetch` keyword)."""
    from services.common.quantization import Fp8Scheme
    from services.engine.model import fp8, ops
    from services.engine.model.fp8 import Fp8Weight

    calls: list[dict[str, object]] = []

    def fake_kernel(x, residual, norm_weight, eps, weight, bias, activation, **kwargs):
        calls.append(kwargs)
        return torch.zeros(x.shape[0], weight.shape[0] // 2), x

    monkeypatch.setattr(fp8, "_kernel", lambda name, x: fake_kernel if name == "fp8_norm_linear" else None)
    scheme = Fp8Scheme("online", "channel", "token")
    gate_up = Fp8Weight(torch.zeros(16, 8, dtype=torch.float8_e4m3fn), torch.ones(16), scheme)
    down = Fp8Weight(torch.zeros(8, 8, dtype=torch.float8_e4m3fn), torch.ones(8), scheme)
    x = torch.zeros(1, 8)
    ops.norm_linear(x, None, torch.ones(8), 1e-6, gate_up, None, "silu", prefetch=down)
    ops.norm_linear(x, None, torch.ones(8), 1e-6, gate_up, None, "silu")
    assert calls[0]["prefetch"] is down.qweight and calls[1] == {}


SM90_CODE = """
import dataclasses, json, torch
from services.engine.kernels.skinny_linear import norm_linear
from tests.kernels.sm90_compile import (capture_launches, compile_launch, qwen3_8b_decode_attention,
                                        qwen3_30b_a3b_decode_experts, report, sass)
calls = [qwen3_8b_decode_attention(1, 384, max_seq_len=1024), *qwen3_30b_a3b_decode_experts()]
with capture_launches() as more:
    h = torch.zeros(1, 1024, dtype=torch.bfloat16)                   # Qwen3-0.6B gate/up
    norm_linear(h, h, torch.ones(1024, dtype=torch.bfloat16), 1e-6,
                torch.zeros(6144, 1024, dtype=torch.bfloat16), None, "silu")
calls += more
by_name = {launch.fn.fn.__name__: launch for launch in calls}
rows = []
for name, launch in (("attention", by_name["_paged_attention"]),
                     ("moe gate/up", by_name["_decode_gate_up_kernel"]),
                     ("skinny gate/up", by_name["_skinny_linear_kernel"])):
    for on in (False, True):
        extra = {"PREFETCH_L2": on}
        if "PDL" in launch.fn.arg_names:
            extra["PDL"] = True
        compiled = compile_launch(dataclasses.replace(launch, kwargs={**launch.kwargs, **extra}))
        code = [line for line in sass(compiled).splitlines() if "/*" in line]
        prefetch = [i for i, line in enumerate(code) if "UBLKPF.L2" in line]
        wait = [i for i, line in enumerate(code) if "ACQBULK" in line]
        rows.append([name, on, report(name, compiled).local_loads, len(prefetch),
                     bool(prefetch and wait and prefetch[0] < wait[0]),
                     "cp.async.bulk.prefetch.L2" in compiled.asm["ptx"],
                     "L2::evict_first" in compiled.asm["ptx"]])
print(json.dumps(rows))
"""


def test_the_hooks_compile_for_sm90():
    """Compiled for the H200: off, no prefetch instruction; on, the attention and one-row
    skinny kernels issue their bulk L2 prefetches before their wait for the previous kernel
    (griddepcontrol.wait is ACQBULK in the SASS), the MoE gate/up kernel after its routing;
    the skinny and MoE kernels stream their own weights with L2's evict-first policy then
    (Triton drops the hint on the attention kernel's async copies); no spills."""
    from tests.kernels.test_package import compiled_json

    rows = compiled_json(SM90_CODE)
    assert len(rows) == 6
    for name, on, spills, prefetches, before_wait, in_ptx, evict_first in rows:
        assert spills == 0, name
        assert (prefetches > 0, in_ptx) == (on, on), (name, on, prefetches)
        assert evict_first == (on and name != "attention"), (name, on)
        if name != "moe gate/up" and on:
            assert before_wait, f"{name}: the prefetch must come before the wait"


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")
def test_prefetching_kernels_run_and_change_nothing_on_the_gpu(gen, monkeypatch) -> None:
    """On a Hopper GPU, inside graph launches: the three hooks with HELIOS_L2_PREFETCH=1 compile
    their prefetching variants (a new variant of each kernel), run without a fault, and give
    the outputs of the run with it off, bit for bit (attention at Qwen3-8B's decode shape, the
    0.6B gate/up prefetching down, Qwen3-30B-A3B's decode experts)."""
    from services.engine.kernels.attention import paged_attention
    from services.engine.kernels.fused_moe_decode import run_decode
    from services.engine.kernels.skinny_linear import norm_linear
    from services.engine.kernels.variants import compiled_variants
    from tests.kernels.batch import make_batch

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the bulk L2 prefetch needs sm_90")
    cuda, bf16 = torch.device("cuda"), torch.bfloat16

    def randn(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * 0.05).to(cuda, bf16)

    batch = make_batch([384], [1], num_q_heads=32, num_kv_heads=8, head_dim=128, page_size=16,
                       device=cuda, generator=gen, poison_unused=False)
    o_proj = randn(4096, 4096)
    h, residual, gain = randn(1, 1024), randn(1, 1024), randn(1024) + 1
    gate_up, down = randn(6144, 1024), randn(1024, 3072)
    experts, top_k, hidden, inter = 128, 8, 2048, 768
    x, w13 = randn(1, hidden), randn(experts, 2 * inter, hidden)
    w2, logits = randn(experts, hidden, inter), randn(1, experts).float()

    def run() -> list[torch.Tensor]:
        with pdl.graph_launches():
            out = [paged_attention(batch.q, batch.k_cache, batch.v_cache, batch.meta, 0.088,
                                   prefetch=o_proj)]
            out += norm_linear(h, residual, gain, 1e-6, gate_up, None, "silu", prefetch=down)
            weights = torch.empty(1, top_k, device=cuda)
            ids = torch.empty(1, top_k, dtype=torch.int32, device=cuda)
            out += [run_decode(x, w13, w2, logits, weights, ids, top_k, True, None, None,
                               "silu", 0.0, 0.0, None, None), weights, ids]
        torch.cuda.synchronize()
        return out

    results, variants = {}, {}
    with env_switch(monkeypatch, "HELIOS_L2_PREFETCH", l2_prefetch.switched_on) as set_switch:
        for value in ("0", "1"):
            set_switch(value)
            before = compiled_variants()
            results[value] = run()
            variants[value] = {name: count - before.get(name, 0)
                               for name, count in compiled_variants().items()}
    for name in ("attention_kernel._paged_attention_kernel",
                 "skinny_linear._skinny_linear_kernel",
                 "fused_moe_decode._decode_gate_up_kernel"):
        assert variants["1"].get(name) == 1, (name, variants["1"])
    for off, on in zip(results["0"], results["1"], strict=True):
        assert torch.equal(off, on)
