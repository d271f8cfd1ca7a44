"""The MoE architectures on the GPU through the GraphRunner (decode graphs at every capacity,
two-frame overlap; the fused-MoE kernel in every MLP): float32 gives the CPU path's tokens,
bf16 stays within test_gpu_runner.py's bounds of a float32 reference."""

from __future__ import annotations

import gc

import pytest

from tests.engine.gpu.test_gpu_runner import (
    _check_bf16_against_float32,
    _check_float32_matches_the_cpu,
)
from tests.engine.model.checkpoints import SPECS, build_checkpoint

pytestmark = pytest.mark.gpu

MOE_ARCHITECTURES = ("qwen3-moe", "qwen3-moe-step2", "mixtral")


@pytest.fixture(scope="module", params=MOE_ARCHITECTURES)
def moe_checkpoint(request, tmp_path_factory):
    return build_checkpoint(SPECS[request.param], tmp_path_factory.mktemp(request.param))


def test_moe_in_float32_matches_the_cpu_path(moe_checkpoint):
    _check_float32_matches_the_cpu(moe_checkpoint)


def test_moe_in_bf16_against_a_float32_reference(moe_checkpoint):
    _check_bf16_against_float32(moe_checkpoint)


def test_kv_pool_gets_what_the_expert_weights_leave(tmp_path, monkeypatch):
    """The pool is sized from the device memory free after the load: ~2.4 GB of experts
    (dummy bf16 weights) are this process's allocations when the free memory is read, and
    the pool is the configured half of what was free then. (Other test workers share the
    GPU, so free memory before and after the build need not differ by the weights alone:
    the check reads what the engine read.)"""
    import json

    import torch

    from services.common.core import open_model
    from services.engine.model.moe import expert_weight_bytes
    from services.engine.runner import memory
    from tests.engine.model.checkpoints import write_tokenizer
    from tests.engine.runner.conftest import make_engine

    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
              "vocab_size": 320, "hidden_size": 1024, "intermediate_size": 2048,
              "moe_intermediate_size": 1024, "num_hidden_layers": 6, "num_attention_heads": 8,
              "num_key_value_heads": 2, "head_dim": 128, "num_experts": 64,
              "num_experts_per_tok": 4, "norm_topk_prob": True, "max_position_embeddings": 512,
              "torch_dtype": "bfloat16", "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(config))
    write_tokenizer(tmp_path)
    gc.collect()            # an earlier test's engine (its graph pool) freed now, not mid-build
    torch.cuda.empty_cache()
    allocated_before = torch.cuda.memory_allocated()
    reads: list[tuple[int, int]] = []        # (free bytes, this process's allocated bytes)
    free_device_memory = memory.free_device_memory

    def recording(device):
        free = free_device_memory(device)
        reads.append((free, torch.cuda.memory_allocated(device)))
        return free

    monkeypatch.setattr(memory, "free_device_memory", recording)
    engine = make_engine(open_model(tmp_path, allow_missing_weights=True), device="cuda",
                         dtype="bfloat16", load_format="dummy", kv_cache_bytes=0,
                         kv_cache_memory_fraction=0.1, cuda_graph_max_batch=-1)
    # (0.1: at 0.5 the pool took 41.8 GB of an H100, and the tests beside it ran out)
    model = engine.runner.model
    experts = expert_weight_bytes(model)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    assert experts == 6 * 64 * 3 * 1024 * 1024 * 2 and experts > 0.9 * weights
    assert len(reads) == 1
    free, allocated = reads[0]
    # read after the load: the weights were this process's memory then (and little else)
    assert weights <= allocated - allocated_before <= weights + (256 << 20)
    assert engine.info.kv_cache_bytes == int(free * 0.1)


def _moe_variants() -> dict[str, int]:
    """Compiled variants of each fused-MoE kernel in this process (kernels/variants.py)."""
    from services.engine.kernels.variants import compiled_variants

    kernels = ("fused_moe._route_align_kernel", "fused_moe._gate_up_kernel",
               "fused_moe._down_kernel", "fused_moe_decode._decode_gate_up_kernel",
               "fused_moe_decode._decode_down_kernel")
    return {name: compiled_variants()[name] for name in kernels}


def test_no_moe_kernel_compiles_while_serving(tmp_path):
    """Start-up runs the expert kernels at one token count of each variant up to the step
    budget (8 experts, top 3: the decode kernels at 1-4 tokens, then the sorted path's tiers
    from 5, 43 and 171 tokens), so serving prefill, mixed and decode steps of every size
    compiles no new variant (a first compile stalled serving for
    seconds on the H200)."""
    from services.common.core import open_model
    from tests.engine.gpu.test_gpu_runner import _prompt
    from tests.engine.runner.conftest import greedy_request, make_engine, serve

    checkpoint = build_checkpoint(SPECS["qwen3-moe"], tmp_path)
    engine = make_engine(open_model(checkpoint), device="cuda", dtype="bfloat16", page_size=4,
                         max_num_seqs=8, kv_cache_bytes=32 << 20, prefill_chunk_size=64,
                         max_num_batched_tokens=256)
    after_start = _moe_variants()
    assert all(count >= (1 if "decode" in name else 3)
               for name, count in after_start.items()), after_start
    requests = [greedy_request(f"r{i}", _prompt(n, i), 6)
                for i, n in enumerate((60, 60, 60, 60, 5, 33, 17, 90))]
    tokens, _, _ = serve(engine, requests)
    assert all(len(t) == 6 for t in tokens.values())
    assert _moe_variants() == after_start
